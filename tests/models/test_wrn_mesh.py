"""The vision pool mesh (sarjax.models.sharding, ``("pool", "data")``) on a converted WideResNet pool.

Known answer: the same pool on one device. Three DM-style WideResNet-10-2 members (SiLU, CIFAR-10
normalisation buffers inside the model; tests/models/_torch_nets.py) converted from PyTorch by
``Pool.from_torch``, on 8 fake CPU devices (a fresh process, tests/conftest.py), on the mesh
pool=2 x data=4 (the 3 members padded to 4, the batch of 6 images to 8): the logits and one step
of joint PGD (``make_joint_pgd``, 1 step, 1 restart, run through ``ShardedPool.attack``) are
compared with one device. Tolerance: logits within 1e-6 relative to their scale, PGD's x_adv
within 1e-6 and its success / queries exactly (not bit for bit: XLA:CPU picks its convolution
and dot kernels by batch size, so a shard of 2 images adds in another order than a batch of 8;
the test prints the measured maximum).
"""

import pathlib

import pytest

pytest.importorskip("torch")

HERE = pathlib.Path(__file__).resolve().parent

_BODY = """
import sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {here!r})
import torch
from _torch_nets import WideResNet, randomize_bn
from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.models.sharding import ShardedPool, make_mesh
jax.config.update("jax_disable_most_optimizations", True)   # compile-bound tiny shapes

mods = []
for seed in range(3):
    torch.manual_seed(seed)
    mods.append(randomize_bn(WideResNet(depth=10, width=2, base=4), seed=seed))
pool = Pool.from_torch(mods, input_shape=(32, 32, 3), verify=False)
assert pool.num_members == 3 and len(pool.stacks) == 1   # one architecture: one stack
x = np.random.default_rng(0).random((6, 32, 32, 3), dtype=np.float32)
ref_logits = np.asarray(pool.logits(x))
scale = float(np.abs(ref_logits).max())
labels = ref_logits[0].argmax(-1)
atk = make_joint_pgd(pool.apply, eps=8 / 255, steps=1, step=JointPGDStep(restarts=1))
key = jax.random.key(3)
ref = atk(pool.params, x, labels, key=key)
worst = 0.0
for p, d in ((2, 4),):
    sp = ShardedPool(pool, make_mesh(p, d))
    leaf = jax.tree.leaves(sp.params)[0]
    assert leaf.addressable_shards[0].data.shape[0] == 4 // p, leaf.sharding   # 3 + 1 padded members split over pool
    lg = sp.logits(x)
    err = float(np.abs(lg - ref_logits).max()) / scale
    worst = max(worst, err)
    assert err <= 1e-6, ((p, d), err)
    got = sp.attack(make_joint_pgd(sp.apply, eps=8 / 255, steps=1, step=JointPGDStep(restarts=1)), x, labels, key=key)
    np.testing.assert_allclose(np.asarray(got.x_adv), np.asarray(ref.x_adv), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got.success), np.asarray(ref.success))
    np.testing.assert_array_equal(np.asarray(got.queries), np.asarray(ref.queries))
assert np.abs(np.asarray(ref.x_adv) - x).max() > 1e-3   # the step moved the images
print("max relative |logits diff|", worst)
print("OK")
"""


def test_wrn_pool_on_a_pool_x_data_mesh_equals_one_device(run_on_fake_devices):
    out = run_on_fake_devices(_BODY.format(here=str(HERE)), timeout=600)
    assert "max relative |logits diff|" in out
