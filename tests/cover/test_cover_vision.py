"""run_sar / make_attack_oracles on tiny MLP pools with the attacks module's joint PGD."""

import jax
import numpy as np
import pytest

from sarjax.cover import SARResult, greedy_sar

pytest.importorskip("sarjax.attacks.joint")

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd  # noqa: E402
from sarjax.models.pool import Pool, Stack  # noqa: E402
from sarjax.models.zoo import mlp  # noqa: E402
from sarjax.sar import SARSettings  # noqa: E402
from sarjax.sar.vision import make_attack_oracles, run_sar  # noqa: E402

ARCH = mlp((8,), input_shape=(4, 4, 1), num_classes=3)


def _pool(m, same=False):
    # Params drawn in numpy in the structure of ARCH.init (eval_shape compiles nothing;
    # a jitted init costs seconds of XLA compile on a loaded CPU).
    shapes = jax.eval_shape(ARCH.init, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: (rng.standard_normal((m,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32),
        shapes,
    )
    if same:
        params = jax.tree.map(lambda a: np.repeat(a[:1], m, axis=0), params)
    return Pool([Stack(ARCH, params, tuple(f"m{i}" for i in range(m)))])


_POOL3 = _pool(3)
_TRACES = []


def _counting_apply(params, xs):  # the Python body runs only while jax traces
    _TRACES.append(1)
    return _POOL3.apply(params, xs)


# One compiled joint PGD for every 3-member pool of ARCH in this file (params are
# arguments); every greedy below runs batches of 4 so the kernel compiles once.
_ATTACK3 = make_joint_pgd(_counting_apply, eps=0.5, steps=5, step=JointPGDStep(restarts=1))


def _images(b, seed=1):
    return np.random.default_rng(seed).random((b, 4, 4, 1), dtype=np.float32)


def test_identical_members_break_together():
    # A pool of copies shares every weakness: every candidate input breaks all
    # members or none, and a sample broken in round 0 has SAR = 1/M at every delta.
    pool = _pool(3, same=True)
    res = run_sar(pool, _images(4), 0.5, [0.0, 0.5], attack=_ATTACK3, key=jax.random.PRNGKey(0))
    for cov in (res.joint_covered, res.fallback_covered):
        assert (cov.all(axis=2) | ~cov.any(axis=2)).all()
    first = res.recorded[0]
    assert first.any()
    np.testing.assert_allclose(res.sar[first], 1 / 3)
    assert res.covered[first].all()


def test_oracles_reuse_one_kernel_and_inputs_break_credited_members():
    pool = _POOL3
    x = _images(4, seed=5)
    ref = pool.predict(x).T
    joint, single = make_attack_oracles(_ATTACK3, pool.params, x, ref, jax.random.PRNGKey(3), eps=0.25)
    after_first = []

    def joint_once(unc, r):
        out = joint(unc, r)
        after_first.append(len(_TRACES))
        return out

    res = greedy_sar(joint_once, single, np.zeros((4, 3), bool), [0.0, 0.5])
    assert res.num_rounds >= 2 and res.fallback_fired.any()
    assert after_first[0] > 0 and len(_TRACES) == after_first[0]  # no retrace after round 0
    for r in range(res.num_rounds):
        rec = res.recorded[r]
        if not rec.any():
            continue
        xa = res.inputs[r, rec]
        assert np.abs(xa - x[rec]).max() <= 0.25 + 1e-6
        broken = pool.predict(xa).T != ref[rec]
        assert (broken | ~res.new_covered[r, rec]).all()


def test_labels_mode_chunking_and_checkpoint(tmp_path):
    pool = _POOL3
    x = _images(7, seed=2)
    pred = pool.predict(x)  # [M, B]
    labels = pred[0].astype(np.int32)  # member 0 right by construction; others may be wrong
    kw = dict(labels=labels, attack=_ATTACK3, key=jax.random.PRNGKey(0))
    res = run_sar(pool, x, 0.2, [0.0, 1 / 3], settings=SARSettings(chunk_size=4, checkpoint_dir=tmp_path), **kw)
    assert res.batch_size == 7 and res.valid.all()
    np.testing.assert_array_equal(res.clean_broken, (pred != labels[None]).T)
    assert (tmp_path / "chunk_1" / "result" / "result.json").exists()
    again = run_sar(pool, x, 0.2, [0.0, 1 / 3], settings=SARSettings(chunk_size=4, checkpoint_dir=tmp_path), **kw)
    fresh = run_sar(pool, x, 0.2, [0.0, 1 / 3], settings=SARSettings(chunk_size=4), **kw)
    for other in (again, fresh):
        np.testing.assert_array_equal(other.sar, res.sar)
        np.testing.assert_array_equal(other.k_hat, res.k_hat)
    assert isinstance(SARResult.load(tmp_path / "chunk_0" / "result"), SARResult)


def test_run_sar_validation():
    pool = _POOL3
    with pytest.raises(ValueError, match="eps"):
        run_sar(pool, _images(2), 0.0, [0.0], key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="labels"):
        run_sar(pool, _images(2), 0.1, [0.0], labels=np.zeros(3, np.int32), key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        run_sar(pool, _images(2) + 2.0, 0.1, [0.0], key=jax.random.PRNGKey(0))
