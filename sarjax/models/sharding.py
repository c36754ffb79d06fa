"""Placing a pool on a device mesh with a ``pool`` axis and a ``data`` axis.

Each stack's members are sharded along ``pool`` (``NamedSharding(mesh, P("pool"))`` on the
leading axis of every params leaf); inputs are sharded along ``data``. Stacks and batches are
padded to multiples of the axis sizes, and masks say which rows are real. The same code runs on
one CPU, on 8 fake CPU devices (``jax.config.update("jax_num_cpu_devices", 8)``) and on a pod.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sarjax.models.pool import Pool, Stack


def make_mesh(pool: int | None = None, data: int | None = None) -> Mesh:
    """A ``("pool", "data")`` mesh over the available devices.

    Args:
      pool: devices on the pool axis (default: all devices / data).
      data: devices on the data axis (default 1).

    Both axes are ``AxisType.Auto``: XLA propagates shardings through the model code, which
    is written without sharding annotations.
    """
    n = jax.device_count()
    data = 1 if data is None else int(data)
    pool = n // data if pool is None else int(pool)
    if pool < 1 or data < 1 or pool * data > n:
        raise ValueError(f"mesh pool={pool} x data={data} needs {pool * data} devices, {n} available")
    auto = jax.sharding.AxisType.Auto
    return jax.make_mesh((pool, data), ("pool", "data"), axis_types=(auto, auto))


def pad_pool(pool: Pool, multiple: int) -> tuple[Pool, np.ndarray]:
    """Pad every stack to a multiple of ``multiple`` members with copies of its first member.

    Returns:
      (padded pool, member mask [M_padded] bool: True for real members).
    """
    stacks, mask = [], []
    for s in pool.stacks:
        extra = (-s.size) % multiple
        if extra:
            params = jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[:1], extra, axis=0)]), s.params)
            names = s.names + tuple(f"<pad {s.arch.name} {i}>" for i in range(extra))
            s = Stack(s.arch, params, names)
        stacks.append(s)
        mask += [not n.startswith("<pad ") for n in s.names]
    return Pool(stacks), np.array(mask)


def pad_batch(x: np.ndarray, multiple: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad a batch [B, ...] to a multiple of ``multiple`` with copies of its first row; returns (x, mask [B_padded])."""
    b = len(x)
    extra = (-b) % multiple
    if extra:
        x = np.concatenate([x, np.repeat(np.asarray(x[:1]), extra, axis=0)])
    return x, np.arange(b + extra) < b


def place_pool(pool: Pool, mesh: Mesh) -> tuple[Pool, np.ndarray]:
    """Pad and shard a pool's params over the mesh's ``pool`` axis. Returns (pool, member mask)."""
    padded, mask = pad_pool(pool, mesh.shape["pool"])
    sharding = NamedSharding(mesh, P("pool"))
    stacks = [Stack(s.arch, jax.device_put(s.params, sharding), s.names) for s in padded.stacks]
    return Pool(stacks), mask


def place_batch(x: np.ndarray, mesh: Mesh) -> tuple[jax.Array, np.ndarray]:
    """Pad and shard a batch over the mesh's ``data`` axis. Returns (x, batch mask)."""
    xp, mask = pad_batch(np.asarray(x), mesh.shape["data"])
    return jax.device_put(xp, NamedSharding(mesh, P("data"))), mask


def sharded_logits(pool: Pool, x: np.ndarray, mesh: Mesh) -> np.ndarray:
    """[M, B, C] logits of the real members on the real samples, computed sharded over ``mesh``."""
    placed, mmask = place_pool(pool, mesh)
    xs, bmask = place_batch(x, mesh)
    out = jax.jit(placed.apply)(placed.params, xs)
    return np.asarray(out)[mmask][:, bmask]
