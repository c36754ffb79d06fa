"""Custom ``torch.autograd.Function`` detection under both layouts of ``Function.apply``.

torch <= 2.13 defines ``torch.autograd.Function.apply`` as a Python ``classmethod``; torch 2.14 installs
the C ``classmethod_descriptor`` of ``torch._C._FunctionBase`` there (no ``__func__``), and the
converter's recorder raised ``AttributeError: 'classmethod_descriptor' object has no attribute
'__func__'`` on every module that ran a Function (``torch.utils.checkpoint`` included) instead of the
documented ``ValueError``.  The ``"c_descriptor"`` case puts torch 2.14's layout in place on whatever
torch is installed (the descriptor exists in 2.13 too), so the regression is caught by the pinned CI
torch as well as by the newest-torch step of ``.ci/run``.
"""

import types
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import jax
import jax.numpy as jnp
from torch import nn

from sarjax.models.pool import Pool
from sarjax.models.torch_convert import convert

_INSTALLED = torch.autograd.Function.__dict__["apply"]  # what this torch defines
_C_APPLY = torch._C._FunctionBase.__dict__["apply"]  # torch 2.14's Function.apply


@pytest.fixture(params=["installed", "c_descriptor"])
def apply_layout(request, monkeypatch):
    """Run the test with this torch's ``Function.apply`` and with torch 2.14's C descriptor."""
    assert isinstance(_C_APPLY, types.ClassMethodDescriptorType)
    if request.param == "c_descriptor":
        monkeypatch.setattr(torch.autograd.Function, "apply", _C_APPLY)
    expected = torch.autograd.Function.__dict__["apply"]
    yield expected
    assert torch.autograd.Function.__dict__["apply"] is expected  # the converter put it back


class StraightThroughSign(torch.autograd.Function):
    """Forward sign(x), backward the identity: PyTorch's input gradient is not the forward's."""

    @staticmethod
    def forward(ctx, x):
        return torch.sign(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Binarized(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(StraightThroughSign.apply(self.fc(x.flatten(1))))


def test_custom_function_raises_the_documented_value_error(apply_layout):
    with pytest.raises(ValueError, match=r"torch\.autograd\.Function .*StraightThroughSign called in module '<root>'"):
        Pool.from_torch([Binarized()], input_shape=(2, 2, 3))
    assert "apply" not in StraightThroughSign.__dict__


class Checkpointed(nn.Module):
    """A tanh layer under ``torch.utils.checkpoint`` (reentrant: a ``torch.autograd.Function``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(lambda t: torch.tanh(self.fc(t)), x.flatten(1), use_reentrant=True)
        return self.head(h)


def test_checkpoint_converts_with_torchs_logits_and_input_gradient(apply_layout):
    torch.manual_seed(0)
    m = Checkpointed().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program, params = convert(m, (2, 2, 3), verify=False)
    x = np.random.default_rng(0).uniform(size=(4, 2, 2, 3)).astype(np.float32)  # NHWC
    w = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)  # a fixed cotangent

    xt = torch.tensor(x).permute(0, 3, 1, 2).contiguous().requires_grad_(True)
    logits_t = m(xt)
    (logits_t * torch.tensor(w)).sum().backward()
    assert xt.grad is not None
    grad_t = xt.grad.permute(0, 2, 3, 1).numpy()

    with jax.default_matmul_precision("highest"):
        logits_j = program.apply(params, jnp.asarray(x))
        grad_j = jax.grad(lambda z: jnp.sum(program.apply(params, z) * w))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(logits_j), logits_t.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grad_j), grad_t, rtol=1e-5, atol=1e-5)
    assert np.abs(grad_t).max() > 1e-3  # the gradient compared is not zero


def test_an_apply_of_another_kind_is_refused_not_skipped(monkeypatch):
    """A future torch whose ``Function.apply`` is neither kind: the converter cannot record the
    Functions a module runs, so it refuses to convert rather than convert unchecked."""
    monkeypatch.setattr(torch.autograd.Function, "apply", staticmethod(lambda *a, **k: None))
    with pytest.raises(TypeError, match=r"torch\.autograd\.Function\.apply is a staticmethod"):
        convert(Binarized(), (2, 2, 3), verify=False)
