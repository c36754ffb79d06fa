"""``run_frontier`` takes attack entries plus one settings dataclass (issue 42 item 3).

Known answers: ``fixtures/frontier_default_entries.npz`` holds the cache a run of the old
``run_frontier(pools, x, y, "l2", attacks=["fmn"], cap=50, tiers=(50, 100), heldout=0.34,
batch=4, progress=False, keep_points=False)`` wrote (sarjax a56fbec, before the settings; every
other knob at its default: 5 restarts, 9 targeted runs, the norm's init_eps, seed 0) on the pool
and images below: its fingerprint and every entry's arrays. ``frontier_attacks("l2", ...)`` with
the same settings resumes that cache (the same fingerprint and entry specs) and, run afresh,
gives its arrays bit for bit; ``sarjax frontier`` with the same options gives the same cache.
"""

import dataclasses
import inspect
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from sarjax.cli import main
from sarjax.experiments import frontier as fr
from sarjax.experiments import frontier_config as fc
from sarjax.experiments import frontier_io as fio
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.runtime import fingerprint as fingerprints

FIXTURE = Path(__file__).parent / "fixtures" / "frontier_default_entries.npz"
SET = fc.FrontierSettings(tiers=(50, 100), heldout=0.34, batch=4, progress=False, keep_points=False)
ATT = fc.frontier_attacks("l2", attacks=["fmn"], cap=50)  # default restarts, targeted, init_eps


@pytest.fixture(scope="module")
def data():
    arch = mlp((8,), input_shape=(6, 6, 1), num_classes=10)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 3))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / 3).astype(np.float32), shapes)
    pool = Pool([Stack(arch, params, ("a", "b", "c"))])
    x = np.random.default_rng(1).uniform(size=(8, 6, 6, 1)).astype(np.float32)
    y = np.asarray(pool.logits(x))[0].argmax(-1).astype(np.int32)
    y[5] = (y[5] + 1) % 10  # one sample misclassified by member a
    return pool, x, y


def _stored():
    z = dict(np.load(FIXTURE))
    fp = json.loads(str(z.pop("fingerprint")))
    entries: dict[str, dict] = {}
    for k, v in z.items():
        stem, field = k.split("|")
        entries.setdefault(stem, {})[field] = v
    return fp, entries


def test_parameter_counts():
    for f in (fr.run_frontier, fr.run_entry, fr.run_frontier_on_dirs):
        ps = inspect.signature(f).parameters.values()
        assert len(ps) <= 10, f.__name__
        assert all(p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in ps), f.__name__


def test_settings_are_checked_when_built():
    for kw, err, match in [
        (dict(tiers=()), ValueError, "--tiers"),
        (dict(tiers=(100, 50)), ValueError, "--tiers"),
        (dict(tiers=(0, 50)), ValueError, "--tiers"),
        (dict(tiers=(50.5,)), ValueError, "--tiers"),
        (dict(tiers=50), ValueError, "--tiers"),
        (dict(heldout=1.0), ValueError, "--heldout"),
        (dict(heldout=-0.1), ValueError, "--heldout"),
        (dict(heldout="0.3"), ValueError, "--heldout"),
        (dict(batch=0), ValueError, "--batch"),
        (dict(batch=2.0), ValueError, "--batch"),
        (dict(seed=1.5), ValueError, "seed"),
        (dict(overwrite=1), TypeError, "overwrite"),
        (dict(progress="no"), TypeError, "progress"),
        (dict(chains=None), TypeError, "chains"),
        (dict(keep_points=0), TypeError, "keep_points"),
    ]:
        with pytest.raises(err, match=match):
            fc.FrontierSettings(**kw)
    assert fc.FrontierSettings(tiers=[10, 20]).tiers == (10, 20)  # pyright: ignore[reportArgumentType] # the CLI's list, kept as a tuple
    d = fc.FrontierSettings()  # sarjax frontier's defaults
    assert (d.tiers, d.heldout, d.batch, d.seed) == ((4000, 8000, 12000), 13 / 30, 250, 0)
    assert (d.overwrite, d.progress, d.chains, d.keep_points) == (False, True, False, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.batch = 3  # pyright: ignore[reportAttributeAccessIssue]


def test_attack_entries_are_checked_when_built():
    for kw, err, match in [
        (dict(norm="l3"), ValueError, "norm must be one of"),
        (dict(norm="l0", attacks=["ddn"]), ValueError, "do not support l0"),
        (dict(norm="l2", restarts=-1), ValueError, "restarts and targeted"),
        (dict(norm="l2", cap=25), ValueError, "--cap must be a positive multiple of 10"),
        (dict(norm="l2", cap=0), ValueError, "--cap"),
        (dict(norm="l2", init_eps=0.0), ValueError, "--init-eps"),
        (dict(norm="l2", init_eps=float("inf")), ValueError, "--init-eps"),
    ]:
        with pytest.raises(err, match=match):
            fc.frontier_attacks(**kw)
    e = fc.EntrySpec("ddn", "ddn", "base", 0)
    with pytest.raises(ValueError, match="does not support linf"):
        fc.FrontierAttacks("linf", (e,))
    with pytest.raises(ValueError, match="non-empty tuple"):
        fc.FrontierAttacks("l2", ())
    with pytest.raises(TypeError, match="EntrySpec"):
        fc.FrontierAttacks("l2", ("ddn",))  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="init_eps must be a number"):
        fc.FrontierAttacks("l2", (e,), init_eps="1")  # pyright: ignore[reportArgumentType]
    # the frontier paper's pool (Section 5.1): l2 has 8 attacks, ddn and alma without restarts
    d = fc.frontier_attacks("l2")
    assert len(d.entries) == 6 * 15 + 2 * 10 and (d.cap, d.init_eps, d.targeted) == (1000, fc.INIT_EPS["l2"], 9)
    assert list(d.entries) == fc.attack_pool("l2")
    assert fc.frontier_attacks("l2", targeted=0).targeted == 0
    for kw, match in [
        (dict(n_iter=0), "n_iter"),
        (dict(square_queries=2.5), "square_queries"),
        (dict(eps_ref=0.0), "--eps-ref"),
        (dict(eps_ref=float("nan")), "--eps-ref"),
        (dict(attacks=[""]), "stage names"),
    ]:
        with pytest.raises(ValueError, match=match):
            fc.frontier_autoattack(**kw)
    # the AutoAttack cache's config, as sarjax frontier --autoattack recorded it before
    assert fc.frontier_autoattack().config() == {
        "attacks": None,
        "n_iter": 100,
        "square_queries": 5000,
        "eps_ref": None,
    }
    c = fc.frontier_autoattack(attacks=["apgd-ce"], n_iter=5, eps_ref=2.0).config()
    assert c == {"attacks": ["apgd-ce"], "n_iter": 5, "square_queries": 5000, "eps_ref": 2.0}


def test_wrong_types_are_refused(data, tmp_path):
    pool, x, y = data
    with pytest.raises(TypeError, match="FrontierAttacks"):
        fr.run_frontier({"p": pool}, x, y, "l2", out=str(tmp_path), settings=SET)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="FrontierSettings"):
        fr.run_frontier({"p": pool}, x, y, ATT, out=str(tmp_path), settings={"batch": 4})  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="FrontierAutoAttack"):
        fr.run_frontier({"p": pool}, x, y, ATT, out=str(tmp_path), autoattack=True, settings=SET)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="no l0 version"):
        fr.run_frontier(
            {"p": pool}, x, y, fc.frontier_attacks("l0", attacks=["fmn"], cap=50), out=str(tmp_path),
            autoattack=fc.frontier_autoattack(), settings=SET,
        )  # fmt: skip
    with pytest.raises(ValueError, match="exceeds the 3 wrong classes"):
        small = Pool([Stack(mlp((8,), input_shape=(6, 6, 1), num_classes=4), *_four_class())])
        fr.run_frontier({"p": small}, x, y % 4, ATT, out=str(tmp_path), settings=SET)
    assert not any(tmp_path.iterdir())  # nothing written


def _four_class():
    arch = mlp((8,), input_shape=(6, 6, 1), num_classes=4)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 1))
    return jax.tree.map(lambda s: np.zeros(s.shape, np.float32), shapes), ("m",)


def test_default_entries_resume_the_old_cache_and_refuse_other_attacks(data, tmp_path):
    pool, x, y = data
    fp, stored = _stored()
    c = tmp_path / "cache" / "0-p"
    c.mkdir(parents=True)
    fp["sarjax_version"] = fingerprints.sarjax_version()  # the fixture's version aside, its fields
    (c / "fingerprint.json").write_text(json.dumps(fp))
    for stem, arrays in stored.items():
        np.savez_compressed(c / f"{stem}.npz", **arrays, seconds=np.array(1.0))
    assert sorted(stored) == sorted(fio.safe_name(e.name) for e in ATT.entries)
    rep = fr.run_frontier({"p": pool}, x, y, ATT, out=str(tmp_path), settings=SET)
    assert rep.extra["ran"] == [] and rep.entry_names == [e.name for e in ATT.entries]
    # another attack configuration (budget, restart radius) or another key: refused, nothing run
    for att, st, field in [
        (fc.frontier_attacks("l2", attacks=["fmn"], cap=60), SET, "cap"),
        (fc.frontier_attacks("l2", attacks=["fmn"], cap=50, init_eps=0.5), SET, "init_eps"),
        (ATT, dataclasses.replace(SET, seed=1), "seed"),
    ]:
        with pytest.raises(ValueError, match=field):
            fr.run_frontier({"p": pool}, x, y, att, out=str(tmp_path), settings=st)
    assert json.loads((c / "fingerprint.json").read_text()) == fp  # untouched


def test_default_entries_reproduce_the_old_run_bit_for_bit(data, tmp_path):
    pool, x, y = data
    fp, stored = _stored()
    fr.run_frontier({"p": pool}, x, y, ATT, out=str(tmp_path / "py"), settings=SET)
    c = tmp_path / "py" / "cache" / "0-p"
    new_fp = json.loads((c / "fingerprint.json").read_text())
    assert {k for k in fp if fp[k] != new_fp.get(k)} <= {"sarjax_version"} and set(fp) == set(new_fp)
    for stem, arrays in stored.items():
        with np.load(c / f"{stem}.npz") as z:
            for k, v in arrays.items():
                np.testing.assert_array_equal(z[k], v, err_msg=f"{stem}:{k}")
    # sarjax frontier with the same options (its defaults for the rest): the same cache
    d = save_pool(pool, tmp_path / "p")
    np.savez(tmp_path / "imgs.npz", x=x, y=y)
    args = ["frontier", "--models", str(d), "--images", str(tmp_path / "imgs.npz"), "--norm", "l2"]
    args += ["--attacks", "fmn", "--cap", "50", "--tiers", "50", "100", "--heldout", "0.34", "--batch", "4"]
    assert main([*args, "--no-progress", "--no-points", "--out", str(tmp_path / "cli")]) == 0
    cc = tmp_path / "cli" / "cache" / "0-p"
    cli_fp = json.loads((cc / "fingerprint.json").read_text())
    assert {k for k in fp if fp[k] != cli_fp.get(k)} <= {"sarjax_version", "data"}
    for stem, arrays in stored.items():
        with np.load(cc / f"{stem}.npz") as z:
            for k, v in arrays.items():
                np.testing.assert_array_equal(z[k], v, err_msg=f"cli {stem}:{k}")
