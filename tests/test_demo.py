"""`sarjax demo`: the table's SAR ± standard error cells, one joint attack per pool structure, the
time split, and the cosine learning-rate schedule of the demo pools."""

import json
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.cover.result import SARResult
from sarjax.data.mnist import load_mnist
from sarjax.experiments import demo
from sarjax.models.pool import Pool, Stack
from sarjax.models.train import MemberConfig, TrainConfig, TrainMonitor, lr_scales, train_stack
from sarjax.models.zoo import mlp

ARCH = mlp((16,), input_shape=(28, 28, 1), num_classes=10)


def _pool(m=3, seed=0):
    # Random params in ARCH's structure (no training: the demo's reporting is what is tested);
    # scaled so that members disagree and eps 0.05 breaks some of them, not all.
    shapes = jax.eval_shape(ARCH.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: (3 * rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(m)))])


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One tiny demo (3 random 3-member MLP pools, 6 images, 20 steps x 1 restart), its stdout
    and the number of joint attacks it built."""
    split = load_mnist()
    built = []
    from sarjax.attacks import joint

    real = joint.make_joint_pgd

    def counting(*a, **k):
        built.append(1)
        return real(*a, **k)

    pools = {"low": _pool(seed=0), "medium": _pool(seed=1), "high": _pool(seed=2)}
    out = tmp_path_factory.mktemp("demo") / "D"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo, "load_mnist", lambda data_dir=None: split)
        mp.setattr(demo, "get_pool", lambda preset, *a, **k: (pools[preset], {}))
        mp.setattr(demo, "make_joint_pgd", counting)  # demo imports it at module level
        import io
        from contextlib import redirect_stdout

        buf = io.StringIO()
        with redirect_stdout(buf):
            doc = demo.run_demo(out, quick=True, samples=6, progress=False)
    return doc, buf.getvalue(), out, len(built)


def test_demo_table_prints_each_sar_with_its_standard_error(demo_run):
    doc, text, out, _ = demo_run
    for preset in ("low", "medium", "high"):
        res = SARResult.load(out / f"sar_{preset}")
        sar = res.sar[res.valid]  # [n, 4] per-image SAR, coverages 0.5, 0.75, 0.85, 1
        mean, se = sar.mean(0), sar.std(0, ddof=1) / np.sqrt(len(sar))
        rec = doc["pools"][preset]
        assert rec["num_samples"] == 6
        for j, c in enumerate(demo.COVERAGES):
            assert rec["sar"][f"{c:g}"] == pytest.approx(mean[j])
            assert rec["sar_se"][f"{c:g}"] == pytest.approx(se[j])
        row = next(line for line in text.splitlines() if re.search(rf"\b{preset}\b\s*│", line))
        cells = re.findall(r"(\d\.\d{3})±(\d\.\d{3})", row)
        assert len(cells) == 8  # SAR and singleton-completed SAR at 4 coverages
        printed = np.array([(float(a), float(b)) for a, b in cells[:4]])  # [4, 2]: SAR, standard error
        np.testing.assert_allclose(printed, np.stack([np.round(mean, 3), np.round(se, 3)], axis=1), rtol=0, atol=1e-9)
    assert "mean ± standard error over the images" in text


def test_demo_builds_one_joint_attack_per_pool_structure_and_prints_the_time_split(demo_run):
    doc, text, _, built = demo_run
    assert built == 1  # three pools of one structure: one attack, one compiled kernel
    phases = doc["time_split"]["phases"]
    assert list(phases) == ["train or load", "test accuracy", "member attacks", "greedy rounds"]
    assert sum(v["seconds"] for v in phases.values()) <= doc["seconds"]
    assert len(doc["time_split"]["per_pool"]) == 12 and len(doc["load_average"]) == 3
    line = next(line for line in text.splitlines() if line.startswith("time split: "))
    assert re.search(r"greedy rounds \d+s \(compile \d+s\); other -?\d+s; total \d+s \(load average ", line)
    assert json.loads((demo_run[2] / "results.json").read_text())["time_split"]["phases"] == phases


def test_phase_clock_measures_wall_and_compile_seconds():
    clock = demo.PhaseClock()
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())
    with clock("compile", "a"):
        f(jnp.ones(7)).block_until_ready()
    with clock("run", "a"):
        f(jnp.ones(7)).block_until_ready()  # cached: no compile
        time.sleep(0.05)
    split = clock.split()
    assert split["compile"]["compile_seconds"] > 0
    assert split["run"]["compile_seconds"] == 0 and split["run"]["seconds"] >= 0.05


def test_lr_scales_cosine_known_values():
    np.testing.assert_array_equal(lr_scales("constant", 3, 4, 5), np.ones(4))
    got = lr_scales("cosine", 1, 2, 2)  # global steps 2, 3 of T = 4
    np.testing.assert_allclose(got, [0.5, 0.5 * (1 + np.cos(3 * np.pi / 4))], rtol=1e-6)
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        lr_scales("linear", 0, 2, 2)
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        train_stack(
            ARCH, [MemberConfig()], np.zeros((8, 28, 28, 1)), np.zeros(8, int), config=TrainConfig(lr_schedule="x")
        )


@pytest.mark.skipif(
    os.environ.get("SARJAX_MODELS_FULL") != "1",
    reason="SARJAX_MODELS_FULL=1: ~12 s; test_lr_scales_cosine_known_values stays",
)
def test_cosine_schedule_scales_each_adam_update(mnist_tiny):
    # Adam(W) updates are linear in the learning rate: with one step per epoch over 2 epochs the
    # cosine schedule's factors are 1 and 0.5, so its second update is half the constant one's
    # from the same point (its first update equal).
    x, y, xv, yv = mnist_tiny
    snaps = {}
    for sched in ("constant", "cosine"):
        seen = []
        cfg = TrainConfig(epochs=2, batch_size=16, patience=0, lr_schedule=sched)
        train_stack(
            ARCH,
            [MemberConfig(seed=0, lr=1e-2), MemberConfig(seed=1, lr=3e-3, weight_decay=1e-2)],
            x,
            y,
            config=cfg,
            monitor=TrainMonitor(
                validation=(xv, yv),
                progress=False,
                callback=lambda ep, p, seen=seen: seen.append(jax.tree.map(np.asarray, p)),
            ),
        )
        snaps[sched] = seen
    (c1, c2), (s1, s2) = snaps["constant"], snaps["cosine"]
    for a, b in zip(jax.tree.leaves(c1), jax.tree.leaves(s1)):
        np.testing.assert_array_equal(a, b)
    for a1, a2, b1, b2 in zip(*(jax.tree.leaves(t) for t in (c1, c2, s1, s2))):
        np.testing.assert_allclose(b2 - b1, 0.5 * (a2 - a1), rtol=1e-3, atol=1e-7)
        assert np.abs(a2 - a1).max() > 1e-4


@pytest.fixture(scope="module")
def mnist_tiny():
    d = load_mnist()
    return d.x_train[:16], d.y_train[:16], d.x_test[:20], d.y_test[:20]


def test_high_preset_mlp_members_train_with_full_augmentation():
    from sarjax.models.presets import MLP_AUG_STRENGTH, preset_members

    members = preset_members("high", 20)
    mlps = [c for a, c in members if a.family == "mlp"]
    others = [c for a, c in members if a.family != "mlp"]
    assert len(mlps) == 7 and {c.aug_strength for c in mlps} == {MLP_AUG_STRENGTH} == {1.0}
    assert {c.aug_strength for c in others} == {0.0, 0.5, 1.0}  # still drawn per member


def test_attack_copy_fuses_only_the_cnn_stacks():
    from sarjax.models import zoo

    archs = [zoo.cnn((2, 2), dense=4), zoo.resnet((2,), blocks=1, dense=4), ARCH]
    pool = Pool([Stack.from_keys(a, jax.random.split(jax.random.key(i), 2)) for i, a in enumerate(archs)])
    got = demo.attack_copy(pool, "fused")
    assert [(s.arch.family, s.arch.conv_impl) for s in got.stacks] == [
        ("cnn", "fused"),
        ("resnet", "im2col"),
        ("mlp", "im2col"),
    ]
    assert got.names == pool.names
    for a, b in zip(jax.tree.leaves(pool.params), jax.tree.leaves(got.params)):
        assert a is b
