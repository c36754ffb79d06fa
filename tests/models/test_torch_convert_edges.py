"""Edges of ``Pool.from_torch`` that used to convert silently into a wrong model or fail with an
error that did not say what to change: a custom ``torch.autograd.Function`` (sarjax would
differentiate its forward, not its backward) and an ``input_shape`` written in PyTorch's NCHW order."""

import warnings

import pytest

torch = pytest.importorskip("torch")
from _torch_nets import SmallCNN
from torch import nn

from sarjax.models.pool import Pool
from sarjax.models.torch_convert import convert

warnings.filterwarnings("ignore", category=FutureWarning)
_APPLY = torch.autograd.Function.__dict__["apply"]


class StraightThroughSquare(torch.autograd.Function):
    """Forward x**2, backward the identity (a straight-through estimator): PyTorch's input
    gradient is not the forward's derivative."""

    @staticmethod
    def forward(ctx, x):
        return x * x

    @staticmethod
    def backward(ctx, g):
        return g


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 12)

    def forward(self, x):
        return StraightThroughSquare.apply(self.fc(x))


class WithFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), Block())
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(self.body(x))


def test_custom_autograd_function_is_refused_by_name_and_module_path():
    m = WithFunction()
    with pytest.raises(ValueError, match=r"StraightThroughSquare.*module 'body\.1' \(Block\)") as e:
        Pool.from_torch([m], input_shape=(2, 2, 3))
    assert "\n" not in str(e.value)
    assert m.training  # the training flag is restored after the refusal
    assert torch.autograd.Function.__dict__["apply"] is _APPLY  # the recording hook is removed
    assert "apply" not in StraightThroughSquare.__dict__


class Checkpointed(nn.Module):
    """torch.utils.checkpoint's Function recomputes the forward in backward: its gradient is the
    forward's, so converting it is exact."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.fc, x.flatten(1), use_reentrant=True)


def test_torch_checkpoint_is_not_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (stack,) = Pool.from_torch([Checkpointed()], input_shape=(2, 2, 3)).stacks
    assert stack.num_classes == 3


def test_nchw_input_shape_is_named_with_the_nhwc_guess():
    m = SmallCNN(in_ch=1, width=2, classes=3, size=8)
    with pytest.raises(ValueError, match=r"NHWC order \(H, W, C\).*\(1, 8, 8\).*did you mean \(8, 8, 1\)\?") as e:
        Pool.from_torch([m], input_shape=(1, 8, 8))
    assert "\n" not in str(e.value)
    pool = Pool.from_torch([m], input_shape=(8, 8, 1))  # the suggestion converts
    assert pool.input_shape == (8, 8, 1)


def test_a_failing_module_without_an_nhwc_fix_keeps_its_own_error():
    m = SmallCNN(in_ch=3, width=2, classes=3, size=8)
    with pytest.raises(RuntimeError, match="channels"):  # (5, 8, 8) is wrong in either order
        convert(m, (5, 8, 8), verify=False)
