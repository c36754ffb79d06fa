"""RobustBench-style PyTorch models through the converter: logits equal PyTorch's within 1e-4
(PreActResNet-18 and a DM-style WideResNet, both normalising inside the model), and sarjax APGD-CE
on the converted model agrees with torchattacks' APGD on the same weights.

``SARJAX_TORCH_FULL=1`` adds RobustBench's own ``DMWideResNet`` (its architecture file, when the
``robustbench`` package is installed) and APGD on the PreActResNet-18 with 50 iterations.
"""

import importlib.util
import os
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from _torch_nets import Normalized, PreActResNet18, WideResNet, randomize_bn, smooth_images, whiten_head

from sarjax.attacks.apgd import APGDSchedule, make_apgd
from sarjax.models.torch_convert import convert

warnings.filterwarnings("ignore", category=FutureWarning)
FULL = os.environ.get("SARJAX_TORCH_FULL") == "1"

# Peer agreement of APGD-CE (linf, 1 restart, rho 0.75) on 64 images: robust counts may differ by
# at most 2 of 64. Both implementations follow AutoAttack's schedule, but their random starts differ
# (different RNGs) and float32 gradients are summed in another order, so a sample whose best loss
# sits at the decision boundary may flip; measured on this model: 0 differences at eps 2/4/8e-3 over
# 3 seeds each (47/32/12 robust of 64 on both sides). 2 of 64 (3 pp) leaves room for such flips and
# still fails for a wrong step size, projection or loss (those move the count by 5-20).
APGD_EPS = 0.004
APGD_TOL = 2


def _nchw(x):
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def _torch_logits(m, x):
    with torch.no_grad():
        return m.eval()(_nchw(x)).numpy()


@pytest.fixture(scope="module")
def wrn():
    """A WideResNet-10 (widths 4/4/8/16, SiLU, CIFAR-10 mean/std buffers) with a whitened head."""
    torch.manual_seed(0)
    m = randomize_bn(WideResNet(depth=10, width=1, base=4))
    whiten_head(m, m.logits, smooth_images(256, seed=1))
    prog, params = convert(m, (32, 32, 3))
    return m, prog, params


def test_preact_resnet18_logits_match_torch():
    torch.manual_seed(1)
    m = randomize_bn(Normalized(PreActResNet18(width=4)))
    prog, params = convert(m, (32, 32, 3))
    x = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(np.asarray(prog.jit_apply(params, x)), _torch_logits(m, x), atol=1e-4, rtol=0)


def test_wide_resnet_logits_match_torch_and_honour_normalisation(wrn):
    m, prog, params = wrn
    x = np.random.default_rng(0).random((8, 32, 32, 3), dtype=np.float32)
    got = np.asarray(prog.jit_apply(params, x))
    np.testing.assert_allclose(got, _torch_logits(m, x), atol=1e-4, rtol=0)
    # the non-persistent mean/std buffers are params of the converted model and are used
    np.testing.assert_allclose(np.asarray(params["mean"]).ravel(), [0.4914, 0.4822, 0.4465], rtol=1e-6)
    moved = jax.tree.map(lambda a: a, params)
    moved["mean"] = jnp.zeros_like(params["mean"])
    assert np.abs(np.asarray(prog.jit_apply(moved, x)) - got).max() > 1e-2


def _apgd_robust_counts(m, prog, params, x, eps, n_iter, seed=0):
    import torchattacks

    y = _torch_logits(m, x).argmax(-1)  # labels: the clean predictions, so clean accuracy is 100%
    atk = make_apgd(prog.apply, norm="linf", n_iter=n_iter, loss="ce", schedule=APGDSchedule(restarts=1))
    res = atk(params, jnp.asarray(x), jnp.asarray(y, jnp.int32), key=jax.random.PRNGKey(seed), eps=eps)
    ours = int((~np.asarray(res.best_success)[:, 0]).sum())
    t_atk = torchattacks.APGD(m, norm="Linf", eps=eps, steps=n_iter, n_restarts=1, loss="ce", rho=0.75, seed=seed)
    adv = t_atk(_nchw(x), torch.from_numpy(y).long())
    theirs = int((_torch_logits(m, adv.detach().permute(0, 2, 3, 1).numpy()).argmax(-1) == y).sum())
    return ours, theirs


@pytest.mark.skipif(
    os.environ.get("SARJAX_TORCH_FULL") != "1", reason="SARJAX_TORCH_FULL=1: ~22 s; the logits parity test stays"
)
def test_apgd_robust_accuracy_agrees_with_torchattacks(wrn):
    pytest.importorskip("torchattacks")
    m, prog, params = wrn
    x = smooth_images(64, seed=0)  # 8x8-pixel squares: random images whose predictions vary
    ours, theirs = _apgd_robust_counts(m, prog, params, x, APGD_EPS, n_iter=10)
    assert 8 <= theirs <= 56, f"eps should leave robust accuracy mid-range, torchattacks: {theirs}/64"
    assert abs(ours - theirs) <= APGD_TOL, (ours, theirs)


@pytest.mark.skipif(not FULL, reason="SARJAX_TORCH_FULL=1")
def test_full_apgd_preact_resnet18_agrees_with_torchattacks():
    pytest.importorskip("torchattacks")
    torch.manual_seed(2)
    m = randomize_bn(Normalized(PreActResNet18(width=4)))
    whiten_head(m, m.model.linear, smooth_images(256, seed=1))
    prog, params = convert(m, (32, 32, 3))
    x = smooth_images(64, seed=3)
    for eps in (0.002, 0.004):
        ours, theirs = _apgd_robust_counts(m, prog, params, x, eps, n_iter=50)
        print(f"PreActResNet-18 APGD-CE eps={eps}: sarjax {ours}/64, torchattacks {theirs}/64")
        assert abs(ours - theirs) <= APGD_TOL, (eps, ours, theirs)


@pytest.mark.skipif(not FULL, reason="SARJAX_TORCH_FULL=1")
def test_full_robustbench_dm_wide_resnet_file():
    spec = importlib.util.find_spec("robustbench")
    if spec is None or spec.origin is None:
        pytest.skip("robustbench is not installed")
    # import the architecture file alone: the package's __init__ imports torchvision (and its data
    # loaders), which may not match the installed torch
    path = pathlib.Path(spec.origin).parent / "model_zoo" / "architectures" / "dm_wide_resnet.py"
    mspec = importlib.util.spec_from_file_location("_rb_dm_wide_resnet", path)
    assert mspec is not None and mspec.loader is not None
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    torch.manual_seed(0)
    m = randomize_bn(mod.DMWideResNet(num_classes=10, depth=10, width=1, activation_fn=mod.Swish))
    prog, params = convert(m, (32, 32, 3))
    x = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(np.asarray(prog.jit_apply(params, x)), _torch_logits(m, x), atol=1e-4, rtol=0)
