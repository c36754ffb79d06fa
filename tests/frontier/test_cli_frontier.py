"""`sarjax frontier` end to end on two tiny saved pools with a tiny budget: tables, JSON, plots, resume,
stale-cache refusal."""

import json
import os

import jax
import numpy as np
import pytest

from sarjax.cli import main
from sarjax.data import mnist
from sarjax.experiments import frontier_config as fc
from sarjax.experiments import frontier_io as fio
from sarjax.frontier import FrontierReport, TrajectoryPool, doi, expand_pool, fixed_eps_curve, nested_allocations
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

ARCH = mlp((16,), input_shape=(28, 28, 1), num_classes=10)


def _pool(split, seed):
    # No training: nearest-template members (hidden unit c = relu(<x, noisy mean image of class c>),
    # logits = those units), so most test images are classified correctly and get attacked.
    rng = np.random.default_rng(seed)
    x = split.x_train.reshape(len(split.x_train), -1)
    means = np.stack([x[split.y_train == c].mean(0) for c in range(10)], 1)  # [784, 10]
    members = []
    for _ in range(2):
        w1 = np.zeros((784, 16), np.float32)
        w1[:, :10] = means - means.mean(1, keepdims=True) + 0.01 * rng.standard_normal((784, 10))
        w2 = np.zeros((16, 10), np.float32)
        w2[:10, :10] = np.eye(10)
        members.append(
            {"dense0": {"w": w1, "b": np.zeros(16, np.float32)}, "out": {"w": w2, "b": np.zeros(10, np.float32)}}
        )
    params = jax.tree.map(lambda *a: np.stack(a), *members)
    return Pool([Stack(ARCH, params, ("m0", "m1"))])


@pytest.fixture(scope="module", autouse=True)
def data():
    split = mnist.load_mnist()  # parse the embedded MNIST once
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mnist, "load_mnist", lambda data_dir=None: split)
        yield split


@pytest.fixture(scope="module")
def pools(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("pools")
    return [str(save_pool(_pool(data, s), root / f"p{s}")) for s in (0, 1)]


ARGS = ["--norm", "l2", "--attacks", "fmn", "--restarts", "1", "--targeted", "1", "--cap", "100"]
ARGS += ["--samples", "4", "--tiers", "100", "200", "--heldout", "0.5", "--no-progress"]


def test_attack_pool_entries():
    e = fc.attack_pool("l2", ["fmn", "ddn"], restarts=2, targeted=1)
    assert [x.name for x in e] == ["fmn", "fmn/r1", "fmn/r2", "fmn/t1", "ddn", "ddn/t1"]  # DDN: no restarts
    assert {a for a, ns in fc.ATTACK_NORMS.items() if "l0" in ns} == {"fmn", "pdpgd", "sigma_zero"}
    with pytest.raises(ValueError, match="do not support l0"):
        fc.attack_pool("l0", ["ddn"])


def test_frontier_cli_end_to_end(pools, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["frontier", "--models", *pools, "--out", str(out), *ARGS]) == 0
    text = capsys.readouterr().out
    assert "train AOI" in text and "DOI@200" in text
    rep = FrontierReport.from_json(out / "frontier.json")
    assert rep.models == ["p0/m0", "p0/m1", "p1/m0", "p1/m1"] and len(rep.heldout) == 2
    assert rep.entry_names == ["fmn", "fmn/r1", "fmn/t1"]
    assert [t.used <= t.budget for t in rep.tiers] == [True, True]
    assert all(a <= b for a, b in zip(rep.tiers[0].q, rep.tiers[1].q))
    for name in ("curves.png", "aoi_vs_budget.png", "ensemble_per_tier.png", "rank_bump.png"):
        assert (out / name).stat().st_size > 1000
    # the cached trajectories are best-so-far distances, 0 on misclassified pairs, audited by the attacks;
    # the report's DOI and AOI are those of the cached trajectories
    z = np.load(out / "cache" / "0-p0" / "fmn.npz")
    tr = z["trajectory"]
    assert tr.shape == (4, 2, 10) and np.isfinite(tr[..., -1]).any() and (tr[..., 1:] <= tr[..., :-1]).all()
    np.testing.assert_array_equal(tr[..., -1], z["norm"])
    assert rep.extra["attack_seconds_by_attack"].keys() == {"fmn"}
    assert rep.extra["provenance"]["command"].startswith("sarjax frontier --models ")
    c = rep.extra["compile"]  # the run's XLA programs (CompileStats.to_json); a session cache may hold them
    assert c["programs"] + c["cache_hits"] >= 1 and c["seconds"] >= 0 and "trace_seconds" in c, c
    assert min(rep.clean_accuracy) > 0  # some pairs were attacked
    # a rerun reads the cache (no attack runs; the stored run times) and gives the same report
    assert len(rep.extra["ran"]) == 6
    assert main(["frontier", "--models", *pools, "--out", str(out), *ARGS]) == 0
    rep2 = FrontierReport.from_json(out / "frontier.json")
    assert rep2.extra["ran"] == [] and rep2.extra["attack_seconds"] == pytest.approx(rep.extra["attack_seconds"])
    assert [t.q for t in rep2.tiers] == [t.q for t in rep.tiers] and rep2.tiers[-1].doi == rep.tiers[-1].doi
    # DOI of the last tier recomputed from the cache
    trajs = []
    for d in ("0-p0", "1-p1"):
        trajs.append(
            np.stack([np.load(out / "cache" / d / f"{n}.npz")["trajectory"] for n in ("fmn", "fmn_r1", "fmn_t1")])
        )
    t_all = np.concatenate([np.transpose(a, (2, 0, 1, 3)) for a in trajs])  # [M, A, B, L]
    q = rep.tiers[-1].q
    dist = np.full(t_all.shape[::2][:1] + (4,), np.inf)
    front = t_all[..., -1].min(axis=1)
    dist = np.where(front == 0, 0.0, np.inf)
    for a, qa in enumerate(q):
        if qa:
            dist = np.minimum(dist, t_all[:, a, :, qa // 10 - 1])
    np.testing.assert_allclose(rep.tiers[-1].doi, doi(dist))
    # --chain-updates (from the cache): Algorithm 1 with completed updates, recorded in the report
    capsys.readouterr()
    assert not rep.chains
    assert main(["frontier", "--models", *pools, "--out", str(out), *ARGS, "--chain-updates"]) == 0
    assert "completed updates" in capsys.readouterr().out
    rep3 = FrontierReport.from_json(out / "frontier.json")
    assert rep3.chains and rep3.extra["ran"] == []
    tp = TrajectoryPool(t_all, expand_pool(["fmn"], restarts=1, targeted=1), cap=100)
    want = nested_allocations(tp, (100, 200), models=rep.train, chains=True)
    assert [t.q for t in rep3.tiers] == [a.q.tolist() for a in want]
    # other settings in the same OUT are refused, naming what differs
    capsys.readouterr()
    bad = list(ARGS)
    bad[bad.index("--cap") + 1] = "200"
    assert main(["frontier", "--models", *pools, "--out", str(out), *bad]) == 2
    err = capsys.readouterr().err
    assert "cap=100" in err and "cap=200" in err and "--overwrite" in err
    fp = json.loads((out / "cache" / "0-p0" / "fingerprint.json").read_text())
    assert fp["cap"] == 100


@pytest.mark.skipif(
    os.environ.get("SARJAX_FRONTIER_FULL") != "1",
    reason="set SARJAX_FRONTIER_FULL=1 (two frontier runs, the second recompiling after every entry)",
)
def test_frontier_results_unchanged_when_the_map_guard_drops_the_programs(pools, tmp_path, monkeypatch, capsys):
    """Near vm.max_map_count a run drops JAX's compiled programs between entries
    (compile_cache.release_compiled_near_map_limit); forced after every entry here, the cached
    trajectories equal those of a run without a drop, bit for bit."""
    from sarjax.runtime import compile_cache

    a, b = tmp_path / "a", tmp_path / "b"
    args = ["--models", *pools, *ARGS, "--restarts", "0"]  # 2 pools x 2 entries (fmn, fmn/t1)
    assert main(["frontier", "--out", str(a), *args]) == 0
    real, drops = compile_cache.release_compiled_near_map_limit, []

    def spy(*args, **kw):
        drops.append(real(*args, **kw))
        return drops[-1]

    monkeypatch.setattr(compile_cache, "memory_maps", lambda: (3, 4))  # 3 of 4 mappings in use: beyond half
    monkeypatch.setattr(compile_cache, "release_compiled_near_map_limit", spy)
    capsys.readouterr()
    assert main(["frontier", "--out", str(b), *args]) == 0
    assert drops == [True] * 4  # after each entry run
    assert capsys.readouterr().err.count("dropped JAX's compiled programs") == 4
    for d in ("0-p0", "1-p1"):
        for n in ("fmn", "fmn_t1"):
            za, zb = np.load(a / "cache" / d / f"{n}.npz"), np.load(b / "cache" / d / f"{n}.npz")
            for k in ("norm", "trajectory", "queries"):
                np.testing.assert_array_equal(za[k], zb[k])


def test_frontier_cli_rejects_bad_arguments(pools, tmp_path, capsys):
    assert main(["frontier", "--models", pools[0], "--norm", "l2", "--out", str(tmp_path), "--cap", "25"]) == 2
    assert "multiple of 10" in capsys.readouterr().err
    assert main(["frontier", "--models", pools[0], "--norm", "l0", "--attacks", "ddn", "--out", str(tmp_path)]) == 2
    assert "do not support l0" in capsys.readouterr().err
    # the models and the images: one of --models / --model, not both --images and --data-dir
    assert main(["frontier", "--norm", "l2", "--out", str(tmp_path)]) == 2
    assert "no models: give --models DIR ... and / or --model PKG.MODULE:FUNCTION" in capsys.readouterr().err
    both = ["--images", str(tmp_path / "x.npz"), "--data-dir", str(tmp_path)]
    assert main(["frontier", "--models", pools[0], *both, "--norm", "l2", "--out", str(tmp_path)]) == 2
    assert "both name the images: give one" in capsys.readouterr().err
    assert main(["frontier", "--model", "no_such_module_xyz:make", "--norm", "l2", "--out", str(tmp_path)]) == 2
    assert "no_such_module_xyz:make" in capsys.readouterr().err


@pytest.mark.skipif(
    os.environ.get("SARJAX_FRONTIER_FULL") != "1", reason="set SARJAX_FRONTIER_FULL=1 (AutoAttack compiles)"
)
def test_frontier_cli_autoattack(pools, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["frontier", "--models", *pools, "--out", str(out), *ARGS]) == 0
    rep = FrontierReport.from_json(out / "frontier.json")
    front = np.minimum.reduce(
        [
            np.concatenate([np.load(out / "cache" / d / f"{n}.npz")["trajectory"][..., -1].T for d in ("0-p0", "1-p1")])
            for n in ("fmn", "fmn_r1", "fmn_t1")
        ]
    )  # fmt: skip  [M, B] frontier distances
    # AutoAttack as a curve (one stage, few iterations): the trajectories come from the cache
    capsys.readouterr()
    aa_args = ["--autoattack", "--aa-attacks", "apgd-ce", "--aa-iter", "5", "--eps-ref", "2.0"]
    assert main(["frontier", "--models", *pools, "--out", str(out), *ARGS, *aa_args]) == 0
    assert "AutoAttack as a curve" in capsys.readouterr().out
    rep3 = FrontierReport.from_json(out / "frontier.json")
    aa = rep3.extra["autoattack"]
    assert set(aa["models"]) == set(rep.models) and len(aa["tiers"]) == 2
    for i, name in enumerate(rep3.models):
        a = aa["models"][name]
        assert 2.0 in a["eps"] and len(a["eps"]) >= 2
        assert max(a["accuracy"]) <= rep3.clean_accuracy[i] + 1e-12
        fc = fixed_eps_curve(a["eps"], a["accuracy"], front[i], eps_ref=2.0)
        assert fc.aoi == pytest.approx(a["aoi"])
        assert a["cost_ref"] > 0


def test_load_models_defenses_filter(pools):
    """``--defenses`` names must exist in a zoo directory; pool directories are taken whole."""
    with pytest.raises(ValueError, match="in none of the zoo directories"):
        fio.load_models(pools, defenses=["no-such-defense"])
    m = fio.load_models(pools[:1])
    assert len(m) == 1 and m[0].member_names == ["p0/m0", "p0/m1"] and m[0].tag == "0-p0"


def test_a_zoo_model_without_a_pool_becomes_a_real_one_member_pool(tmp_path, monkeypatch):
    """A defense given only as a plain ``apply`` and one model's params (a ``ZooModel`` without a
    pool) is attacked as a :class:`Pool` of one :class:`FunctionStack` member. The shadow pool it
    replaced said 10 classes whatever the apply returned (here 3) and had no content hash."""
    from sarjax.defenses import zoo_io
    from sarjax.defenses.zoo import get_defense
    from sarjax.models.stack import FunctionStack
    from sarjax.runtime import fingerprint as fingerprints

    w = (np.arange(784 * 3, dtype=np.float32).reshape(784, 3) % 7 - 3) / 100
    apply = lambda p, x: x.reshape(x.shape[0], -1) @ p  # noqa: E731
    d = get_defense("standard-mlp")
    zm = zoo_io.ZooModel("lin", d, apply, w)  # no pool
    (tmp_path / "zoo.json").write_text("{}")
    monkeypatch.setattr(zoo_io, "load_zoo", lambda path: {"lin": zm})
    (m,) = fio.load_models([str(tmp_path)])
    pool = m.pool
    assert isinstance(pool, Pool) and isinstance(pool.stacks[0], FunctionStack)
    assert pool.names == ("lin",) and m.member_names == ["lin"] and m.tag == f"zoo-{tmp_path.name}-lin"
    assert pool.num_members == 1 and pool.num_classes == 3 and pool.input_shape == (28, 28, 1)
    assert pool.stacks[0].params.shape == (1, 784, 3)
    x = np.random.default_rng(0).uniform(size=(3, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(pool.logits(x))[0], x.reshape(3, -1) @ w, rtol=1e-5, atol=1e-6)
    assert fingerprints.pool_fingerprint(pool)["pool"] == pool.content_hash()
    # a ZooModel's own pool is used as it is; anything else in its place is refused
    assert fio.zoo_member_pool(zoo_io.ZooModel("lin", d, apply, w, pool=pool)) is pool
    with pytest.raises(TypeError, match="pool must be a sarjax.models.Pool or None, got tuple"):
        fio.zoo_member_pool(zoo_io.ZooModel("lin", d, apply, w, pool=(apply, w)))
