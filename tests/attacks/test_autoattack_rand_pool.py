"""AutoAttack's rand version on a saved pool's randomized members (issue 16): ``sarjax autoattack
--version rand`` reads which members are randomized (a self-ensemble's stochastic views, a noise
defense's saved ``inference_sigma``) and attacks them as deployed, with EOT over 20 draws.

The pool: a tiny self-ensemble and two MLPs, one of them a "Gaussian-noise" defense by its saved
record. The default tests build the deployed applies (forwards only) and run the CLI on the noise
MLP (APGD with EOT 20 on 4 images, 2 iterations); the CLI run on the self-ensemble compiles EOT
attacks through its views and runs with ``SARJAX_AUTOATTACK_FULL=1``.
"""

from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.cli.autoattack import randomized_members
from sarjax.defenses import self_ensemble as se
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

FULL = os.environ.get("SARJAX_AUTOATTACK_FULL") == "1"
CFG = se.SelfEnsembleConfig(resolutions=(28, 14), channels=(3,), dense=4)  # as test_self_ensemble_stack
SIGMA = 0.25
N_IT = 2
EOT = 20


def _record(stochastic, hp):
    return {"defense": {"name": "x", "hp": hp}, "stochastic": stochastic}


def _centroid_mlp_params(n_members: int):
    """A nearest-centroid classifier as ``mlp((10,))`` weights (about 80% clean accuracy on MNIST, so
    the attacks have correctly classified points to attack): hidden unit ``c`` is ``x . mu_c -
    ||mu_c||^2 / 2 + 100`` (positive: the ReLU is the identity), the output layer the identity."""
    from sarjax.data.mnist import load_mnist

    data = load_mnist()
    xs = np.asarray(data.x_train, np.float64).reshape(len(data.x_train), -1)
    mu = np.stack([xs[np.asarray(data.y_train) == c].mean(0) for c in range(10)], 1)  # [784, 10]
    one = {
        "dense0": {"w": mu, "b": 100.0 - 0.5 * (mu * mu).sum(0)},
        "out": {"w": np.eye(10), "b": np.zeros(10)},
    }
    return jax.tree.map(lambda a: jnp.asarray(np.repeat(a[None], n_members, 0), jnp.float32), one)


CONFIG = {
    "members": {
        "self-ensemble": _record(True, {"jitter": 2}),
        "plain-mlp": _record(False, {}),
        "noise-mlp": _record(True, {"sigma": SIGMA, "inference_sigma": SIGMA}),
    }
}


def _pool(init_se: bool):
    """Stacks [self-ensemble], [plain MLP, noise MLP] (the self-ensemble's params zeros unless
    ``init_se``: the default tests only build its applies, no compilation)."""
    if init_se:
        p_se = jax.tree.map(lambda a: a[None], jax.jit(functools.partial(se.init, CFG))(jax.random.key(0)))
    else:
        shapes = jax.eval_shape(functools.partial(se.init, CFG), jax.random.key(0))
        p_se = jax.tree.map(lambda a: jnp.zeros((1, *a.shape), a.dtype), shapes)
    se_stack = se.SelfEnsembleStack(CFG, p_se, ("self-ensemble",))
    return Pool([se_stack, Stack(mlp((10,)), _centroid_mlp_params(2), ("plain-mlp", "noise-mlp"))])


@pytest.fixture(scope="module")
def pool():
    return _pool(False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The pool saved as ``sarjax zoo-pool`` saves one (FULL tests)."""
    path = tmp_path_factory.mktemp("randpool") / "pool"
    save_pool(_pool(True), path, config=CONFIG)
    return path


def test_randomized_members_are_the_deployed_models(pool):
    got = randomized_members(pool, CONFIG)
    assert list(got) == ["self-ensemble", "noise-mlp"]  # pool order; the plain MLP is deterministic
    se_stack, mlps = pool.stacks
    assert got["self-ensemble"][0] is se_stack.member_stochastic_apply  # the views pool_stochastic_apply vmaps
    x = jnp.asarray(np.random.default_rng(0).random((3, 28, 28, 1), dtype=np.float32))
    k = jax.random.key(4)
    p1 = jax.tree.map(lambda a: a[1], mlps.params)
    noisy = np.asarray(got["noise-mlp"][0](p1, x, k))
    want = np.asarray(mlps.member_apply(p1, jnp.clip(x + SIGMA * jax.random.normal(k, x.shape), 0.0, 1.0)))
    np.testing.assert_allclose(noisy, want, rtol=1e-6, atol=1e-6)  # N(0, sigma^2) input noise, clipped
    assert np.abs(np.asarray(got["noise-mlp"][0](p1, x, jax.random.key(5))) - noisy).max() > 1e-4
    assert "sigma 0.25" in got["noise-mlp"][1]


def test_randomized_members_other_layouts_and_errors(pool):
    mlps = Pool([pool.stacks[1]])
    assert randomized_members(mlps, {}) == {}  # no record: deterministic
    one = Pool([pool.stacks[1].select([1])])  # one defense saved by train-defenses: config["defense"]
    got = randomized_members(one, {"defense": {"hp": {"inference_sigma": 0.5}}})
    assert list(got) == ["noise-mlp"] and "sigma 0.5" in got["noise-mlp"][1]
    with pytest.raises(ValueError, match="marks 'plain-mlp' randomized"):
        randomized_members(mlps, {"members": {"plain-mlp": _record(True, {})}})
    # autoattack_pool's stochastic= is checked before any work
    from sarjax.attacks.autoattack import autoattack_config, autoattack_pool

    x, y = np.zeros((2, 28, 28, 1), np.float32), np.zeros(2, np.int32)
    kw = dict(attack=autoattack_config("linf", 0.1, "rand"), key=jax.random.key(0))
    f = got["noise-mlp"][0]
    with pytest.raises(ValueError, match="needs version='rand'"):
        autoattack_pool(mlps, x, y, **{**kw, "attack": autoattack_config("linf", 0.1)}, stochastic={"noise-mlp": f})
    with pytest.raises(ValueError, match="not both"):
        autoattack_pool(mlps, x, y, stochastic={"noise-mlp": f}, wrap=lambda a: a, **kw)
    with pytest.raises(ValueError, match="lacks"):
        autoattack_pool(mlps, x, y, stochastic={"nope": f}, **kw)
    with pytest.raises(ValueError, match="non-empty dict"):
        autoattack_pool(mlps, x, y, stochastic={}, **kw)
    with pytest.raises(TypeError, match="callable"):
        autoattack_pool(mlps, x, y, stochastic={"noise-mlp": 3}, **kw)  # pyright: ignore[reportArgumentType]


def _run_cli(args):
    from sarjax.cli import main

    return main(["autoattack", *args])


def _check_eot_queries(out, n_members, n_samples):
    """Exact EOT accounting: clean 20 per pair; every APGD run on a still-robust pair pays its
    clean evaluation 20, 2 x 20 per gradient iteration (N + 1 of them), 20 for its final
    re-evaluation and 20 for the verification."""
    per_pair = EOT * (1 + 2 * (N_IT + 1) + 1 + 1)
    for s in out["stages"]:
        assert s["skipped"] == "" and s["queries"] == s["attacked"] * per_pair, s
    assert [s["name"] for s in out["stages"]] == ["apgd-ce", "apgd-dlr"]
    assert out["queries_total"] == EOT * n_members * n_samples + sum(s["queries"] for s in out["stages"])


def _mlp_pool(pool, tmp_path):
    only = tmp_path / "mlps"  # the MLP stack alone
    save_pool(
        Pool([pool.stacks[1]]),
        only,
        config={"members": {"plain-mlp": _record(False, {}), "noise-mlp": _record(True, {"inference_sigma": SIGMA})}},
    )
    return pool, only


def test_cli_rand_hands_the_randomized_members_to_autoattack(pool, tmp_path, capsys, monkeypatch):
    """The CLI's wiring, without running the attacks (the real run: the FULL tests below): it gives
    autoattack_pool the randomized members' deployed applies, and refuses a deterministic pool."""
    import sarjax.attacks.autoattack as aa

    seen = {}

    def fake(pool, x, y, *, attack, **kw):
        seen.update(kw, n=len(x), version=attack.version)
        names = tuple(kw["stochastic"] or pool.names)
        b, m = len(x), len(names)
        z = np.zeros((b, m), bool)
        return aa.AutoAttackResult(
            np.zeros((b, m, *x.shape[1:]), np.float32), z, z, np.zeros((b, m), np.int64),
            np.zeros((1, b, m), np.int64), z[None], (), attack.version, attack.norm, attack.eps, names, (),
        )  # fmt: skip

    monkeypatch.setattr(aa, "autoattack_pool", fake)
    pool, only = _mlp_pool(pool, tmp_path)
    out_path = tmp_path / "rand.json"
    rc = _run_cli(["--pool", str(only), "--norm", "linf", "--eps", "0.05", "--version", "rand", "--samples", "4",
                   "--out", str(out_path)])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "noise-mlp: randomized" in printed and "not attacked by the rand version" in printed
    assert seen["version"] == "rand" and seen["wrap"] is None and seen["n"] == 4
    assert list(seen["stochastic"]) == ["noise-mlp"]
    out = json.loads(out_path.read_text())
    assert out["deterministic_members_skipped"] == ["plain-mlp"]
    assert "sigma 0.25" in out["randomized_members"]["noise-mlp"]
    # --noise-sigma: every member behind that noise (wrap), no stochastic dict
    seen.clear()
    rc = _run_cli(["--pool", str(only), "--norm", "linf", "--eps", "0.05", "--version", "rand", "--samples", "4",
                   "--noise-sigma", "0.3", "--out", str(tmp_path / "rand_sigma.json")])  # fmt: skip
    assert rc == 0 and seen["stochastic"] is None and seen["wrap"] is not None
    # a deterministic pool is refused with the way out
    plain = tmp_path / "plain"
    save_pool(Pool([pool.stacks[1].select([0])]), plain, config={})
    capsys.readouterr()
    assert _run_cli(["--pool", str(plain), "--norm", "linf", "--eps", "0.1", "--version", "rand"]) == 2
    err = capsys.readouterr().err
    assert "is randomized" in err and "--noise-sigma" in err


@pytest.mark.skipif(
    not FULL,
    reason="SARJAX_AUTOATTACK_FULL=1: compiles APGD with EOT 20 (about a minute); the default "
    "test_cli_rand_hands_the_randomized_members_to_autoattack checks the same wiring without the attacks",
)
def test_cli_rand_attacks_the_noise_member_as_deployed(pool, tmp_path):
    _, only = _mlp_pool(pool, tmp_path)
    out_path = tmp_path / "rand.json"
    rc = _run_cli(["--pool", str(only), "--norm", "linf", "--eps", "0.05", "--version", "rand", "--samples", "4",
                   "--n-iter", str(N_IT), "--out", str(out_path)])  # fmt: skip
    assert rc == 0
    out = json.loads(out_path.read_text())
    assert out["version"] == "rand" and out["members"] == ["noise-mlp"]
    _check_eot_queries(out, 1, 4)
    assert out["stages"][0]["attacked"] > 0  # the centroid classifier gets some of the 4 right


@pytest.mark.skipif(
    not FULL,
    reason="SARJAX_AUTOATTACK_FULL=1: compiles EOT attacks through the self-ensemble's views; the default "
    "test_cli_rand_hands_the_randomized_members_to_autoattack checks the wiring without the attacks",
)
def test_cli_rand_attacks_the_self_ensemble_as_deployed(saved, tmp_path):
    out_path = tmp_path / "rand_se.json"
    rc = _run_cli(["--pool", str(saved), "--norm", "linf", "--eps", "0.1", "--version", "rand", "--samples", "4",
                   "--n-iter", str(N_IT), "--out", str(out_path)])  # fmt: skip
    assert rc == 0
    out = json.loads(out_path.read_text())
    assert out["members"] == ["self-ensemble", "noise-mlp"]
    assert "stochastic views" in out["randomized_members"]["self-ensemble"]
    _check_eot_queries(out, 2, 4)
