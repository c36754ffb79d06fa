"""The FLOP count behind the joint-PGD throughput benchmark's machine ceiling.

``benchmarks/joint_attack_throughput.py`` turns the machine's matmul peak into a ceiling with
:func:`sarjax.models.flops.step_flops` (one member, one sample, forward + gradient to the
input).  If the count were too low, the ceiling would be too high and the other way round, so
check it against XLA's own cost analysis of the same computation and against a count by hand.
"""

import jax
import jax.numpy as jnp
import pytest

from sarjax.models import zoo
from sarjax.models.flops import step_flops


def _xla_flops(fn, x):
    cost = jax.jit(fn).lower(x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def test_mlp_step_flops_by_hand_and_by_xla():
    arch = zoo.mlp((256, 128))
    macs = 784 * 256 + 256 * 128 + 128 * 10
    assert step_flops(arch) == 2 * 2 * macs == 939_008
    p = arch.init(jax.random.PRNGKey(0))
    x = jnp.zeros((1, 28, 28, 1))
    grad = _xla_flops(jax.grad(lambda x: jax.nn.logsumexp(arch.apply(p, x)).sum()), x)
    # XLA also counts the bias adds, ReLUs and the loss: a few hundred FLOPs more
    assert step_flops(arch) <= grad <= 1.01 * step_flops(arch)


def test_cnn_step_flops_by_hand_and_by_xla():
    arch = zoo.cnn((16, 32), dense=128, kernel=3, conv_impl="xla")
    macs = 28 * 28 * 9 * 1 * 16 + 14 * 14 * 9 * 16 * 32 + 7 * 7 * 32 * 128 + 128 * 10
    assert step_flops(arch) == 2 * 2 * macs
    p = arch.init(jax.random.PRNGKey(0))
    x = jnp.zeros((1, 28, 28, 1))
    grad = _xla_flops(jax.grad(lambda x: jax.nn.logsumexp(arch.apply(p, x)).sum()), x)
    # the count includes the taps on the zero padding of the "same" convolutions, which XLA's
    # cost analysis leaves out: XLA's figure is a few percent lower, never higher
    assert 0.9 * step_flops(arch) <= grad <= step_flops(arch)


def test_step_flops_rejects_unknown_family():
    with pytest.raises(ValueError, match="resnet"):
        step_flops(zoo.resnet())
