"""Placing a pool on a device mesh with a ``pool`` axis and a ``data`` axis.

Each stack's members are sharded along ``pool`` (``NamedSharding(mesh, P("pool"))`` on the
leading axis of every params leaf); inputs are sharded along ``data``. Stacks and batches are
padded to multiples of the axis sizes, and masks say which rows are real. The same code runs on
one CPU, on 8 fake CPU devices (``jax.config.update("jax_num_cpu_devices", 8)``) and on a pod.

A stack's forward pass runs under ``jax.shard_map`` (:func:`mesh_stack_apply`): every device
computes ITS members on ITS samples, so the per-device work of a step is ``1 / (pool x data)`` of
the pool's. (Left to XLA's sharding propagation, the vmapped convolutions of a CNN stack, which XLA
turns into grouped convolutions, were computed whole on every device: per-device FLOPs of a joint
PGD step on a WideResNet pool did not drop at all on a ``pool=4 x data=2`` mesh;
tests/models/test_mesh_flops.py.)

:class:`ShardedPool` hides the padding from attacks: its ``apply`` returns the real members
only, so any sarjax attack run through :meth:`ShardedPool.attack` reports the same members,
success, losses and query counts as on one device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sarjax.models.pool import Pool


def make_mesh(pool: int | None = None, data: int | None = None, *, local: bool = False) -> Mesh:
    """A ``("pool", "data")`` mesh over the available devices.

    Args:
      pool: devices on the pool axis (default: all devices / data).
      data: devices on the data axis (default 1).
      local: use only this process's devices (``jax.local_devices()``) instead of every
        process's (``jax.devices()``). A multi-process run that splits the SAMPLES across
        processes (:func:`sarjax.sar.distributed.run_sar_across_processes`) gives each
        process its own mesh over its local devices; with one process both are the same.

    Both axes are ``AxisType.Auto``: XLA propagates shardings through the model code, which
    is written without sharding annotations.
    """
    devices = jax.local_devices() if local else jax.devices()
    n = len(devices)
    data = 1 if data is None else int(data)
    pool = n // data if pool is None else int(pool)
    if pool < 1 or data < 1 or pool * data > n:
        raise ValueError(f"mesh pool={pool} x data={data} needs {pool * data} devices, {n} available")
    auto = jax.sharding.AxisType.Auto
    return jax.make_mesh((pool, data), ("pool", "data"), axis_types=(auto, auto), devices=devices[: pool * data])


def mesh_stack_apply(apply: Callable, mesh: Mesh) -> Callable:
    """One stack's ``apply`` run member- and sample-parallel on ``mesh`` (``jax.shard_map``).

    Device ``(i, j)`` of the ``("pool", "data")`` mesh applies its block of members (the params'
    leading axis split over ``pool``) to its block of samples (``x``'s leading axis split over
    ``data``); nothing is replicated but ``x`` over ``pool`` and the params over ``data``. The
    gradient in ``x`` is summed over ``pool`` by ``shard_map``'s transpose.

    Args:
      apply: ``apply(params [K, ...], x [B, *S]) -> logits [K, B, C]`` (a stack's stacked apply:
        members are independent along the leading axis of every params leaf).
      mesh: a ``("pool", "data")`` mesh with ``K`` a multiple of its ``pool`` size.

    Returns:
      ``fn(params, x) -> [K, B, C]`` equal to ``apply(params, x)`` (to float32 rounding: XLA picks
      kernels by shape). A batch that is not a multiple of ``data`` is padded inside with copies
      of its first row, and cut back.
    """
    data = int(mesh.shape["data"])
    local = jax.shard_map(
        apply, mesh=mesh, in_specs=(P("pool"), P("data")), out_specs=P("pool", "data"), check_vma=False
    )

    def run(params: Any, x: jax.Array) -> jax.Array:
        b = x.shape[0]
        extra = (-b) % data
        if extra:
            x = jnp.concatenate([x, jnp.repeat(x[:1], extra, axis=0)])
        z = local(params, x)
        return z[:, :b] if extra else z

    return run


def pad_pool(pool: Pool, multiple: int) -> tuple[Pool, np.ndarray]:
    """Pad every stack to a multiple of ``multiple`` members with copies of its first member.

    Returns:
      (padded pool, member mask [M_padded] bool: True for real members).
    """
    stacks, mask = [], []
    for j, s in enumerate(pool.stacks):
        extra = (-s.size) % multiple
        mask += [True] * s.size + [False] * extra
        if extra:  # named by the stack's position too: two stacks may share an architecture name
            params = jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[:1], extra, axis=0)]), s.params)
            names = s.names + tuple(f"<pad {j}:{s.name} {i}>" for i in range(extra))
            s = s.with_params(params, names)
        stacks.append(s)
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
    stacks = [s.with_params(jax.device_put(s.params, sharding)) for s in padded.stacks]
    return Pool(stacks), mask


def place_batch(x: np.ndarray, mesh: Mesh) -> tuple[jax.Array, np.ndarray]:
    """Pad and shard a batch over the mesh's ``data`` axis. Returns (x, batch mask)."""
    xp, mask = pad_batch(np.asarray(x), mesh.shape["data"])
    return jax.device_put(xp, NamedSharding(mesh, P("data"))), mask


def sharded_logits(pool: Pool, x: np.ndarray, mesh: Mesh) -> np.ndarray:
    """[M, B, C] logits of the real members on the real samples, computed sharded over ``mesh``."""
    return ShardedPool(pool, mesh).logits(x)


class ShardedPool:
    """A pool placed on a mesh whose ``apply`` returns only the REAL members (padding hidden).

    ``place_pool`` pads every stack to a multiple of the ``pool`` axis with copies of its first
    member.  Attacks on that padded pool would report and charge the copies (a forward pass of a
    padded member counted as queries, extra columns in ``success``).  Here the padded members are
    computed (so that every device holds an equal share) but dropped from the logits, so
    ``apply(params, x)`` is ``[M, B, C]`` for the pool's own M members, in the pool's order, and
    the gradient flows back to the sharded params.

    Attributes:
      pool: the padded, placed pool.
      source: the pool as given (one device, unpadded): its names, classes, input shape and
        content hash are the sharded pool's.
      mesh: the ``("pool", "data")`` mesh.
      members: ``[M]`` int, the rows of the padded pool that are real members.
      params: the placed params (pass them to attacks built on ``apply``).

    Example::

        jax.config.update("jax_num_cpu_devices", 8)   # or a real multi-device backend
        sp = ShardedPool(pool, make_mesh(pool=2, data=4))
        atk = make_joint_pgd(sp.apply, eps=0.1)
        res = sp.attack(atk, x0, labels, key=jax.random.key(0))   # x_adv [B, ...], success [B, M], queries [B]
    """

    def __init__(self, pool: Pool, mesh: Mesh):
        self.mesh = mesh
        self.source = pool
        self.pool, mask = place_pool(pool, mesh)
        self.members = np.flatnonzero(mask)
        self.num_members = int(len(self.members))
        # per stack: its real members (the first ones: padding is appended), the layout of its
        # params on each device and its apply on that layout, both under shard_map
        self._real = tuple(s.size for s in pool.stacks)
        self._prepare = tuple(self._local_prepare(s) for s in self.pool.stacks)
        self._apply = tuple(mesh_stack_apply(functools.partial(self._apply_local, s), mesh) for s in self.pool.stacks)

    def _local_prepare(self, stack) -> Callable:
        """``stack.prepare`` on each device's members; every leaf gains a leading axis of 1 per
        device, so that any layout (e.g. an MLP's ``[D, K * H]``) goes out and back on ``pool``."""

        def prep(p):
            return jax.tree.map(lambda a: a[None], stack.prepare(p))

        return jax.shard_map(prep, mesh=self.mesh, in_specs=P("pool"), out_specs=P("pool"), check_vma=False)

    @staticmethod
    def _apply_local(stack, prepared, x):
        return stack.apply_prepared(jax.tree.map(lambda a: a[0], prepared), x)

    @property
    def params(self) -> tuple:
        return self.pool.params

    def apply(self, params, x: jax.Array) -> jax.Array:
        """Logits ``[M, B, C]`` of the real members (the padded pool runs sharded: each device
        its members on its samples, :func:`mesh_stack_apply`)."""
        return self.apply_prepared(self.prepare_apply(params)[1], x)

    def prepare_apply(self, params) -> tuple:
        """``(fn, prepared)`` with ``fn(prepared, x) == self.apply(params, x)`` (see
        :meth:`Pool.prepare_apply`; attack kernels call it once, outside their loops). The
        layouts are computed on each device for its own members."""
        return self.apply_prepared, tuple(f(p) for f, p in zip(self._prepare, params, strict=True))

    def apply_prepared(self, prepared, x: jax.Array) -> jax.Array:
        """:meth:`apply` on the output of :meth:`prepare_apply`: ``[M, B, C]``."""
        outs = []
        for f, q, k, s in zip(self._apply, prepared, self._real, self.pool.stacks, strict=True):
            z = f(q, x)
            outs.append(z if k == s.size else z[:k])
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)

    def logits(self, x) -> np.ndarray:
        """``[M, B, C]`` logits of the real members on the real samples."""
        xs, bmask = place_batch(np.asarray(x), self.mesh)
        return np.asarray(self._jit_apply(self.params, xs))[:, bmask]

    @functools.cached_property
    def _jit_apply(self):
        return jax.jit(self.apply)

    def predict(self, x, batch: int = 1000) -> np.ndarray:
        """``[M, B]`` int32 predicted classes of the real members, sharded, in chunks of ``batch``.

        What ``run_sar`` uses for the clean references and the fallback's coverage sets of a
        sharded pool (:meth:`sarjax.models.pool.Pool.predict` on one device).
        """
        self.source.check_input(x)
        out = [np.argmax(self.logits(np.asarray(x[i : i + batch])), -1) for i in range(0, len(x), batch)]
        return np.concatenate(out, axis=1).astype(np.int32)

    def attack_members(self, attack_members, factory, x0, ref, *, key, sample_ids=None, **kwargs):
        """``attack_members`` (:func:`sarjax.attacks.members.attack_members`) on the sharded pool: every member alone.

        The padded pool's stacks are attacked member by member (vmapped, the member axis sharded
        on ``pool``), the batch padded and sharded on ``data``; the result is cut to the real
        members and samples. A real member keeps its stack and its index in it, and a sample its
        id, so each draws the random stream it draws on one device.

        Args:
          attack_members: the member attack, called as ``attack_members(pool, factory, x0, ref, *, key,
            sample_ids, **kwargs)`` on the padded pool (:func:`sarjax.attacks.members.attack_members`;
            passed in, so that ``models`` does not import ``attacks``).
          factory: attack factory, e.g. :func:`sarjax.attacks.pgd.make_pgd`.
          x0: ``[B, *S]`` inputs.
          ref: ``[B]`` or ``[B, M]`` int labels (the real members').
          key: PRNG key, required.
          sample_ids: ``[B]`` int (default ``arange(B)``).
          **kwargs: ``eps`` (scalar or ``[B]``), ``max_queries`` and the factory's
            hyperparameters (``norm``, ``steps``, ...), as for ``attack_members``.

        Returns:
          AttackResult with the member axis second: ``x_adv [B, M, *S]``, ``success [B, M]``,
          ``queries [B, M]``, ...
        """
        x0 = np.asarray(x0, np.float32)
        b = x0.shape[0]
        ids = np.arange(b, dtype=np.int32) if sample_ids is None else np.asarray(sample_ids)
        lab = np.asarray(ref)
        if lab.ndim == 2:  # [B, M]: the padded members (copies of their stack's first) get class 0
            if lab.shape[1] != self.num_members:
                raise ValueError(f"ref must be [B] or [B, M={self.num_members}], got shape {lab.shape}")
            full = np.zeros((lab.shape[0], self.pool.num_members), lab.dtype)
            full[:, self.members] = lab
            lab = full
        pad = lambda a: place_batch(np.asarray(a), self.mesh)[0]  # noqa: E731
        for k in ("eps", "max_queries"):
            v = kwargs.get(k)
            if v is not None and np.ndim(v) == 1:
                kwargs[k] = pad(v)
        xs = pad(x0)
        res = attack_members(self.pool, factory, xs, pad(lab), key=key, sample_ids=pad(ids), **kwargs)
        n = xs.shape[0]
        return jax.tree.map(lambda a: a[:b][:, self.members] if np.ndim(a) >= 2 and a.shape[0] == n else a, res)

    def attack(self, attack, x0, ref, *, key, mask=None, **kwargs):
        """Run ``attack(self.params, x0, ref, key=key, mask=mask, **kwargs)`` with the batch sharded on ``data``.

        ``attack`` must be built on :meth:`apply` (e.g. ``make_joint_pgd(sp.apply, ...)``).  The
        batch is padded to a multiple of the ``data`` axis with copies of its first sample (their
        ``mask``, per-sample ``eps`` / ``max_queries`` / ``x_init`` rows and ``sample_ids`` too;
        their ``ref`` rows are class 0, so a label the attack rejects is reported for the real
        samples only); every result leaf with a leading batch axis is cut back to the real
        samples.  ``sample_ids`` (default ``arange(B)``: the samples' positions in ``x0``) go
        with the batch, so every sample draws the random stream it draws on one device, however
        the batch is padded and sharded.

        Raises:
          ValueError: from the attack, for labels / targets outside the model's classes (naming
            the samples) or any other invalid argument; here, for a per-sample argument whose
            leading size is not the batch's.

        Returns:
          the attack's result for the ``B`` real samples (for an :class:`AttackResult`:
          ``x_adv [B, *S]``, ``success [B, M]``, ``queries [B, M]``, ...).
        """
        x0 = np.asarray(x0, np.float32)
        b = x0.shape[0]

        def pad(a, per_sample):
            if a is None or not per_sample(np.ndim(a)):
                return a
            if np.shape(a)[0] != b:
                raise ValueError(f"per-sample argument has leading size {np.shape(a)[0]}, the batch has {b}")
            return place_batch(a, self.mesh)[0]

        always = lambda ndim: True  # noqa: E731  x0, ref [B] or [B, M], x_init
        rows = lambda ndim: ndim == 1  # noqa: E731  eps / max_queries [B] (not scalars)
        kwargs = {
            k: pad(v, always if k == "x_init" else rows) if k in ("eps", "max_queries", "x_init") else v
            for k, v in kwargs.items()
        }
        ids = kwargs.get("sample_ids")
        kwargs["sample_ids"] = pad(np.arange(b, dtype=np.int32) if ids is None else np.asarray(ids), always)
        xs = pad(x0, always)
        ref_rows = np.asarray(ref)
        if ref_rows.ndim < 1 or ref_rows.shape[0] != b:
            raise ValueError(f"ref must be [B] or [B, M] with B={b} (the batch), got shape {ref_rows.shape}")
        pad_rows = np.zeros((xs.shape[0] - b,) + ref_rows.shape[1:], ref_rows.dtype)  # class 0: never a bad label
        ref_rows = jax.device_put(np.concatenate([ref_rows, pad_rows]), NamedSharding(self.mesh, P("data")))
        res = attack(self.params, xs, ref_rows, key=key, mask=pad(mask, lambda ndim: ndim == 2), **kwargs)
        n = xs.shape[0]
        return jax.tree.map(lambda a: a[:b] if np.ndim(a) and a.shape[0] == n else a, res)
