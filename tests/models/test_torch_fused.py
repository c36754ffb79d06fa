"""Converted PyTorch CNNs on the zoo's fused pool kernel (sarjax.models.torch_fused): which graphs
match, and the fused stack against PyTorch itself (logits, and the joint loss's input gradient
from torch.autograd)."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from _torch_nets import randomize_bn
from torch import nn

from sarjax.models.pool import Pool
from sarjax.models.torch_convert import TorchStack, convert
from sarjax.models.torch_fused import match_cnn

warnings.filterwarnings("ignore", category=FutureWarning)


class ZooCNN(nn.Module):
    """conv-(BN)-ReLU-maxpool x 2, flatten, linear-ReLU-linear: the zoo's ``cnn`` layout."""

    def __init__(self, cin=1, widths=(4, 6), k=3, dense=12, classes=5, bn=True, bias=True, flatten="module"):
        super().__init__()
        layers, c = [], cin
        for w in widths:
            layers.append(nn.Conv2d(c, w, k, padding=k // 2, bias=bias))
            if bn:
                layers.append(nn.BatchNorm2d(w))
            layers += [nn.ReLU(), nn.MaxPool2d(2)]
            c = w
        self.features = nn.Sequential(*layers)
        self.flatten = flatten
        self.fc1, self.fc2 = nn.LazyLinear(dense), nn.Linear(dense, classes)

    def forward(self, x):
        h = self.features(x)
        h = torch.flatten(h, 1) if self.flatten == "function" else h.reshape(h.shape[0], -1)
        return self.fc2(F.relu(self.fc1(h)))


def _members(n, size=8, **kw):
    out = []
    for i in range(n):
        torch.manual_seed(i)
        m = ZooCNN(**kw)
        m(torch.zeros(1, kw.get("cin", 1), size, size))  # materialize the lazy layer
        out.append(randomize_bn(m, seed=i))
    return out


def _nchw(x):
    return torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"bn": False, "flatten": "function"},
        {"bias": False, "k": 5, "widths": (3, 4, 5), "cin": 2},
    ],
)
def test_fused_torch_pool_matches_pytorch_logits_and_input_gradient(kw):
    size = 8 if len(kw.get("widths", (0, 0))) == 2 else 16
    models = _members(3, size=size, **kw)
    cin = kw.get("cin", 1)
    pool = Pool.from_torch(models, input_shape=(size, size, cin))
    (stack,) = pool.stacks
    match = stack.program.fused_cnn
    assert match is not None and match.arch.conv_impl == "fused"
    assert match.arch.widths == tuple(kw.get("widths", (4, 6))) and match.arch.kernel == kw.get("k", 3)
    x = jax.random.uniform(jax.random.PRNGKey(0), (5, size, size, cin))
    ref = jnp.asarray(np.random.default_rng(0).integers(0, 5, (3, 5)))
    # known answer: PyTorch's logits and the input gradient of the summed cross-entropy
    tx = _nchw(x).requires_grad_(True)
    zt = torch.stack([m(tx) for m in models])
    loss_t = sum(F.cross_entropy(zt[i], torch.from_numpy(np.asarray(ref[i])).long(), reduction="sum") for i in range(3))
    (gt,) = torch.autograd.grad(loss_t, tx)
    z = pool.logits(x)
    np.testing.assert_allclose(np.asarray(z), zt.detach().numpy(), atol=1e-4, rtol=0)

    def loss(x):
        logp = jax.nn.log_softmax(pool.apply(pool.params, x), -1)  # [M, B, C]
        return -jnp.take_along_axis(logp, ref[..., None], -1).sum()

    g = jax.grad(loss)(x)
    np.testing.assert_allclose(np.asarray(g), gt.numpy().transpose(0, 2, 3, 1), atol=1e-4, rtol=0)


def test_fused_torch_pool_params_gradient_equals_the_op_by_op_graph():
    """Gradients in the params (training) go through the folded mapping back to the PyTorch params."""
    models = _members(2)
    pool = Pool.from_torch(models, input_shape=(8, 8, 1))
    (stack,) = pool.stacks
    generic = Pool([TorchStack(dataclasses.replace(stack.program, conv_impl="im2col"), stack.params, stack.names)])
    assert generic.stacks[0].program.fused_cnn is None
    x = jax.random.uniform(jax.random.PRNGKey(1), (3, 8, 8, 1))
    g = jax.grad(lambda p: jnp.sin(pool.apply(p, x)).sum())(pool.params)
    g2 = jax.grad(lambda p: jnp.sin(generic.apply(p, x)).sum())(generic.params)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


class _Strided(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc1, self.fc2 = (
            nn.Conv2d(1, 4, 3, stride=2, padding=1),
            nn.Linear(4 * 2 * 2, 6),
            nn.Linear(6, 3),
        )

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))))


class _NoHidden(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc1, self.fc2 = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4 * 4 * 4, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = F.relu(self.conv(x))
        h = F.max_pool2d(h + x, 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


@pytest.mark.parametrize("cls", [_Strided, _NoHidden, _Residual])
def test_other_graphs_keep_the_op_by_op_path(cls):
    torch.manual_seed(0)
    m = cls().eval()
    prog, _ = convert(m, (8, 8, 1))
    assert match_cnn(prog) is None and prog.fused_cnn is None
    pool = Pool.from_torch([m, m], input_shape=(8, 8, 1))
    x = jax.random.uniform(jax.random.PRNGKey(0), (2, 8, 8, 1))
    with torch.no_grad():
        zt = m(_nchw(x)).numpy()
    np.testing.assert_allclose(np.asarray(pool.logits(x))[1], zt, atol=1e-5, rtol=0)


def test_explicit_conv_impl_keeps_the_op_by_op_path():
    (m,) = _members(1)
    prog, _ = convert(m, (8, 8, 1), conv_impl="im2col")
    assert prog.fused_cnn is None
    assert convert(m, (8, 8, 1))[0].fused_cnn is not None


def test_odd_map_before_a_pool_is_not_matched():
    (m,) = _members(1, size=6)  # 6 -> 3: the second pool sees an odd map
    prog, _ = convert(m, (6, 6, 1))
    assert match_cnn(prog) is None
