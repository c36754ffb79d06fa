"""Converted residual nets on the whole batch, channels-last (sarjax.models.torch_convert): the graph
is exported with a symbolic batch, runs NHWC on CPU (``conv_impl="auto"``), and a pool's members are
unrolled; known answers: PyTorch's logits and the joint loss's input gradient from torch.autograd."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from _torch_nets import PreActResNet18, TinyResNet, WideResNet, randomize_bn
from torch import nn

from sarjax.models.pool import Pool
from sarjax.models.torch_convert import TorchStack, convert

warnings.filterwarnings("ignore", category=FutureWarning)


def _nchw(x):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))


def _torch_logits_and_grad(models, x, ref):
    """PyTorch's logits [M, B, C] and the input gradient (NHWC) of the members' summed cross-entropy."""
    tx = _nchw(x).requires_grad_(True)
    zt = torch.stack([m(tx) for m in models])
    loss = sum(
        F.cross_entropy(zt[i], torch.from_numpy(np.asarray(ref[i])).long(), reduction="sum") for i in range(len(models))
    )
    (gt,) = torch.autograd.grad(loss, tx)
    return zt.detach().numpy(), gt.numpy().transpose(0, 2, 3, 1)


def _joint_grad(pool, x, ref):
    def loss(x):
        logp = jax.nn.log_softmax(pool.apply(pool.params, x), -1)  # [M, B, C]
        return -jnp.take_along_axis(logp, ref[..., None], -1).sum()

    return jax.grad(loss)(x)


_NETS = {
    "tiny": (lambda: TinyResNet(in_ch=3, width=3), 8),
    "preact18": (lambda: PreActResNet18(width=2), 32),
    "wrn10": (lambda: WideResNet(depth=10, width=1, base=4), 32),
}


@pytest.mark.parametrize("net", list(_NETS))
def test_residual_pool_matches_pytorch_logits_and_input_gradient(net):
    make, size = _NETS[net]
    models = []
    for i in range(2):
        torch.manual_seed(i)
        models.append(randomize_bn(make(), seed=i))
    pool = Pool.from_torch(models, input_shape=(size, size, 3))
    (stack,) = pool.stacks
    assert stack.program.batched  # exported with a symbolic batch: the graph runs on [B, ...]
    if jax.default_backend() == "cpu":
        assert stack.program.resolved_conv_impl == "nhwc"
    x = jax.random.uniform(jax.random.PRNGKey(3), (3, size, size, 3))
    ref = jax.random.randint(jax.random.PRNGKey(4), (2, 3), 0, pool.num_classes)
    zt, gt = _torch_logits_and_grad(models, x, ref)
    np.testing.assert_allclose(np.asarray(pool.logits(x)), zt, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(_joint_grad(pool, x, ref)), gt, atol=1e-4, rtol=0)


@pytest.mark.parametrize("conv_impl", ["nhwc", "xla", "im2col"])
@pytest.mark.parametrize("batched", [True, False])
def test_every_lowering_and_the_per_example_vmap_agree_with_pytorch(conv_impl, batched):
    torch.manual_seed(0)
    m = randomize_bn(WideResNet(depth=10, width=1, base=4))
    prog, params = convert(m, (32, 32, 3), conv_impl=conv_impl)
    prog = dataclasses.replace(prog, batched=batched)
    x = jax.random.uniform(jax.random.PRNGKey(0), (2, 32, 32, 3))
    with torch.no_grad():
        zt = m(_nchw(x)).numpy()
    np.testing.assert_allclose(np.asarray(jax.jit(prog.apply)(params, x)), zt, atol=1e-4, rtol=0)


class _LayoutOps(nn.Module):
    """Ops the channels-last interpreter follows (pools, reductions, pads, broadcasts) and ops it
    hands NCHW tensors (reflect pad, cat, flatten), between convolutions."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=1)
        self.c2 = nn.Conv2d(8, 4, 1, stride=2)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4).view(4, 1, 1))
        self.fc = nn.Linear(4 * 2 * 2 + 4 + 4, 3)

    def forward(self, x):
        h = self.c1(x) * self.scale  # a [C, 1, 1] broadcast
        h = 1.0 - F.hardtanh(h)  # rsub with a scalar, an activation with scalar args
        h = F.max_pool2d(h, 3, stride=2, padding=1)  # overlapping windows: reduce_window
        h = F.pad(h, (1, 0, 0, 1)) + F.pad(h, (1, 1, 1, 1), mode="reflect")[..., 1:, :-1]
        h = torch.cat([h, F.avg_pool2d(h, 3, 1, 1, count_include_pad=False)], 1)
        h = F.gelu(self.c2(h))  # a strided 1x1 convolution on the concatenation
        a = F.adaptive_avg_pool2d(h, (2, 2)).flatten(1)
        return self.fc(torch.cat([a, h.mean((2, 3)), h.sum(1, keepdim=True).amax((2, 3)).expand(-1, 4)], 1))


@pytest.mark.parametrize("conv_impl", ["nhwc", "im2col"])
def test_channels_last_ops_match_pytorch_logits_and_input_gradient(conv_impl):
    torch.manual_seed(0)
    models = [_LayoutOps().eval(), _LayoutOps().eval()]
    pool = Pool.from_torch(models, input_shape=(9, 9, 2))
    (stack,) = pool.stacks
    prog = dataclasses.replace(stack.program, conv_impl=conv_impl)
    pool = Pool([TorchStack(prog, stack.params, stack.names)])
    x = jax.random.uniform(jax.random.PRNGKey(1), (3, 9, 9, 2))
    ref = jax.random.randint(jax.random.PRNGKey(2), (2, 3), 0, 3)
    zt, gt = _torch_logits_and_grad(models, x, ref)
    np.testing.assert_allclose(np.asarray(pool.logits(x)), zt, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(_joint_grad(pool, x, ref)), gt, atol=1e-5, rtol=0)


class _BatchSpecialised(nn.Module):
    """Reads the batch size as a Python int: ``torch.export`` cannot keep the batch symbolic."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 3, 3, padding=1), nn.Linear(3, 2)

    def forward(self, x):
        n = int(x.shape[0])
        return self.fc(F.relu(self.conv(x)).mean((2, 3)).view(n, 3))


def test_a_module_specialised_on_the_batch_falls_back_to_the_per_example_vmap():
    torch.manual_seed(0)
    m = _BatchSpecialised().eval()
    prog, params = convert(m, (6, 6, 1))
    assert not prog.batched
    x = jax.random.uniform(jax.random.PRNGKey(0), (4, 6, 6, 1))
    with torch.no_grad():
        zt = m(_nchw(x)).numpy()
    np.testing.assert_allclose(np.asarray(prog.apply(params, x)), zt, atol=1e-5, rtol=0)


class _BranchesOnOne(nn.Module):
    """Computes something else for a batch of one: torch.export traces a symbolic batch as not 1."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 3, 3, padding=1), nn.Linear(3, 2)

    def forward(self, x):
        h = self.fc(F.relu(self.conv(x)).mean((2, 3)))
        return h + 1.0 if x.shape[0] == 1 else h


def test_verification_checks_a_batch_of_one_on_a_symbolic_batch_graph():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="batch of 1"):
        convert(_BranchesOnOne().eval(), (6, 6, 1))


@pytest.mark.parametrize(
    "n, k, s, pad, d",
    [
        (9, 3, 1, (1, 1), 1),
        (9, 3, 2, (1, 2), 1),
        (8, 1, 2, (0, 0), 1),
        (10, 3, 2, (0, 1), 1),
        (9, 3, 1, (2, 2), 2),
        (7, 5, 3, (2, 1), 1),
        (8, 1, 1, (1, 1), 1),
    ],
)
def test_channels_last_convolution_gradients_equal_the_transpose_rule(n, k, s, pad, d):
    """The explicit input gradient (a convolution by the flipped kernel) against JAX's own rule."""
    from jax import lax

    from sarjax.models.torch_ops import _NHWC_DN, _conv_nhwc_xla

    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.random((2, n, n, 3)), jnp.float32)
    w = jnp.asarray(rng.random((k, k, 3, 4)), jnp.float32)
    pads = (pad, pad[::-1])

    def ref(a, w):
        y = lax.conv_general_dilated(a, w, (s, s), pads, rhs_dilation=(d, d), dimension_numbers=_NHWC_DN)
        return jnp.sum(jnp.sin(y))

    def got(a, w):
        return jnp.sum(jnp.sin(_conv_nhwc_xla(a, w, (s, s), pads, (d, d))))

    for g1, g2 in zip(jax.grad(ref, (0, 1))(a, w), jax.grad(got, (0, 1))(a, w), strict=True):
        np.testing.assert_allclose(np.asarray(g2), np.asarray(g1), atol=1e-5, rtol=1e-5)
