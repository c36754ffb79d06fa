"""AutoAttack's randomness check traces the model instead of calling it eagerly (issue 43, item 2):
randomness drawn on the host still shows, whether it enters at trace time (numpy in ``apply``:
the traces differ, the calls fall back to eager ones) or at run time (a host callback: one compiled
program, run ``n`` times)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.attacks.autoattack_checks import AutoAttackWarning, sanity_checks

W = np.random.default_rng(0).normal(size=(16, 10)).astype(np.float32)


def linear(p, x):
    return x.reshape(x.shape[0], -1) @ p["W"]


@pytest.fixture(scope="module")
def batch():
    x = np.random.default_rng(1).uniform(0.3, 0.7, size=(6, 4, 4, 1)).astype(np.float32)
    return {"W": jnp.asarray(W)}, x, np.argmax(x.reshape(6, -1) @ W, 1)


def _msgs(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        return sanity_checks(*args, key=jax.random.PRNGKey(0), **kw)


def test_host_noise_at_run_time_is_seen(batch):
    params, x, y = batch
    host = np.random.default_rng(2)

    def noise(shape):
        return host.normal(size=shape).astype(np.float32)

    def callback_noise(p, xx):  # the same traced program every time; the callback draws at each call
        eps = jax.pure_callback(lambda: noise(xx.shape), jax.ShapeDtypeStruct(xx.shape, jnp.float32))
        return linear(p, xx + eps)

    msgs = _msgs(callback_noise, params, x, y)
    assert any("randomized defense" in m for m in msgs), msgs
    assert any("calls the host" in m for m in msgs), msgs


def test_host_state_at_trace_time_is_seen(batch):
    params, x, y = batch
    calls = []

    def drifting(p, xx):  # a Python counter: every trace (and every eager call) differs
        calls.append(1)
        return linear(p, xx).at[:, 0].add(0.5 * len(calls))

    assert any("randomized defense" in m for m in _msgs(drifting, params, x, y))
    assert len(calls) >= 10  # traced 5 times, then called 5 times eagerly (the traces differed)


def test_a_deterministic_model_is_quiet_and_a_rand_model_is_checked_per_key(batch):
    params, x, y = batch
    assert _msgs(linear, params, x, y) == []

    def noisy(p, xx, k):
        return linear(p, xx + 0.1 * jax.random.normal(k, xx.shape))

    msgs = _msgs(noisy, params, x, y, version="rand")
    assert not any("deterministic" in m or "SAME key" in m for m in msgs), msgs
    msgs = _msgs(lambda p, xx, k: linear(p, xx), params, x, y, version="rand")
    assert any("looks deterministic" in m for m in msgs), msgs
