"""The frontier cache is identified by the images' content, not by the path they came from.

``sarjax frontier --images FILE.npz`` and :func:`run_frontier` on the same arrays share one cache:
the same file moved to another path, or the same arrays passed from Python, reuse every cached
entry (known answer: ``extra.ran`` is empty and ``frontier.json`` is equal); other content is
refused. A cache written before (its fingerprint's ``data`` naming another source) is still read.
"""

import json
import shutil

import jax
import numpy as np
import pytest

from sarjax.cli import main
from sarjax.experiments.frontier import run_frontier
from sarjax.experiments.frontier_config import FrontierSettings, frontier_attacks
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

ARGS = ["--norm", "l2", "--attacks", "fmn", "--restarts", "0", "--targeted", "0", "--cap", "30"]
ARGS += ["--tiers", "30", "--heldout", "0.5", "--no-progress"]
ATT = frontier_attacks("l2", attacks=["fmn"], restarts=0, targeted=0, cap=30)
SET = FrontierSettings(tiers=(30,), heldout=0.5, progress=False)


def _pool():
    arch = mlp((8,), input_shape=(6, 6, 1), num_classes=4)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 2))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / 3).astype(np.float32), shapes)
    return Pool([Stack(arch, params, ("a", "b"))])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frontier_content")
    pool = _pool()
    pdir = save_pool(pool, tmp / "p")
    x = np.random.default_rng(1).uniform(size=(4, 6, 6, 1)).astype(np.float32)
    y = np.asarray(pool.logits(x))[0].argmax(-1).astype(np.int64)
    (tmp / "a").mkdir()
    np.savez(tmp / "a" / "imgs.npz", x=x, y=y)
    out = tmp / "out"
    assert (
        main(["frontier", "--models", str(pdir), "--images", str(tmp / "a" / "imgs.npz"), "--out", str(out), *ARGS])
        == 0
    )
    return tmp, pool, pdir, x, y, out


def _report(out):
    return json.loads((out / "frontier.json").read_text())


def _tiers(rep):
    return rep["tiers"]


def test_the_same_file_at_another_path_reuses_the_cache(setup):
    tmp, _, pdir, _, _, out = setup
    first = _report(out)
    assert first["extra"]["ran"] == ["0-p:fmn"]
    (tmp / "b").mkdir(exist_ok=True)
    shutil.copy(tmp / "a" / "imgs.npz", tmp / "b" / "imgs.npz")
    assert (
        main(["frontier", "--models", str(pdir), "--images", str(tmp / "b" / "imgs.npz"), "--out", str(out), *ARGS])
        == 0
    )
    again = _report(out)
    assert again["extra"]["ran"] == []  # nothing ran again: the content is the same
    assert _tiers(again) == _tiers(first)
    assert str(tmp / "b" / "imgs.npz") in again["extra"]["data"]  # the report names this run's file


def test_run_frontier_on_the_same_arrays_shares_the_cli_cache(setup):
    _, pool, _, x, y, out = setup
    rep = run_frontier({"p": pool}, x, y, ATT, out=str(out), settings=SET)
    assert rep.extra["ran"] == [] and rep.extra["data"] == "arrays"
    assert [t.q for t in rep.tiers] == [t["q"] for t in _tiers(_report(out))]


def test_the_cli_reads_a_cache_run_frontier_wrote(setup, tmp_path):
    tmp, pool, pdir, x, y, _ = setup
    out = tmp_path / "out"
    rep = run_frontier({"p": pool}, x, y, ATT, out=str(out), settings=SET)
    assert rep.extra["ran"] == ["0-p:fmn"]
    assert (
        main(["frontier", "--models", str(pdir), "--images", str(tmp / "a" / "imgs.npz"), "--out", str(out), *ARGS])
        == 0
    )
    assert _report(out)["extra"]["ran"] == []


def test_other_images_are_refused(setup, tmp_path):
    tmp, pool, _, x, y, out = setup
    x2 = x.copy()
    x2[0, 0, 0, 0] = 0.5 if x2[0, 0, 0, 0] != 0.5 else 0.25
    with pytest.raises(ValueError, match="images="):
        run_frontier({"p": pool}, x2, y, ATT, out=str(out), settings=SET)
    y2 = (y + 1) % 4
    with pytest.raises(ValueError, match="images="):
        run_frontier({"p": pool}, x, y2, ATT, out=str(out), settings=SET)
    with pytest.raises(ValueError, match="ids"):  # other sample ids seed other random streams
        run_frontier({"p": pool}, x, y, ATT, out=str(out), ids=np.arange(4) + 10, settings=SET)


def test_a_cache_whose_fingerprint_names_an_old_path_is_still_read(setup, tmp_path):
    # caches written before the fix record the images' path in the fingerprint's "data" field
    tmp, pool, _, x, y, out = setup
    old = tmp_path / "out"
    shutil.copytree(out, old)
    fpf = old / "cache" / "0-p" / "fingerprint.json"
    fp = json.loads(fpf.read_text())
    fp["data"] = "images /somewhere/else/imgs.npz (4 images, sha256 0123456789abcdef)"
    fpf.write_text(json.dumps(fp))
    rep = run_frontier({"p": pool}, x, y, ATT, out=str(old), settings=SET)
    assert rep.extra["ran"] == []
