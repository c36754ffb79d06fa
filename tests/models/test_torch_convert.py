"""The torch.export converter (sarjax.models.torch_convert) against PyTorch itself: every op family
on small modules (logits within 1e-5), channels-first inputs, grouping by architecture, and the
errors (an unsupported op named with its module path, buffer updates, a failed verification)."""

import warnings

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from _torch_nets import SmallCNN, randomize_bn
from torch import nn

from sarjax.models import torch_ops
from sarjax.models.torch_convert import convert, convert_many

warnings.filterwarnings("ignore", category=FutureWarning)


def _torch_logits(m, x_nhwc):
    with torch.no_grad():
        return m.eval()(torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2)))).numpy()


class ConvPools(nn.Module):
    """Convolutions (stride, padding, dilation, groups, 1x1), every pooling mode, the paddings."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 6, 3, stride=2, padding=2, dilation=2)
        self.b = nn.Conv2d(6, 6, 3, padding=1, groups=3, bias=False)
        self.c = nn.Conv2d(6, 4, 1)
        self.fc = nn.Linear(4 * (1 + 4 + 9 + 9 + 4) + 6, 5)

    def forward(self, x):
        h = self.c(self.b(F.pad(self.a(x), (1, 0, 0, 1), mode="reflect")))  # [B, 4, 6, 6]
        h = F.pad(h, (1, 1, 1, 1), mode="replicate")  # 8 x 8
        p1 = F.max_pool2d(h, 3, stride=2, padding=1, ceil_mode=True, dilation=1)  # 4 x 4
        p2 = F.avg_pool2d(h, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        p3 = F.avg_pool2d(F.pad(h, (0, 1, 0, 1), value=0.5), 3, stride=3, padding=1)  # 3 x 3
        p4 = F.adaptive_avg_pool2d(h[:, :, :7, :7], 3)  # windows overlap: 7 -> 3
        p5 = F.max_pool2d(h, 2, dilation=2, stride=3)  # 2 x 2
        parts = [F.adaptive_avg_pool2d(p1, 1), p2[:, :, ::2, ::2], p3, p4, p5]
        z = torch.cat([q.flatten(1) for q in parts] + [self.a(x).amax(dim=(2, 3))], dim=1)
        return self.fc(z)


class Elementwise(nn.Module):
    """Activations, arithmetic with tensors and scalars, shapes, norms, reductions, softmax."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([2.0, 0.5, -1.0]).view(3, 1, 1))
        self.ln = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(2, 4)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(24, 7)

    def forward(self, x):
        x = (x - 0.5) * self.scale / 0.3
        acts = [
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
            F.silu(x),
            torch.tanh(x),
            torch.sigmoid(x),
            F.leaky_relu(x, 0.2),
            F.hardtanh(x, -0.5, 0.7),
            F.elu(x),
            F.softplus(x, beta=2.0, threshold=1.0),
            F.hardswish(x),
            torch.clamp(x, min=-0.2),
        ]
        h = sum(a * (i + 1) for i, a in enumerate(acts)) / 10.0
        g = self.gn(self.conv(h))  # [B, 4, 8, 8]
        t = self.ln(g.transpose(2, 3).permute(0, 1, 3, 2))  # the same layout, layer-normed over W
        a, b = torch.split(t.mean(dim=(1, 2)), [5, 3], dim=1)  # [B, 5], [B, 3]
        s = torch.softmax(g.sum(dim=(2, 3)), dim=-1) - torch.log_softmax(g.mean(dim=(2, 3)), dim=1)
        e = s.unsqueeze(-1).expand(-1, -1, 3).reshape(s.shape[0], -1)  # [B, 12]
        z = torch.cat([a, b.neg(), torch.sqrt(e.abs() + 1.0), e.exp().div(3.0) - 1.0], dim=1)  # [B, 32]
        return self.fc(z[:, :24] - torch.rsqrt(z[:, 8:].pow(2) + 1.0)) + torch.relu(z[:, :7]).sum(1, keepdim=True)


class FlatMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 16), nn.Dropout(0.5), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x.view(x.size(0), -1))


@pytest.mark.parametrize(
    "make, conv_impl",
    [(ConvPools, "im2col"), (ConvPools, "xla"), (Elementwise, "auto")],
    ids=["conv_pool_im2col", "conv_pool_xla", "elementwise"],
)
def test_ops_match_torch(make, conv_impl):
    torch.manual_seed(0)
    m = make()
    for p in m.parameters():  # non-trivial norm affine params
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    prog, params = convert(m, (8, 8, 3), conv_impl=conv_impl)
    x = np.random.default_rng(1).random((3, 8, 8, 3), dtype=np.float32)
    got = np.asarray(prog.jit_apply(params, x))
    ref = _torch_logits(m, x)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_channels_first_input_and_dropout_in_eval():
    torch.manual_seed(0)
    m = FlatMLP().train()  # converted in eval mode whatever its flag; the flag is restored
    prog, params = convert(m, (3, 4), channels_last=False)
    assert m.training and not prog.channels_last and prog.num_classes == 4
    x = np.random.default_rng(0).random((5, 3, 4), dtype=np.float32)
    with torch.no_grad():
        ref = m.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(prog.apply(params, x)), ref, atol=1e-6)


def test_params_are_the_modules_state_in_float32():
    m = randomize_bn(SmallCNN(width=2))
    prog, params = convert(m, (8, 8, 3), verify=False)
    sd = m.state_dict()
    assert set(params) == {"conv1", "bn1", "conv2", "bn2", "fc"}
    assert "num_batches_tracked" not in params["bn1"]  # unused by the eval graph
    np.testing.assert_array_equal(np.asarray(params["bn2"]["running_var"]), sd["bn2.running_var"].numpy())
    assert all(l.dtype == np.float32 for l in jax.tree.leaves(params))
    assert prog.param_shapes["conv1.weight"] == (2, 3, 3, 3)


def test_convert_many_groups_by_graph():
    torch.manual_seed(0)
    mods = [SmallCNN(width=2), SmallCNN(width=3), SmallCNN(width=2)]
    groups = convert_many(mods, (8, 8, 3), verify=False)
    assert [g.indices for g in groups] == [(0, 2), (1,)]
    assert groups[0].params["conv1"]["weight"].shape == (2, 2, 3, 3, 3)
    np.testing.assert_array_equal(np.asarray(groups[0].params["fc"]["bias"][1]), mods[2].fc.bias.detach().numpy())
    assert groups[0].program.signature != groups[1].program.signature


class Cumsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))

    def forward(self, x):
        return torch.cumsum(self.body(x), dim=1)


def test_unsupported_op_raises_naming_op_and_place():
    with pytest.raises(NotImplementedError, match=r"aten\.cumsum.*graph node 'cumsum'.*torch\.cumsum"):
        convert(Cumsum(), (2, 2, 3))


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        self.calls.add_(1.0)
        return self.fc(x)


def test_buffer_update_in_forward_is_refused():
    with pytest.raises(NotImplementedError, match="BUFFER_MUTATION"):
        convert(Counter(), (3,))


def test_bad_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        convert(lambda x: x, (3,))
    with pytest.raises(ValueError, match="input_shape"):
        convert(FlatMLP(), (0, 4))
    with pytest.raises(ValueError, match=r"logits \[B, C\]"):
        convert(nn.Identity(), (2, 2, 3))


def test_verification_catches_a_wrong_op(monkeypatch):
    m = randomize_bn(SmallCNN(width=2))
    monkeypatch.setitem(torch_ops.ATEN_OPS, "relu", lambda x: x)  # a wrong handler
    with pytest.raises(ValueError, match="disagrees with PyTorch"):
        convert(m, (8, 8, 3))
