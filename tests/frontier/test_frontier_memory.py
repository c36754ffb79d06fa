"""``run_frontier`` on pools in memory and images as arrays; the adversarial points it keeps.

Known answers: the stored points are where the stored norms say (the lp distance to the clean
image recomputed in float64 equals the attack's float32 norm), misclassified by their member where
the entry succeeded, and the clean image where the pair was misclassified clean; the directory
form gives the same cache as the in-memory call on the same pool and images.
"""

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.experiments import frontier as fr
from sarjax.experiments import frontier_config as fc
from sarjax.experiments import frontier_io as fio
from sarjax.frontier import FrontierReport
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

ARCH = mlp((8,), input_shape=(6, 6, 1), num_classes=4)
ATT = fc.frontier_attacks("l2", attacks=["fmn"], restarts=1, targeted=1, cap=50)
SET = fc.FrontierSettings(tiers=(50, 100), heldout=0.34, batch=4, progress=False)
KW: dict[str, Any] = dict(settings=SET)


def _pool(seed=0, members=3):
    shapes = jax.eval_shape(jax.vmap(ARCH.init), jax.random.split(jax.random.key(0), members))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / 3).astype(np.float32), shapes)
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(members)))])


@pytest.fixture(scope="module")
def data():
    pool = _pool()
    x = np.random.default_rng(1).uniform(size=(8, 6, 6, 1)).astype(np.float32)
    y = np.asarray(pool.logits(jnp.asarray(x)))[0].argmax(-1).astype(np.int32)  # member 0 right everywhere, others not
    return pool, x, y


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    pool, x, y = data
    out = tmp_path_factory.mktemp("mem") / "out"
    rep = fr.run_frontier({"tiny": pool}, x, y, ATT, out=str(out), **KW)
    return out, rep


def test_in_memory_run_reports_and_keeps_points_within_their_norms(data, run):
    pool, x, y = data
    out, rep = run
    assert rep.models == ["tiny/m0", "tiny/m1", "tiny/m2"] and rep.entry_names == ["fmn", "fmn/r1", "fmn/t1"]
    assert FrontierReport.from_json(out / "frontier.json").to_json() == rep.to_json()
    assert rep.extra["models"] == ["tiny"] and rep.extra["data"] == "arrays" and rep.extra["points"]
    correct = (np.asarray(pool.logits(x)).argmax(-1) == y[None]).T  # [B, M]
    assert correct.any() and not correct.all()
    found = 0
    for entry in rep.entry_names:
        pts = fio.load_points(out, "tiny", entry)
        assert pts.members == ("tiny/m0", "tiny/m1", "tiny/m2") and pts.x_adv.dtype == np.float32
        assert pts.x_adv.shape == (8, 3, 6, 6, 1) and pts.norm.shape == (8, 3)
        z = np.load(out / "cache" / "0-tiny" / f"{fio.safe_name(entry)}.npz")
        np.testing.assert_array_equal(z["norm"], pts.norm)
        ok = np.isfinite(pts.norm) & correct
        found += int(ok.sum())
        d = np.sqrt(((pts.x_adv.astype(np.float64) - x[:, None].astype(np.float64)) ** 2).reshape(8, 3, -1).sum(-1))
        np.testing.assert_allclose(d[ok], pts.norm[ok], rtol=2e-6, atol=1e-6)  # the float32 norm of the point
        assert (pts.x_adv >= 0).all() and (pts.x_adv <= 1).all()
        # misclassified clean: the clean image at distance 0; not found: the clean image at inf
        np.testing.assert_array_equal(pts.x_adv[~correct], np.broadcast_to(x[:, None], pts.x_adv.shape)[~correct])
        assert (pts.norm[~correct] == 0).all()
        lost = correct & ~np.isfinite(pts.norm)
        np.testing.assert_array_equal(pts.x_adv[lost], np.broadcast_to(x[:, None], pts.x_adv.shape)[lost])
        # every found point is misclassified by its member
        for m in range(3):
            pred = np.asarray(pool.logits(pts.x_adv[:, m]))[m].argmax(-1)
            assert (pred[ok[:, m]] != y[ok[:, m]]).all(), (entry, m)
        one = fio.load_points(out, "tiny/m1", entry)  # one member
        assert one.members == ("tiny/m1",) and one.x_adv.shape == (8, 1, 6, 6, 1)
        np.testing.assert_array_equal(one.x_adv[:, 0], pts.x_adv[:, 1])
    assert found > 10  # points were found
    with pytest.raises(ValueError, match="neither a pool"):
        fio.load_points(out, "nope", "fmn")
    with pytest.raises(ValueError, match="not an entry"):
        fio.load_points(out, "tiny", "ddn")


def test_directory_form_gives_the_in_memory_cache(data, run, tmp_path, monkeypatch):
    # the same pool saved and the same images in a file: the same cache arrays, tag and fingerprint
    # (but the data source)
    pool, x, y = data
    out, _ = run
    d = save_pool(pool, tmp_path / "tiny")
    np.savez(tmp_path / "imgs.npz", x=x, y=y)
    rep = fr.run_frontier_on_dirs([str(d)], ATT, out=str(tmp_path / "o"), images=str(tmp_path / "imgs.npz"), **KW)
    assert rep.models == ["tiny/m0", "tiny/m1", "tiny/m2"] and rep.extra["models_dirs"] == [str(d)]
    assert rep.extra["data"].startswith("images ") and rep.samples == 8
    for e in ("fmn", "fmn_r1", "fmn_t1"):
        a, b = np.load(out / "cache" / "0-tiny" / f"{e}.npz"), np.load(tmp_path / "o" / "cache" / "0-tiny" / f"{e}.npz")
        for k in ("norm", "trajectory", "queries", "x_adv", "entry"):
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{e}:{k}")
    fa = json.loads((out / "cache" / "0-tiny" / "fingerprint.json").read_text())
    fb = json.loads((tmp_path / "o" / "cache" / "0-tiny" / "fingerprint.json").read_text())
    assert {k for k in fa if fa[k] != fb.get(k)} == {"data"}
    with pytest.raises(ValueError, match="more than the 8 images"):
        fr.run_frontier_on_dirs([str(d)], ATT, out=str(tmp_path / "o5"), images=str(tmp_path / "imgs.npz"), samples=9)
    with pytest.raises(ValueError, match="give one"):
        fr.run_frontier_on_dirs([str(d)], ATT, out=str(tmp_path / "o5"), images="a.npz", data_dir="b")
    with pytest.raises(ValueError, match="no models"):
        fr.run_frontier_on_dirs([], ATT, out=str(tmp_path / "o5"))


def test_old_cache_without_points_is_rerun_and_no_points_keeps_none(data, run, tmp_path, capsys):
    pool, x, y = data
    out, rep = run
    # a cache file as sarjax wrote it before the points were kept: rerun when points are wanted, said so
    f = out / "cache" / "0-tiny" / "fmn.npz"
    z = dict(np.load(f))
    z.pop("x_adv")
    np.savez(f, **z)
    capsys.readouterr()
    rep2 = fr.run_frontier({"tiny": pool}, x, y, ATT, out=str(out), **KW)
    assert "holds no adversarial points" in capsys.readouterr().err and rep2.extra["ran"] == ["0-tiny:fmn"]
    assert "x_adv" in np.load(f).files
    np.testing.assert_array_equal(np.load(f)["norm"], z["norm"])  # the same run again
    assert [t.q for t in rep2.tiers] == [t.q for t in rep.tiers]
    # keep_points=False: no points written, the cache is used as it is
    o = tmp_path / "np"
    rep3 = fr.run_frontier([pool], x, y, ATT, out=str(o), settings=dataclasses.replace(SET, keep_points=False))
    assert rep3.models[0] == "pool0/m0" and not rep3.extra["points"]
    assert "x_adv" not in np.load(o / "cache" / "0-pool0" / "fmn.npz").files
    with pytest.raises(ValueError, match="no adversarial points"):
        fio.load_points(o, "pool0", "fmn")
    np.testing.assert_array_equal(np.load(o / "cache" / "0-pool0" / "fmn.npz")["trajectory"], z["trajectory"])


def test_inputs_are_checked(data, tmp_path):
    pool, x, y = data
    with pytest.raises(TypeError, match="list of Pool or a dict"):
        fr.run_frontier(pool, x, y, ATT, out=str(tmp_path), **KW)
    with pytest.raises(TypeError, match="pool 1: expected a sarjax.models.Pool"):
        fr.run_frontier([pool, object()], x, y, ATT, out=str(tmp_path), **KW)
    with pytest.raises(ValueError, match=r"images for tiny: x must be in \[0, 1\]"):
        fr.run_frontier({"tiny": pool}, x * 2, y, ATT, out=str(tmp_path), **KW)
    with pytest.raises(ValueError, match="shape"):
        fr.run_frontier({"tiny": pool}, x[:, :5], y, ATT, out=str(tmp_path), **KW)
    with pytest.raises(ValueError, match="label y"):
        fr.run_frontier({"tiny": pool}, x, y + 4, ATT, out=str(tmp_path), **KW)
    with pytest.raises(ValueError, match="distinct"):
        fr.run_frontier({"tiny": pool}, x, y, ATT, out=str(tmp_path), ids=[0] * 8, **KW)


def test_ids_seed_the_streams_and_enter_the_fingerprint(data, run, tmp_path):
    # rows 4..7 run alone with their ids 4..7 give the rows of the whole run (the restarts' draws
    # and the attacks' streams follow the ids, not the positions)
    pool, x, y = data
    out, _ = run
    o = tmp_path / "half"
    fr.run_frontier({"tiny": pool}, x[4:], y[4:], ATT, out=str(o), ids=np.arange(4, 8), **KW)
    for e in ("fmn", "fmn_r1", "fmn_t1"):
        a, b = np.load(out / "cache" / "0-tiny" / f"{e}.npz"), np.load(o / "cache" / "0-tiny" / f"{e}.npz")
        for k in ("norm", "trajectory", "queries", "x_adv"):
            np.testing.assert_array_equal(b[k], a[k][4:], err_msg=f"{e}:{k}")
    assert "ids" in json.loads((o / "cache" / "0-tiny" / "fingerprint.json").read_text())
    assert "ids" not in json.loads((out / "cache" / "0-tiny" / "fingerprint.json").read_text())
