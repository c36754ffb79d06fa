"""The defense zoo (issue 16 item 1): CrossMax, the multi-resolution stack, the entries' configs,
the randomized defenses, distillation's loss, and a tiny ``train_defenses`` run that loads back."""

from __future__ import annotations

import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.defenses import self_ensemble as se
from sarjax.defenses import zoo, zoo_io, zoo_train
from sarjax.defenses.zoo_objectives import distillation, gaussian_augmentation, l1_apgd_at
from sarjax.models.train import cross_entropy
from sarjax.models.zoo import mlp

# ----------------------------------------------------------------------------- CrossMax

# 4 predictors x 3 classes (one sample). By hand (Algorithm 1 of Fort & Lakshminarayanan 2024):
# 1) minus each predictor's max over classes:
#    p0 [1,2,0]-2 = [-1,0,-2]; p1 [3,0,1]-3 = [0,-3,-2]; p2 [0,0,5]-5 = [-5,-5,0]; p3 [4,5,4]-5 = [-1,0,-1]
# 2) minus each class's max over predictors: the maxima are 0, 0, 0, so nothing changes
# 3) per class over predictors, sorted high to low:
#    class 0: 0, -1, -1, -5   class 1: 0, 0, -3, -5   class 2: 0, -1, -2, -2
Z = np.array([[[1, 2, 0], [3, 0, 1], [0, 0, 5], [4, 5, 4]]], np.float32)


@pytest.mark.parametrize(
    "k, want",
    [
        (1, [0.0, 0.0, 0.0]),
        (2, [-1.0, 0.0, -1.0]),
        (3, [-1.0, -3.0, -2.0]),
        (4, [-5.0, -5.0, -2.0]),
        (None, [-1.0, -1.5, -1.5]),  # median of 4 values: mean of the middle two
    ],
)
def test_crossmax_equals_hand_computation(k, want):
    np.testing.assert_array_equal(np.asarray(se.crossmax(jnp.asarray(Z), k)), np.array([want], np.float32))


def test_crossmax_step2_subtracts_per_class_max_over_predictors():
    # Here step 2 matters: after step 1, p0 = [0, -1], p1 = [-3, 0] -> class maxima 0, 0; with a third
    # predictor p2 = [2, 2] -> [0, 0]: class maxima still 0. Shift one class up in every predictor
    # and step 1 absorbs it only partly; hand: Z = [[0, 5], [1, 3]] -> step 1: [[-5, 0], [-2, 0]]
    # -> step 2 (class maxima -2, 0): [[-3, 0], [0, 0]] -> k=2 per class: [-3, 0]
    z = jnp.array([[[0.0, 5.0], [1.0, 3.0]]])
    np.testing.assert_array_equal(np.asarray(se.crossmax(z, 2)), [[-3.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(se.crossmax(z, 1)), [[0.0, 0.0]])


def test_crossmax_rejects_bad_k_and_shape():
    with pytest.raises(ValueError, match=r"k must be an int in \[1, N=4\]"):
        se.crossmax(jnp.asarray(Z), 5)
    with pytest.raises(ValueError, match="logits \\[B, N, C\\]"):
        se.crossmax(jnp.zeros((4, 3)), 2)


# ----------------------------------------------------------------------------- multi-resolution input


def test_multires_stack_equals_hand_built():
    x = np.random.default_rng(0).random((2, 28, 28, 1), dtype=np.float32)
    want = np.zeros((2, 28, 28, 3), np.float32)
    want[..., 0] = x[..., 0]
    for ci, f in ((1, 2), (2, 4)):  # 14 x 14 and 7 x 7, back to 28 x 28
        for b in range(2):
            for i in range(0, 28, f):
                for j in range(0, 28, f):
                    want[b, i : i + f, j : j + f, ci] = x[b, i : i + f, j : j + f, 0].mean()
    got = np.asarray(se.multires_stack(jnp.asarray(x), (28, 14, 7)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_random_views_shift_each_channel_within_jitter():
    # a single lit pixel per channel: after the view (no noise) it moved by at most `jitter` pixels
    xs = np.zeros((3, 28, 28, 3), np.float32)
    xs[:, 14, 14, :] = 1.0
    v = np.asarray(se.random_views(jax.random.key(1), jnp.asarray(xs), 2, 0.0))
    moved = 0
    for b in range(3):
        for c in range(3):
            (i,), (j,) = np.nonzero(v[b, :, :, c].max(1))[0:1], np.nonzero(v[b, :, :, c].max(0))[0:1]
            assert abs(i - 14) <= 2 and abs(j - 14) <= 2 and v[b, :, :, c].sum() == 1.0
            moved += (i, j) != (14, 14)
    assert moved >= 5  # 9 independent offsets in [-2, 2]^2: staying put 9 times has probability 25^-9


# ----------------------------------------------------------------------------- randomized defenses


@pytest.fixture(scope="module")
def tiny_models():
    cfg = se.SelfEnsembleConfig(channels=(4, 8), dense=16)
    se_params = jax.jit(lambda k: se.init(cfg, k))(jax.random.key(0))
    # the noise defense's randomness is with_input_noise's, whatever the network: a small MLP keeps it fast
    arch = mlp((16,))
    net_params = jax.jit(arch.init)(jax.random.key(1))
    return cfg, se_params, arch, net_params


def test_randomized_defenses_stochastic_across_keys_deterministic_under_one(tiny_models):
    from sarjax.attacks.eot import with_input_noise

    cfg, se_params, arch, net_params = tiny_models
    x = jnp.asarray(np.random.default_rng(0).random((4, 28, 28, 1), dtype=np.float32))
    noisy = jax.jit(with_input_noise(arch.apply, zoo.get_defense("gaussian-noise-cnn").get("inference_sigma")))
    for f, p in ((noisy, net_params), (jax.jit(lambda p, x, k: se.apply(cfg, p, x, k)), se_params)):
        a, b, c = (np.asarray(f(p, x, jax.random.key(s))) for s in (7, 7, 8))
        np.testing.assert_array_equal(a, b)
        assert np.abs(a - c).max() > 1e-3
    # the self-ensemble without a key: the plain views, deterministic
    det = jax.jit(lambda p, x: se.apply(cfg, p, x))
    np.testing.assert_array_equal(np.asarray(det(se_params, x)), np.asarray(det(se_params, x)))


# ----------------------------------------------------------------------------- objectives


def test_distillation_loss_equals_hand_computed_soft_cross_entropy():
    logits = jnp.array([[1.0, 2.0, 3.0], [0.0, -2.0, 4.0]])
    target = jnp.array([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]])
    t = 2.0
    want = 0.0
    for z, q in zip(np.asarray(logits), np.asarray(target)):
        zs = z / t
        lse = math.log(sum(math.exp(v) for v in zs))
        want += -sum(qc * (zc - lse) for qc, zc in zip(q, zs))
    want /= 2
    obj = distillation(t)
    assert float(obj.loss(logits, target)) == pytest.approx(want, rel=1e-6)
    # through the trainer's interface: apply gives the logits, hp carries the temperature
    got = obj(lambda p, x, key=None: logits, None, None, target, jax.random.key(0), {"temperature": jnp.float32(t)})
    assert float(got) == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        distillation(0.0)


def test_gaussian_augmentation_at_sigma_zero_is_the_standard_objective(tiny_models):
    _, _, arch, p = tiny_models
    x = jnp.asarray(np.random.default_rng(1).random((8, 28, 28, 1), dtype=np.float32))
    y = jax.nn.one_hot(jnp.arange(8) % 10, 10)

    def apply(p, x, key=None):
        return arch.apply(p, x)

    key = jax.random.key(3)
    std = cross_entropy(apply, p, x, y, key, {})
    g = gaussian_augmentation()
    assert float(g(apply, p, x, y, key, {"sigma": jnp.float32(0.0)})) == float(std)
    assert float(g(apply, p, x, y, key, {"sigma": jnp.float32(0.25)})) != float(std)


def test_l1_apgd_at_perturbation_stays_in_the_l1_ball():
    w = jnp.asarray(np.random.default_rng(2).normal(size=(784, 10)).astype(np.float32))

    def apply(p, x, key=None):
        return x.reshape(x.shape[0], -1) @ p

    x = jnp.asarray(np.random.default_rng(3).random((4, 28, 28, 1), dtype=np.float32))
    labels = jnp.arange(4)
    obj = l1_apgd_at(eps=5.0, n_iter=3)
    xa = obj.perturb(apply, w, x, labels, jax.random.key(0), 5.0)
    d = np.abs(np.asarray(xa - x)).reshape(4, -1).sum(1)
    assert (d <= 5.0 * (1 + 1e-5)).all() and d.max() > 1.0
    assert float(jnp.min(xa)) >= 0.0 and float(jnp.max(xa)) <= 1.0


# ----------------------------------------------------------------------------- the entries


def test_zoo_entries_match_their_cited_sources():
    ds = {d.name: d for d in zoo.DEFENSES}
    assert len(ds) == len(zoo.DEFENSES) >= 12
    for d in zoo.DEFENSES:
        if d.eps is not None:
            assert d.eps in [float(t) for t in re.findall(r"\d+(?:\.\d+)?", d.name)], d.name
        assert d.source, d.name
    for n in ("pgd-at-linf-0.1", "pgd-at-linf-0.3", "pgd-at-linf-0.1-mlp", "pgd-at-l2-1.5"):
        assert ds[n].objective == "pgd-at" and "Madry" in ds[n].source and ds[n].get("steps") == 10
    assert ds["pgd-at-linf-0.3"].get("ramp_epochs") > 0 and "Gowal" in ds["pgd-at-linf-0.3"].source
    assert (ds["pgd-at-l2-1.5"].norm, ds["pgd-at-l2-1.5"].eps) == ("l2", 1.5)
    l1 = ds["l1-apgd-at-10"]
    assert (l1.objective, l1.norm, l1.eps) == ("l1-apgd-at", "l1", 10.0) and "Croce & Hein 2021" in l1.source
    for n, eps in (("trades-linf-0.1", 0.1), ("trades-linf-0.3", 0.3)):
        assert ds[n].objective == "trades" and ds[n].eps == eps and ds[n].get("beta") == 6.0
        assert "beta 6" in ds[n].source and "Zhang et al. 2019" in ds[n].source
    g = ds["gaussian-noise-cnn"]
    assert g.get("sigma") == g.get("inference_sigma") == 0.25 and g.stochastic and "Cohen et al. 2019" in g.source
    dist = ds["distilled-cnn"]
    assert dist.get("temperature") == 20.0 and "T = 20" in dist.source and "Hinton" in dist.source
    names = list(ds)
    assert names.index(dist.get("teacher")) < names.index("distilled-cnn")
    assert ds[dist.get("teacher")].objective == "standard" and ds[dist.get("teacher")].arch == "cnn"
    s = ds["self-ensemble"]
    cfg = zoo.self_ensemble_config(s)
    assert cfg.resolutions == (28, 14, 7) and cfg.crossmax_k == 2 and "k = 2" in s.source
    assert cfg.jitter > 0 and cfg.noise_std > 0 and s.stochastic and "Fort & Lakshminarayanan" in s.source
    assert {ds["standard-mlp"].arch, ds["standard-cnn"].arch} == {"mlp", "cnn"}
    # grouping: the two PGD-AT linf radii and the two TRADES radii train as one stack each,
    # the standard CNN with the noise-trained one (sigma 0 and 0.25)
    key = zoo_train.group_key
    assert key(ds["pgd-at-linf-0.1"]) == key(ds["pgd-at-linf-0.3"]) != key(ds["pgd-at-l2-1.5"])
    assert key(ds["trades-linf-0.1"]) == key(ds["trades-linf-0.3"])
    assert key(ds["standard-cnn"]) == key(ds["gaussian-noise-cnn"]) != key(ds["standard-mlp"])


# ----------------------------------------------------------------------------- train, save, load


def test_self_ensemble_checkpoint_round_trip(tmp_path, tiny_models):
    cfg, p, _, _ = tiny_models
    zoo_io.save_self_ensemble(tmp_path / "se", cfg, p)
    cfg2, p2, _ = zoo_io.load_self_ensemble(tmp_path / "se")
    x = jnp.asarray(np.random.default_rng(4).random((3, 28, 28, 1), dtype=np.float32))
    assert cfg2 == cfg
    det = jax.jit(lambda p, x: se.apply(cfg, p, x))
    np.testing.assert_array_equal(np.asarray(det(p2, x)), np.asarray(det(p, x)))
    leaves = dict(np.load(tmp_path / "se" / "params.npz"))
    k = sorted(leaves)[0]
    leaves[k] = leaves[k] + 1e-3
    np.savez(tmp_path / "se" / "params.npz", **leaves)
    with pytest.raises(ValueError, match="SHA-256"):
        zoo_io.load_self_ensemble(tmp_path / "se")


@pytest.mark.skipif(
    os.environ.get("SARJAX_DEFENSES_FULL") != "1",
    reason="SARJAX_DEFENSES_FULL=1: a tiny train-defenses run (about 30 s on 2 cores; the suite's 15-minute budget)",
)
def test_tiny_train_defenses_saves_loads_resumes_and_refuses_stale(tmp_path):
    settings = zoo_train.ZooSettings(epochs=1, self_ensemble_epochs=1, batch_size=32, train_samples=64, attack_steps=1)
    only = ["standard-mlp", "pgd-at-linf-0.1-mlp"]  # two MLP groups: cheap to compile
    s1 = zoo_train.train_defenses(tmp_path, only=only, settings=settings, progress=False, log=lambda m: None)
    assert {n: r["status"] for n, r in s1["defenses"].items()} == dict.fromkeys(only, "trained")
    idx = json.loads((tmp_path / "zoo.json").read_text())
    models = zoo_io.load_zoo(tmp_path)
    assert list(models) == only
    from sarjax.data.mnist import load_mnist

    xt = load_mnist().x_test[: zoo_train.N_HEAD]
    for n, m in models.items():
        want = np.asarray(idx["defenses"][n]["test_logits_head"], np.float32)
        np.testing.assert_allclose(np.asarray(m.apply(m.params, xt)), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(m.pool.logits(xt))[0], want, rtol=1e-5, atol=1e-5)
    assert not models["standard-mlp"].stochastic and models["pgd-at-linf-0.1-mlp"].stochastic_apply is None
    assert zoo_io.zoo_pool(models).names == tuple(only)
    s2 = zoo_train.train_defenses(tmp_path, only=only, settings=settings, progress=False, log=lambda m: None)
    assert {r["status"] for r in s2["defenses"].values()} == {"cached"}
    with pytest.raises(ValueError, match=r"standard-mlp \(settings\)"):
        zoo_train.train_defenses(
            tmp_path, only=["standard-mlp"], settings=zoo_train.ZooSettings(epochs=2, train_samples=64), progress=False
        )
