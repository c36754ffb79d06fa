"""Pools of converted PyTorch modules (kind "torch"): logits equal a per-member PyTorch loop, a
heterogeneous pool (zoo CNN + linen CNN + nnx MLP + torch CNNs) runs joint PGD and run_sar with
the torch members' outcomes confirmed by PyTorch itself, and a checkpoint round trip through the
user's module builders in a fresh process is bit-identical."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from _flax_nets import CLASSES, SHAPE, LinenCNN, linen_variables, nnx_member
from _torch_nets import Normalized, SmallCNN, TinyResNet, randomize_bn, whiten_head

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models import zoo
from sarjax.models.pool import Pool, Stack
from sarjax.models.torch_convert import TorchStack
from sarjax.sar.vision import run_sar

warnings.filterwarnings("ignore", category=FutureWarning)
HERE = Path(__file__).parent


def _modules():
    """2 CNNs with batch norm, 1 CNN normalising its input, 1 residual net: 3 architectures."""
    torch.manual_seed(0)
    cnn = [randomize_bn(SmallCNN(in_ch=1, width=2, classes=CLASSES, size=8), seed=i) for i in range(2)]
    norm = randomize_bn(Normalized(SmallCNN(in_ch=1, width=2, classes=CLASSES, size=8), mean=(0.3,), std=(0.2,)), 7)
    res = randomize_bn(TinyResNet(in_ch=1, width=3, classes=CLASSES), seed=9)
    x = np.random.default_rng(5).random((64, *SHAPE), dtype=np.float32)
    for i, (m, head) in enumerate([(cnn[0], cnn[0].fc), (cnn[1], cnn[1].fc), (norm, norm.model.fc), (res, res.head)]):
        whiten_head(m, head, x, seed=i)  # predictions that vary with the input (and attacks that can flip them)
    return [cnn[0], norm, cnn[1], res]


def _torch_logits(modules, x):
    xt = torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))
    with torch.no_grad():
        return np.stack([m.eval()(xt).numpy() for m in modules])


@pytest.fixture(scope="module")
def torch_pool():
    mods = _modules()
    return mods, Pool.from_torch(mods, input_shape=SHAPE)


def test_pool_equals_per_member_torch_loop(torch_pool):
    mods, pool = torch_pool
    assert [type(s) for s in pool.stacks] == [TorchStack] * 3
    assert [s.name for s in pool.stacks] == ["SmallCNN", "Normalized", "TinyResNet"]
    assert pool.names == ("SmallCNN/0", "SmallCNN/2", "Normalized/1", "TinyResNet/3")  # grouped by graph
    x = np.random.default_rng(0).random((5, *SHAPE), dtype=np.float32)
    want = _torch_logits([mods[0], mods[2], mods[1], mods[3]], x)
    np.testing.assert_allclose(np.asarray(pool.logits(x)), want, atol=1e-4, rtol=0)
    assert np.abs(want[0] - want[1]).max() > 1e-2  # members differ


@pytest.mark.skipif(
    os.environ.get("SARJAX_TORCH_FULL") != "1",
    reason="SARJAX_TORCH_FULL=1: joint PGD + run_sar on a torch pool, ~60 s; the joint/SAR paths stay covered by tests/attacks/test_attacks_joint.py and tests/cover",
)
def test_heterogeneous_pool_joint_pgd_and_sar(torch_pool):
    mods, tpool = torch_pool
    arch = zoo.cnn(channels=(2,), dense=4, input_shape=SHAPE, num_classes=CLASSES)
    zoo_pool = Pool([Stack.from_keys(arch, jax.random.split(jax.random.key(0), 1))])
    linen = LinenCNN()
    pool = Pool.concat(
        zoo_pool,
        Pool.from_flax(linen, [linen_variables(linen, 0)], input_shape=SHAPE),
        Pool.from_nnx([nnx_member(0)], input_shape=SHAPE),
        tpool,
    )
    m = pool.num_members
    assert m == 7 and [s.kind for s in pool.stacks] == ["zoo", "linen", "nnx", "torch", "torch", "torch"]
    torch_members = [mods[0], mods[2], mods[1], mods[3]]  # tpool's member order
    x = np.random.default_rng(1).random((6, *SHAPE), dtype=np.float32)
    clean = np.argmax(np.asarray(pool.logits(x)), -1)  # [M, B]
    attack = make_joint_pgd(pool.apply, eps=0.3, steps=5, step=JointPGDStep(restarts=1))
    res = attack(pool.params, jnp.asarray(x), jnp.asarray(clean.T, jnp.int32), key=jax.random.key(1))
    assert res.success.shape == (6, m)
    # the torch members' success flags are what PyTorch itself predicts at x_adv
    adv_pred = _torch_logits(torch_members, res.x_adv).argmax(-1)  # [4, B]
    np.testing.assert_array_equal(np.asarray(res.success)[:, 3:], (adv_pred != clean[3:]).T)
    assert np.asarray(res.success).any()

    sar = run_sar(pool, x, 0.3, [0.0, 0.5], attack=attack, key=jax.random.key(2))
    assert sar.sar.shape == (6, 2) and np.all((sar.sar >= 1 / m) & (sar.sar <= 1))
    # every torch member covered in round r is broken, per PyTorch, by the input recorded in round r
    checked = 0
    for b, j in zip(*np.nonzero(sar.covered_round[:, 3:] >= 0)):
        r = sar.covered_round[b, 3 + j]
        pred = _torch_logits([torch_members[j]], sar.inputs[r, b][None])[0, 0].argmax()
        assert pred != clean[3 + j, b]
        checked += 1
    assert checked > 0


@pytest.mark.skipif(
    os.environ.get("SARJAX_TORCH_FULL") != "1",
    reason="SARJAX_TORCH_FULL=1: a fresh Python process, ~25 s; the in-process round trip stays in tests/models/test_stack_ckpt.py",
)
def test_checkpoint_round_trip_with_builders_in_a_fresh_process(torch_pool, tmp_path):
    from sarjax.models.checkpoint import CheckpointError, load_pool, save_pool

    _, pool = torch_pool
    save_pool(pool, tmp_path / "pool")
    x = np.random.default_rng(3).random((4, *SHAPE), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", np.asarray(pool.logits(x)))
    script = textwrap.dedent(
        f"""
        import sys, warnings
        warnings.filterwarnings("ignore")
        sys.path.insert(0, {str(HERE)!r})
        import numpy as np
        from _torch_nets import Normalized, SmallCNN, TinyResNet
        from sarjax.models.checkpoint import load_pool
        builders = {{
            "SmallCNN": lambda: SmallCNN(in_ch=1, width=2, classes={CLASSES}, size=8),
            "Normalized": lambda: Normalized(SmallCNN(in_ch=1, width=2, classes={CLASSES}, size=8), mean=(0.,), std=(1.,)),
            "TinyResNet": lambda: TinyResNet(in_ch=1, width=3, classes={CLASSES}),
        }}
        pool, _ = load_pool({str(tmp_path / "pool")!r}, builders=builders)
        got = np.asarray(pool.logits(np.load({str(tmp_path / "x.npy")!r})))
        want = np.load({str(tmp_path / "want.npy")!r})
        print(list(pool.names), bool(np.array_equal(got, want)))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    names, same = r.stdout.strip().rsplit(" ", 1)
    assert json.loads(names.replace("'", '"')) == list(pool.names) and same == "True"
    # a missing builder is named
    with pytest.raises(CheckpointError, match="named 'Normalized'"):
        load_pool(tmp_path / "pool", builders={"SmallCNN": lambda: SmallCNN(in_ch=1, width=2, classes=CLASSES)})
    # a builder of another architecture is refused, naming the stack
    with pytest.raises(CheckpointError, match=r"stack 0 \(SmallCNN\).*cannot export"):
        load_pool(tmp_path / "pool", builders={"SmallCNN": lambda: SmallCNN(in_ch=3, width=2, classes=CLASSES)})
