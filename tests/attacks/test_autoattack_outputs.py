"""A rerun never replaces an AutoAttack result it did not produce.

``run_autoattack(out=...)`` and ``sarjax autoattack --out`` used to overwrite ``OUT.json`` /
``OUT.npz`` of a run with other settings silently. Now the report records its settings
(``"fingerprint"`` plus the ``meta`` fields) and a run into existing outputs is refused before any
attack work unless its settings are the same (an identical rerun, a resumed one) or it is told to
``overwrite``. The attack is a stand-in (the outputs are the subject; the real runs:
test_autoattack_runner.py, test_autoattack_resume.py) except where the attack's own validation is
the subject (a refused setting must leave no checkpoint fingerprint behind).
"""

import json
import warnings

import numpy as np
import pytest
from _aa_kw import run as run_autoattack
from _aa_tiny import BUDGET, EPS, SHAPE, images, linear, make_pool

import sarjax.attacks.autoattack as aa
import sarjax.experiments.autoattack as runner
from sarjax.attacks.autoattack_checks import AutoAttackWarning
from sarjax.cli import main
from sarjax.experiments.autoattack import load_autoattack
from sarjax.models import Pool

KW = dict(norm="linf", eps=EPS, batch_size=8, attacks=["apgd-ce"], checks=False, log=False, **BUDGET)


@pytest.fixture
def calls(monkeypatch):
    """autoattack_pool replaced: every pair robust; counts its calls (the attack work)."""
    seen = []

    def stand_in(pool, x, y, *, attack, **kw):
        seen.append(kw)
        b, m = len(x), pool.num_members
        z = np.ones((b, m), bool)
        log = (aa.StageLog("apgd-ce", z.mean(0), 0.1, 0, int(z.sum()), 0),)
        return aa.AutoAttackResult(
            np.repeat(np.asarray(x)[:, None], m, axis=1), z, z, np.full((b, m), len(seen), np.int64),
            np.ones((1, b, m), np.int64), z[None], log, attack.version, attack.norm, attack.eps, tuple(pool.names), (),
        )  # fmt: skip

    monkeypatch.setattr(aa, "autoattack_pool", stand_in)
    return seen


def _files(out):
    return {p: p.read_bytes() for p in (out, out.with_suffix(".npz")) if p.exists()}


def test_other_settings_are_refused_before_any_attack_and_overwrite_replaces(calls, tmp_path):
    pool, (x, y) = make_pool(stacks=1), images(6)
    out = tmp_path / "a.json"
    run_autoattack(pool, x, y, out=out, meta={"data": "tiny", "pool": "/pools/P"}, **KW)
    assert len(calls) == 1
    before = _files(out)
    report = json.loads(out.read_text())
    assert report["fingerprint"]["eps"] == EPS and report["fingerprint"]["images"]  # the settings are recorded
    assert set(report["fingerprint"]) == runner._FINGERPRINT_FIELDS  # the names the report fields must not take
    with pytest.raises(ValueError) as e:
        run_autoattack(
            pool, x, y, out=out, meta={"data": "tiny", "pool": "/pools/P"}, **{**KW, "eps": 0.2, "n_iter": 5}
        )
    msg = str(e.value)
    assert f"{out} was written with eps={EPS}, n_iter=4, this run has eps=0.2, n_iter=5" in msg
    assert "refusing to replace a.json and a.npz" in msg and "--overwrite" in msg and "another --out" in msg
    assert "\n" not in msg
    assert len(calls) == 1 and _files(out) == before  # no attack work, nothing written
    # other images, other meta: refused too, naming them
    with pytest.raises(ValueError, match=r"written with images=[0-9a-f]{12}, .*this run has images="):
        run_autoattack(pool, x[:5], y[:5], out=out, meta={"data": "tiny", "pool": "/pools/P"}, **KW)
    with pytest.raises(ValueError, match="written with data=tiny, this run has data=other"):
        run_autoattack(pool, x, y, out=out, meta={"data": "other", "pool": "/pools/P"}, **KW)
    # a retrained pool at the same path (meta "pool": the path; the fingerprint's "pool": its content)
    retrained = Pool.from_functions(
        [(linear, {k: 2 * v[j] for k, v in pool.stacks[0].params.items()}) for j in range(2)],
        ["lin0", "lin1"],
        input_shape=SHAPE,
    )
    with pytest.raises(ValueError, match=r"written with pool=[0-9a-f]{12}, this run has pool=[0-9a-f]{12}:"):
        run_autoattack(retrained, x, y, out=out, meta={"data": "tiny", "pool": "/pools/P"}, **KW)
    assert len(calls) == 1 and _files(out) == before
    # the same settings write the same result: an identical rerun (or a resumed one) may write
    run_autoattack(pool, x, y, out=out, meta={"data": "tiny", "pool": "/pools/P"}, **KW)
    assert len(calls) == 2 and load_autoattack(out).queries.max() == 2
    # overwrite: the new settings replace the old outputs
    run_autoattack(pool, x, y, out=out, meta={"data": "tiny", "pool": "/pools/P"}, overwrite=True, **{**KW, "eps": 0.2})
    assert json.loads(out.read_text())["eps"] == 0.2 and load_autoattack(out).queries.max() == 3
    assert not list(tmp_path.glob("*.tmp"))


def test_outputs_that_cannot_be_checked_are_refused(calls, tmp_path):
    pool, (x, y) = make_pool(stacks=1), images(6)
    out = tmp_path / "a.json"
    run_autoattack(pool, x, y, out=out, **KW)
    report = json.loads(out.read_text())
    del report["fingerprint"]  # a report of an older sarjax
    out.write_text(json.dumps(report))
    with pytest.raises(ValueError, match=rf"written with eps={EPS}, this run has eps=0.2 \(its other settings"):
        run_autoattack(pool, x, y, out=out, **{**KW, "eps": 0.2})
    with pytest.raises(ValueError, match="holds a report without recorded settings"):
        run_autoattack(pool, x, y, out=out, **KW)
    out.write_text("not json")
    with pytest.raises(ValueError, match="is not an AutoAttack report"):
        run_autoattack(pool, x, y, out=out, **KW)
    out.unlink()  # the arrays alone
    with pytest.raises(ValueError, match="a.npz holds another run's arrays without their report a.json"):
        run_autoattack(pool, x, y, out=out, **KW)
    assert len(calls) == 1
    run_autoattack(pool, x, y, out=out, overwrite=True, **KW)
    assert len(calls) == 2 and "fingerprint" in json.loads(out.read_text())


def test_every_process_agrees_on_the_refusal(calls, tmp_path, monkeypatch):
    """Distributed: process 0 checks, every process learns its answer through one all_ok (so none
    waits in a collective the others skipped); stand-ins play the processes."""
    from sarjax.experiments.autoattack import check_outputs

    pool, (x, y) = make_pool(stacks=1), images(6)
    out = tmp_path / "a.json"
    run_autoattack(pool, x, y, out=out, **KW)
    votes = []
    monkeypatch.setattr(runner, "process_count", lambda: 2)
    # process 0: it refuses and says so to the others
    monkeypatch.setattr(runner, "all_ok", lambda ok: votes.append(ok) or False)
    with pytest.raises(ValueError, match="this run has eps=0.2"):
        check_outputs(out, {"eps": 0.2}, distribute=True, partial=True)
    # process 1 (its own file system may hold another file, or none): told by process 0's vote; its
    # own copy would pass the check
    monkeypatch.setattr(runner, "is_main", lambda: False)
    with pytest.raises(ValueError, match=r"process 0 refused to replace .*a\.json \(see its log\); pass --overwrite"):
        check_outputs(out, {"eps": EPS}, distribute=True, partial=True)
    # every process agrees to write: each votes once and goes on
    monkeypatch.setattr(runner, "all_ok", lambda ok: votes.append(ok) or True)
    check_outputs(out, {"eps": 0.2}, distribute=True, overwrite=True)
    assert votes == [False, True, True]


def test_a_run_refused_for_a_bad_setting_leaves_no_fingerprint(tmp_path):
    """fab_iter=2 with FAB is refused when the attack is built (before any folder is touched);
    a setting the pool refuses (version="rand" on a deterministic Pool without wrap=) is refused
    inside autoattack_pool, after the fingerprint was written: the folder must not keep it, or the
    corrected run would be refused as a rerun with other settings."""
    pool, (x, y) = make_pool(stacks=1), images(6)
    ck = tmp_path / "ck"
    with pytest.raises(ValueError, match="fab_iter must be >= 3 when FAB runs"):
        run_autoattack(pool, x, y, checkpoint_dir=ck, **{**KW, "attacks": ["apgd-ce", "fab"], "fab_iter": 2})
    assert not ck.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        with pytest.raises(ValueError, match="a Pool is deterministic"):
            run_autoattack(pool, x, y, checkpoint_dir=ck, **{**KW, "version": "rand"})
        assert not (ck / "fingerprint.json").exists()
        res = run_autoattack(pool, x, y, checkpoint_dir=ck, **KW)  # corrected
    assert res.robust.shape == (6, 2)
    assert json.loads((ck / "fingerprint.json").read_text())["stages"] == ["apgd-ce"]
    assert (ck / "call_0.npz").is_file()


def _cli(*argv):
    return main(["autoattack", "--model", "_aa_tiny:make_linear_pool", "--norm", "linf", *map(str, argv)])


def test_cli_refuses_before_loading_the_data_and_the_pool_and_overwrites_on_request(
    calls, tmp_path, monkeypatch, capsys
):
    import sarjax.data.images as images_mod
    import sarjax.models.builders as builders

    monkeypatch.chdir(tmp_path)
    x, y = images(6)
    np.savez(tmp_path / "mine.npz", x=x, y=y)
    argv = ["--images", "mine.npz", "--no-progress", "--out", "a.json"]
    assert _cli(*argv, "--eps", EPS) == 0
    before = _files(tmp_path / "a.json")
    capsys.readouterr()

    def no(*a, **k):
        raise AssertionError("loaded before the outputs were checked")

    with monkeypatch.context() as m:
        m.setattr(images_mod, "load_images", no)
        m.setattr(builders, "load_model", no)
        assert _cli(*argv, "--eps", 0.2) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"sarjax autoattack: error: a.json was written with eps={EPS}, this run has eps=0.2: refusing to "
            "replace a.json and a.npz; pass --overwrite (overwrite=True) to replace them, or choose another --out"
        )
        assert _cli(*argv, "--eps", EPS, "--seed", 1, "--model", "x:y") == 2  # two --model: refused first
        capsys.readouterr()
        assert _cli(*argv, "--eps", EPS, "--seed", 1) == 2
        assert "written with seed=0, this run has seed=1" in capsys.readouterr().err
    assert len(calls) == 1 and _files(tmp_path / "a.json") == before
    # other images behind the same options: refused by the full check, before the attack
    np.savez(tmp_path / "mine.npz", x=x[::-1], y=y[::-1])
    assert _cli(*argv, "--eps", EPS) == 2
    assert "this run has images=" in capsys.readouterr().err and len(calls) == 1
    # --overwrite (no --checkpoint needed): replaced
    assert _cli(*argv, "--eps", 0.2, "--overwrite") == 0
    assert json.loads((tmp_path / "a.json").read_text())["eps"] == 0.2 and len(calls) == 2
    # the same command again: the same settings, it may write
    assert _cli(*argv, "--eps", 0.2) == 0 and len(calls) == 3


def test_cli_bad_setting_then_corrected_run_with_the_same_checkpoint(calls, tmp_path, monkeypatch, capsys):
    """``--fab-iter 2 --checkpoint CK`` is refused by the attack's own validation (the real
    autoattack_pool); the corrected command with the same CK then runs (a stand-in)."""
    monkeypatch.chdir(tmp_path)
    x, y = images(6)
    np.savez(tmp_path / "mine.npz", x=x, y=y)
    argv = ["--images", "mine.npz", "--no-progress", "--eps", EPS, "--checkpoint", "ck", "--n-iter", 2]
    argv += ["--square-queries", 4]
    stand_in = aa.autoattack_pool
    monkeypatch.undo()  # the real attack for the refused run
    monkeypatch.chdir(tmp_path)
    assert _cli(*argv, "--fab-iter", 2) == 2
    assert "fab_iter must be >= 3 when FAB runs" in capsys.readouterr().err
    assert not (tmp_path / "ck" / "fingerprint.json").exists() and not (tmp_path / "a.json").exists()
    monkeypatch.setattr(aa, "autoattack_pool", stand_in)
    assert _cli(*argv, "--fab-iter", 3, "--out", "a.json") == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "ck" / "fingerprint.json").read_text())["fab_iter"] == 3
    assert len(calls) == 1


def test_checkpoint_refuses_another_noise_sigma(calls, tmp_path):
    """The randomized model's description (``meta``'s ``noise_sigma``) is part of the checkpoint's
    fingerprint: a rand run resumed with another sigma was read off the first sigma's states."""
    pool, (x, y) = make_pool(stacks=1), images(6)
    ck = tmp_path / "ck"
    kw = dict(KW, version="rand", wrap=lambda a: a, checkpoint_dir=ck)
    run_autoattack(pool, x, y, out=tmp_path / "a.json", meta={"noise_sigma": 0.1}, **kw)
    assert json.loads((ck / "fingerprint.json").read_text())["randomized"] == {"noise_sigma": 0.1}
    with pytest.raises(ValueError, match=r"randomized"):
        run_autoattack(pool, x, y, out=tmp_path / "b.json", meta={"noise_sigma": 0.2}, **kw)
    run_autoattack(pool, x, y, out=tmp_path / "c.json", meta={"noise_sigma": 0.1}, **kw)  # same sigma: resumes
    assert len(calls) == 2
