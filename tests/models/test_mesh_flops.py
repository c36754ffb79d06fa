"""A pool on a ``pool x data`` mesh does 1 / (pool x data) of the work per device, and the same math.

Known answer: XLA's cost analysis of the compiled program counts the FLOPs of ONE device's
program (a data-parallel matmul counts 1/8 of the global on 8 devices; checked first). A
``ShardedPool`` of 8 CNN members (XLA convolutions: vmapped, they become grouped convolutions)
on ``pool=4 x data=2`` must then count at most 1/6 of the one-device FLOPs for the loss and its
input gradient (ideal: 1/8), and so must ``sarjax plan``'s joint-PGD step program of a
WideResNet pool. Before ``mesh_stack_apply`` (``jax.shard_map``), XLA's sharding propagation
all-gathered the batch in front of every grouped convolution and computed the whole pool on every
device: the per-device FLOPs did not drop at all (a WRN-10-1:8 joint PGD step: 9.16e9 on one
device, 8.64e9 per device on pool=4 x data=2; 1.15e9 with the fix).

The mixed pool (XLA / fused / im2col CNN stacks and an MLP stack, 3 + 2 + 1 + 3 members padded
per stack; a batch of 6 on pool=4 x data=2, of 5 on pool=2 x data=4) gives the one-device logits and input gradient.
"""

_BODY = """
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from sarjax.experiments import plan as PL
from sarjax.models.sharding import ShardedPool, make_mesh

def flops(c):
    return c.cost_analysis()["flops"]

# the cost analysis is per device: a data-parallel matmul on 8 devices counts 1/8
mesh8 = make_mesh(1, 8)
xs = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh8, P("data")))
ws = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=NamedSharding(mesh8, P()))
assert flops(jax.jit(lambda w, x: x @ w).lower(ws, xs).compile()) == 2 * 64 * 128 * 128 / 8

def named(arch, seed, n):
    s = stack(arch, seed, n)
    return Stack(arch, s.params, tuple(f"{arch.name}-{seed}/{i}" for i in range(n)))

cnn = zoo.cnn(channels=(8, 16), dense=32, conv_impl="xla", input_shape=(16, 16, 1))
pool8 = Pool([named(cnn, 0, 8)])
w8 = np.random.default_rng(1).standard_normal((8, 32, 10)).astype(np.float32)

def grad_cost(p, d):
    sp = ShardedPool(pool8, make_mesh(p, d))
    x = jax.ShapeDtypeStruct((32, 16, 16, 1), jnp.float32, sharding=NamedSharding(sp.mesh, P("data")))
    loss = lambda q, z: (jax.nn.log_softmax(sp.apply(q, z)) * w8).sum()
    return flops(jax.jit(jax.value_and_grad(loss, argnums=1)).lower(sp.params, x).compile())

one, mesh = grad_cost(1, 1), grad_cost(4, 2)
print("ShardedPool loss+grad per-device FLOPs: one device", one, "pool=4 x data=2", mesh)
assert mesh <= one / 6, (one, mesh)

wrn = PL.zoo_pool("wrn-10-1:8", input_shape=(16, 16, 3))
s = dict(steps=1, restarts=1, eps=8 / 255)
def plan_cost(p, d):
    prog, = PL.vision_program(wrn, "joint-pgd", 8, make_mesh(p, d), s)
    return flops(jax.jit(prog.fn, donate_argnums=1).lower(prog.params, prog.state).compile())
one, mesh = plan_cost(1, 1), plan_cost(4, 2)
print("plan joint-PGD step per-device FLOPs: one device", one, "pool=4 x data=2", mesh)
assert mesh <= one / 6, (one, mesh)

# the same math: a pool of four kinds of stacks, padded members and batches
pool = Pool([named(zoo.cnn(channels=(8, 8), dense=16, conv_impl=impl, input_shape=(12, 12, 1)), seed, n)
             for seed, (impl, n) in enumerate((("xla", 3), ("fused", 2), ("im2col", 1)))]
            + [named(zoo.mlp(widths=(16, 8), input_shape=(12, 12, 1)), 9, 3)])
x = np.random.default_rng(0).random((6, 12, 12, 1), dtype=np.float32)
w = np.random.default_rng(2).standard_normal((9, 6, 10)).astype(np.float32)
def vg(apply, params, z):
    f = lambda q, u: (jax.nn.log_softmax(apply(q, u)) * w[:, : u.shape[0]]).sum()
    return jax.jit(jax.value_and_grad(f, argnums=1))(params, z)
for (p, d), b in (((4, 2), 6), ((2, 4), 5)):
    sp = ShardedPool(pool, make_mesh(p, d))
    got, ref = np.asarray(jax.jit(sp.apply)(sp.params, x[:b])), np.asarray(pool.apply(pool.params, x[:b]))
    assert got.shape == ref.shape == (9, b, 10), got.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    (v, g), (rv, rg) = vg(sp.apply, sp.params, x[:b]), vg(pool.apply, pool.params, x[:b])
    np.testing.assert_allclose(float(v), float(rv), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g), np.asarray(rg), rtol=0, atol=1e-5 * np.abs(rg).max())
print("OK")
"""


def test_per_device_flops_drop_with_the_mesh_and_results_match(run_on_fake_devices):
    out = run_on_fake_devices(_BODY, n=8, timeout=600)
    print(out)
    assert "per-device FLOPs" in out
