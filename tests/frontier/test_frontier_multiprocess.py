"""``sarjax frontier --model PKG.MODULE:FUNCTION --images FILE.npz`` in fresh processes, and across
2 processes on JAX's distributed runtime against one process.

Known answer: the one-process run of the same command. The pool is built by a function in a module
written to tmp_path (on PYTHONPATH for the subprocesses only), the images come from an .npz with
ids; the two processes join a coordinator on a free localhost port (gloo on CPU) and each runs one
whole attack batch of 4 of the 8 images. Every cached array (process 0's merged files) and every
number of frontier.json must equal the one-process run's, bit for bit; each process keeps its own
rows in its own cache folder.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _procs import coordinator_args, free_port, run_at_once

from sarjax.experiments.frontier_io import load_points

MODULE = """
import jax
import numpy as np

from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp


def make_pool():
    arch = mlp((8,), input_shape=(6, 6, 1), num_classes=4)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 3))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / 3).astype(np.float32), shapes)
    return Pool([Stack(arch, params, ("a", "b", "c"))])
"""
SPEC = "tinyfrontier_models:make_pool"
ENTRIES = ("fmn", "fmn_r1", "fmn_t1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one-process OUT, two-process OUT, the three processes' outputs), run at once."""
    tmp = tmp_path_factory.mktemp("frontier_mp")
    (tmp / "tinyfrontier_models.py").write_text(textwrap.dedent(MODULE))
    sys.path.insert(0, str(tmp))
    try:
        from tinyfrontier_models import make_pool  # pyright: ignore[reportMissingImports]

        pool = make_pool()
    finally:
        sys.path.remove(str(tmp))
    x = np.random.default_rng(1).uniform(size=(10, 6, 6, 1)).astype(np.float32)
    y = np.asarray(pool.logits(x))[0].argmax(-1)  # member a right everywhere, b and c on some images
    np.savez(tmp / "imgs.npz", x=x, y=y, ids=100 + 3 * np.arange(10))
    common = [sys.executable, "-m", "sarjax.cli", "frontier", "--model", SPEC, "--images", str(tmp / "imgs.npz")]
    common += ["--samples", "8", "--norm", "l2", "--attacks", "fmn", "--restarts", "1", "--targeted", "1"]
    common += ["--cap", "30", "--tiers", "30", "60", "--heldout", "0.34", "--batch", "4", "--no-progress"]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
    }
    port = free_port()
    cmds = [([*common, "--out", str(tmp / "one")], env)]
    cmds += [([*common, "--out", str(tmp / "two"), *coordinator_args(port, 2, i)], env) for i in range(2)]
    outs = run_at_once(cmds)
    return tmp / "one", tmp / "two", outs, x[:8], y[:8]


def test_frontier_on_a_model_by_import_path_and_images_from_a_file(runs):
    one, _, outs, x, y = runs
    rep = json.loads((one / "frontier.json").read_text())
    assert rep["models"] == [f"{SPEC}/a", f"{SPEC}/b", f"{SPEC}/c"] and rep["samples"] == 8
    assert rep["extra"]["model_specs"] == [SPEC] and rep["extra"]["models_dirs"] == []
    assert rep["extra"]["data"].startswith("images ") and "(10 images, sha256" in rep["extra"]["data"]
    assert "train AOI" in outs[0]
    fp = json.loads((one / "cache" / f"0-{SPEC.replace(':', '_')}" / "fingerprint.json").read_text())
    assert fp["samples"] == 8 and "ids" in fp  # the file's ids seed the streams
    pts = load_points(one, SPEC, "fmn")
    ok = np.isfinite(pts.norm) & (pts.norm > 0)
    assert ok.sum() >= 8
    d = np.sqrt(((pts.x_adv.astype(np.float64) - x[:, None]) ** 2).reshape(8, 3, -1).sum(-1))
    np.testing.assert_allclose(d[ok], pts.norm[ok], rtol=2e-6, atol=1e-6)


def test_two_processes_give_the_one_process_frontier_bit_for_bit(runs):
    one, two, outs, _, _ = runs
    tag = f"0-{SPEC.replace(':', '_')}"
    for e in ENTRIES:
        a, b = np.load(one / "cache" / tag / f"{e}.npz"), np.load(two / "cache" / tag / f"{e}.npz")
        assert set(a.files) == set(b.files) == {"norm", "trajectory", "queries", "x_adv", "entry", "seconds"}
        for k in ("norm", "trajectory", "queries", "x_adv", "entry"):
            assert a[k].dtype == b[k].dtype
            np.testing.assert_array_equal(b[k], a[k], err_msg=f"{e}:{k}")
        # each process cached its own whole batch of rows
        parts = [np.load(two / "cache" / tag / r / f"{e}.npz") for r in ("rows-0-4", "rows-4-8")]
        for k in ("norm", "trajectory", "queries", "x_adv"):
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), a[k], err_msg=f"{e}:{k}")
    assert np.isfinite(np.load(one / "cache" / tag / "fmn.npz")["norm"]).all()
    ja, jb = json.loads((one / "frontier.json").read_text()), json.loads((two / "frontier.json").read_text())
    for j, n in ((ja, 1), (jb, 2)):
        assert j["extra"].pop("processes") == n
        assert set(j["extra"].pop("attack_seconds_by_attack")) == {"fmn"}  # wall times
        assert len(j["extra"].pop("attack_seconds")) == 3
        assert j["extra"].pop("compile")["programs"] >= 0  # process 0's own compilations, not the result
        assert " frontier " in j["extra"].pop("provenance")["command"]  # each run's own command and date
    assert ja == jb
    # process 0 printed the tables and wrote OUT; process 1 neither
    assert "wrote" in outs[1] and "wrote" not in outs[2] and "train AOI" not in outs[2]
    assert sorted(p.name for p in (two / "cache" / tag).iterdir() if p.is_dir()) == ["rows-0-4", "rows-4-8"]


def test_one_process_rerun_reads_the_merged_cache(runs, monkeypatch):
    # the recipe for --autoattack after a multi-process run: one process on process 0's OUT runs nothing
    from sarjax.experiments.frontier import run_frontier_on_dirs
    from sarjax.experiments.frontier_config import FrontierSettings, frontier_attacks

    one, two, _, _, _ = runs
    monkeypatch.syspath_prepend(str(two.parent))
    attacks = frontier_attacks("l2", attacks=["fmn"], restarts=1, targeted=1, cap=30)
    settings = FrontierSettings(tiers=(30, 60), heldout=0.34, batch=4, progress=False)
    rep = run_frontier_on_dirs(
        [], attacks, out=str(two), model_specs=[SPEC], images=str(two.parent / "imgs.npz"), samples=8,
        settings=settings,
    )  # fmt: skip
    assert rep.extra["ran"] == [] and rep.extra["processes"] == 1
    ja = json.loads((one / "frontier.json").read_text())
    assert [t["q"] for t in ja["tiers"]] == [t.q for t in rep.tiers]


def test_frontier_run_summary_reads_a_run_on_a_model_by_import_path(runs, tmp_path):
    # benchmarks/frontier_run.py --from OUT rebuilds the AOI-vs-budget curve from the run's cached
    # trajectories, finding an --model pool's cache folder in frontier.json's "pools" (known answer:
    # at the run's own tiers it gives the run's train and held-out AOI)
    one = runs[0]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, str(repo / "benchmarks" / "frontier_run.py"), "--from", str(one), "--budgets", "30", "60"]
    r = subprocess.run([*cmd, "--json", str(tmp_path / "s.json")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "s.json").read_text())["aoi_vs_budget"]
    tiers = json.loads((one / "frontier.json").read_text())["tiers"]
    assert [r["budget"] for r in rows] == [t["budget"] for t in tiers] == [30, 60]
    for row, t in zip(rows, tiers):
        assert row["used"] == t["used"]
        assert row["train_aoi"] == pytest.approx(t["train_aoi"], abs=1e-12)
        assert row["heldout_aoi"] == pytest.approx(t["heldout_aoi"], abs=1e-12)
