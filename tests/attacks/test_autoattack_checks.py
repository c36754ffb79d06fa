"""AutoAttack's sanity checks on a model that calls the host (``jax.pure_callback``): they warn
about the host call and name why the gradient cannot be taken, instead of crashing with JAX's
"Pure callbacks do not support JVP" (which they did in the zero-gradient check)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks.autoattack import AutoAttackSettings, autoattack, autoattack_config
from sarjax.attacks.autoattack_checks import AutoAttackWarning, sanity_checks

C = 5
W = np.random.default_rng(0).normal(size=(16, C)).astype(np.float32)


def _host_logits(x):
    return (np.asarray(x).reshape(x.shape[0], -1) @ W).astype(np.float32)


def host_model(params, x):
    """A linear model computed on the host: no differentiation rule."""
    del params
    out = jax.ShapeDtypeStruct((x.shape[0], C), jnp.float32)
    return jax.pure_callback(_host_logits, out, x, vmap_method="sequential")


@pytest.fixture(scope="module")
def batch():
    x = np.random.default_rng(1).uniform(0.3, 0.7, size=(4, 4, 4, 1)).astype(np.float32)
    return x, np.argmax(_host_logits(x), 1)


def test_sanity_checks_warn_on_a_pure_callback_model(batch):
    x, y = batch
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        msgs = sanity_checks(host_model, {}, x, y, key=jax.random.key(0))
    assert [str(w.message) for w in rec if issubclass(w.category, AutoAttackWarning)] == msgs
    assert any("calls the host inside apply (pure_callback)" in m for m in msgs)
    (grad,) = [m for m in msgs if "cannot differentiate" in m]
    assert "DLR loss" in grad and "Pure callbacks do not support JVP" in grad and "attacks=['square']" in grad
    assert "\n" not in grad


def test_autoattack_checks_true_on_a_pure_callback_model_runs_square(batch):
    x, y = batch
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        res = autoattack(
            host_model, {}, x, y, attack=autoattack_config("linf", 0.05, attacks=["square"], square_queries=5),
            key=jax.random.key(0), settings=AutoAttackSettings(checks=True, log=False),
        )  # fmt: skip
    got = [str(w.message) for w in rec if issubclass(w.category, AutoAttackWarning)]
    assert any("calls the host" in m for m in got) and any("cannot differentiate" in m for m in got)
    assert res.robust.shape == (4, 1)
