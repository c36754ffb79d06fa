"""The greedy drives a jitted JAX joint attack with fixed shapes: one trace for all rounds."""

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.cover import Candidates, greedy_sar

M, B, D, C = 6, 4, 5, 3
EPS = 0.35


def _pool():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((M, D, C)).astype(np.float32)
    x0 = rng.random((B, D), dtype=np.float32)
    return jnp.asarray(w), jnp.asarray(x0)


def _make_oracles(w, x0, traces):
    clean = jnp.argmax(jnp.einsum("bd,mdc->bmc", x0, w), axis=-1)  # [B, M]

    def member_losses(x, ref):  # x [D], ref [M] -> [M]
        logits = jnp.einsum("d,mdc->mc", x, w)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), ref[:, None], axis=1)[:, 0]

    def attack_one(x, ref, mask, key):
        def objective(z):
            losses = member_losses(z, ref)
            return jnp.sum(losses * mask) / jnp.maximum(mask.sum(), 1.0)

        # Random start in the ball, then one signed-gradient step (R+FGSM).
        start = jnp.clip(x + jax.random.uniform(key, x.shape, minval=-EPS, maxval=EPS) / 2, 0, 1)
        z = start + EPS * jnp.sign(jax.grad(objective)(start))
        z = jnp.clip(jnp.clip(z, x - EPS, x + EPS), 0.0, 1.0)
        logits = jnp.einsum("d,mdc->mc", z, w)
        covered = jnp.argmax(logits, -1) != ref
        queries = 2 * mask.sum().astype(jnp.int32) + M
        return z, covered, queries, member_losses(z, ref)

    @jax.jit
    def batched(masks, round_index):
        traces.append(1)  # runs once per trace
        keys = jax.vmap(lambda b: jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(1), round_index), b))(
            jnp.arange(B)
        )
        return jax.vmap(attack_one)(x0, clean, masks.astype(jnp.float32), keys)

    def joint(unc, r):
        out = batched(jnp.asarray(unc), jnp.asarray(r, jnp.int32))
        return Candidates(*(np.asarray(a) for a in out))

    def single(target, active, r):
        masks = jax.nn.one_hot(target, M, dtype=bool) & active[:, None]
        out = batched(jnp.asarray(masks), jnp.asarray(r + 1000, jnp.int32))
        return Candidates(*(np.asarray(a) for a in out))

    return joint, single


def test_jitted_joint_attack_traces_once_and_inputs_stay_in_ball():
    w, x0 = _pool()
    traces = []
    joint, single = _make_oracles(w, x0, traces)
    res = greedy_sar(joint, single, np.zeros((B, M), bool), [0.0, 0.5])
    assert res.num_rounds >= 2
    assert len(traces) == 1  # every round (and the fallback) reused one compiled kernel
    x = np.asarray(x0)
    for r in range(res.num_rounds):
        rec = res.recorded[r]
        dist = np.abs(res.inputs[r, rec] - x[rec]).max(axis=1)
        assert (dist <= EPS + 1e-6).all()
        # Re-evaluate the recorded inputs: they break what they were credited with.
        logits = np.einsum("bd,mdc->bmc", res.inputs[r, rec], np.asarray(w))
        clean = np.einsum("bd,mdc->bmc", x[rec], np.asarray(w)).argmax(-1)
        broken = logits.argmax(-1) != clean
        assert (broken | ~res.new_covered[r, rec]).all()
