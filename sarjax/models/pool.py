"""Pools of models as stacked pytrees.

A :class:`Stack` is one architecture with its members' params stacked on a leading axis; a
:class:`Pool` is an ordered tuple of stacks with named members. ``pool.apply(params, x)``
returns logits ``[M, B, C]``: one vmapped call per stack, concatenated on the member axis.
Subsets of members are masks of shape ``[M]`` (or ``[B, M]``), never lists, so changing a
subset never recompiles anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jax
import jax.core  # jax.core.Tracer: a concrete value can be checked on the host
import jax.numpy as jnp
import numpy as np

from sarjax.models import fused
from sarjax.models.zoo import ACTIVATIONS, CONV_IMPLS, Arch

PyTree = Any


def _leaf_signature(tree: PyTree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return (treedef, tuple((tuple(np.shape(l)), str(jnp.asarray(l).dtype)) for l in leaves))


def stack_trees(trees: Sequence[PyTree]) -> PyTree:
    """Stack a sequence of identically structured pytrees on a new leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack_tree(tree: PyTree, i: int) -> PyTree:
    """Member ``i`` of a stacked pytree."""
    return jax.tree.map(lambda a: a[i], tree)


@dataclass(frozen=True, eq=False)
class Stack:
    """One architecture and its members' params stacked on a leading axis.

    Attributes:
      arch: the architecture (its ``apply(params, x: [B, *S]) -> [B, C]`` is for one member).
      params: pytree whose leaves have a leading axis of size ``size``.
      names: one name per member.
    """

    arch: Arch
    params: PyTree
    names: tuple[str, ...]

    def __post_init__(self):
        sizes = {np.shape(l)[0] if np.ndim(l) else None for l in jax.tree.leaves(self.params)}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                f"stack {self.arch.name}: params leaves must share one leading member axis, got sizes {sizes}"
            )
        (n,) = sizes
        if len(self.names) != n:
            raise ValueError(f"stack {self.arch.name}: {n} members but {len(self.names)} names")
        object.__setattr__(self, "names", tuple(self.names))

    @property
    def size(self) -> int:
        return len(self.names)

    @classmethod
    def from_keys(cls, arch: Arch, keys: jax.Array, names: Sequence[str] | None = None) -> Stack:
        """Initialise ``len(keys)`` members of ``arch`` with ``jax.vmap(arch.init)(keys)``."""
        params = jax.vmap(arch.init)(keys)
        n = len(keys)
        return cls(arch, params, tuple(names) if names is not None else tuple(f"{arch.name}/{i}" for i in range(n)))

    @classmethod
    def from_members(cls, arch: Arch, members: Sequence[PyTree], names: Sequence[str]) -> Stack:
        """Stack a list of one-member params of the same architecture."""
        return cls(arch, stack_trees(members), tuple(names))

    def apply(self, params: PyTree, x: jax.Array) -> jax.Array:
        """Logits of every member of this stack. params: stacked; x: [B, *S] -> [K, B, C].

        A ``zoo.cnn(conv_impl="fused")`` stack runs :func:`sarjax.models.fused.cnn_pool_apply`
        on the CPU backend (same logits, a faster input gradient for joint attacks).
        """
        return self.apply_prepared(self.prepare(params), x)

    def prepare(self, params: PyTree) -> PyTree:
        """Params laid out for :meth:`apply_prepared` (weight layouts that do not depend on ``x``).

        An MLP stack gains ``"_dense0_cat"``: its first-layer weights ``[D, K * H]``, so that every
        member's first layer on the shared input is ONE matmul.  Attack kernels call this once per
        call, outside their step loops (XLA does not hoist the transposes out of a loop itself).
        """
        if self.arch.family == "mlp":
            w = params["dense0"]["w"]  # [K, D, H]
            return {**params, "_dense0_cat": jnp.moveaxis(w, 0, 1).reshape(w.shape[1], -1)}
        return params

    def apply_prepared(self, prepared: PyTree, x: jax.Array) -> jax.Array:
        """:meth:`apply` on the output of :meth:`prepare`."""
        if "_dense0_cat" in prepared:
            return _mlp_shared_apply(self.arch, prepared, x)
        if self.arch.conv_impl == "fused" and fused.supports(self.arch) and jax.default_backend() == "cpu":
            return fused.cnn_pool_apply(self.arch, prepared, x)
        return jax.vmap(self.arch.apply, in_axes=(0, None))(prepared, x)

    def member(self, i: int) -> PyTree:
        return unstack_tree(self.params, i)


def _mlp_shared_apply(arch: Arch, p: PyTree, x: jax.Array) -> jax.Array:
    """Logits [K, B, C] of K stacked MLP members on one shared batch (``arch.apply``'s layers)."""
    f = ACTIVATIONS[arch.act]
    b = x.shape[0]
    k, _, h = p["dense0"]["w"].shape
    z = (x.reshape(b, -1) @ p["_dense0_cat"]).reshape(b, k, h) + p["dense0"]["b"]
    z = jnp.moveaxis(f(z), 1, 0)  # [K, B, H]
    for i in range(1, len(arch.widths)):
        z = f(jnp.einsum("kbh,khn->kbn", z, p[f"dense{i}"]["w"]) + p[f"dense{i}"]["b"][:, None])
    return jnp.einsum("kbh,khn->kbn", z, p["out"]["w"]) + p["out"]["b"][:, None]


class Pool:
    """An ordered, named pool of models made of one or more :class:`Stack`.

    Args:
      stacks: the stacks, in member order.

    Raises:
      ValueError: empty pool, duplicate member names, members disagreeing on the class count or
        the input shape, or non-finite params (naming the member).
    """

    def __init__(self, stacks: Sequence[Stack]):
        stacks = tuple(stacks)
        if not stacks or sum(s.size for s in stacks) == 0:
            raise ValueError("a pool needs at least one member, got an empty pool")
        for s in stacks:
            if not isinstance(s, Stack):
                raise TypeError(f"Pool takes Stack objects, got {type(s).__name__}")
        names = tuple(n for s in stacks for n in s.names)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"member names must be unique, duplicated: {dup}")
        ref = stacks[0]
        for s in stacks:
            if s.arch.num_classes != ref.arch.num_classes:
                raise ValueError(
                    f"class-count mismatch: member {s.names[0]!r} has {s.arch.num_classes} classes, "
                    f"member {ref.names[0]!r} has {ref.arch.num_classes}"
                )
            if s.arch.input_shape != ref.arch.input_shape:
                raise ValueError(
                    f"input-shape mismatch: member {s.names[0]!r} takes {s.arch.input_shape}, "
                    f"member {ref.names[0]!r} takes {ref.arch.input_shape}"
                )
        for s in stacks:
            bad = np.zeros(s.size, bool)
            for leaf in jax.tree.leaves(s.params):
                leaf = np.asarray(leaf)
                bad |= ~np.isfinite(leaf.reshape(s.size, -1)).all(axis=1)
            if bad.any():
                raise ValueError(
                    f"non-finite (NaN/inf) params in member(s) {[s.names[i] for i in np.flatnonzero(bad)]}"
                )
        self.stacks = stacks
        self.names = names

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_members(cls, members: Sequence[tuple[Arch, PyTree]], names: Sequence[str] | None = None) -> Pool:
        """Build a pool from ``(arch, params)`` pairs, grouping members into stacks.

        Members go to the same stack when they share the architecture and the params' tree
        structure, leaf shapes and dtypes. Member order is kept within each stack; stacks are
        ordered by first appearance (so ``pool.names`` may reorder members across stacks).
        """
        if not members:
            raise ValueError("a pool needs at least one member, got an empty list")
        names = list(names) if names is not None else [f"m{i}" for i in range(len(members))]
        if len(names) != len(members):
            raise ValueError(f"{len(members)} members but {len(names)} names")
        groups: dict[tuple, list[int]] = {}
        for i, (arch, params) in enumerate(members):
            if not isinstance(arch, Arch):
                raise TypeError(f"member {names[i]!r}: expected an Arch, got {type(arch).__name__}")
            groups.setdefault((arch, _leaf_signature(params)), []).append(i)
        stacks = [
            Stack.from_members(members[idx[0]][0], [members[i][1] for i in idx], [names[i] for i in idx])
            for idx in groups.values()
        ]
        return cls(stacks)

    # -- structure -----------------------------------------------------------------------------
    @property
    def num_members(self) -> int:
        return len(self.names)

    @property
    def num_classes(self) -> int:
        return self.stacks[0].arch.num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.stacks[0].arch.input_shape

    @property
    def params(self) -> tuple[PyTree, ...]:
        return tuple(s.params for s in self.stacks)

    @property
    def member_slices(self) -> tuple[slice, ...]:
        out, start = [], 0
        for s in self.stacks:
            out.append(slice(start, start + s.size))
            start += s.size
        return tuple(out)

    def content_hash(self) -> str:
        """SHA-256 (hex) of everything that determines the pool's outputs except ``conv_impl``.

        Covers the member names, each stack's architecture spec (without ``conv_impl``, which
        changes how a convolution is computed, not its result), and every params leaf's path,
        shape, dtype and bytes. Used to fingerprint checkpoints and resumable runs.
        """
        import hashlib

        h = hashlib.sha256()
        for s in self.stacks:
            spec = {k: v for k, v in s.arch.spec().items() if k != "conv_impl"}
            h.update(repr((sorted(spec.items()), s.names)).encode())
            for path, leaf in jax.tree_util.tree_flatten_with_path(s.params)[0]:
                a = np.ascontiguousarray(np.asarray(leaf))
                h.update(repr((jax.tree_util.keystr(path), a.shape, str(a.dtype))).encode())
                h.update(a.tobytes())
        return h.hexdigest()

    def with_params(self, params: Sequence[PyTree]) -> Pool:
        """A pool with the same structure and new stacked params (e.g. after training)."""
        return Pool([Stack(s.arch, p, s.names) for s, p in zip(self.stacks, params)])

    def with_conv_impl(self, conv_impl: str) -> Pool:
        """The same members (same params) with every convolutional stack's ``conv_impl`` replaced.

        E.g. ``pool.with_conv_impl("fused")`` before a joint attack on CPU (docs/models.md); MLP
        stacks are unchanged.  Raises ValueError for an unknown ``conv_impl``.
        """
        if conv_impl not in CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
        return Pool(
            [
                Stack(
                    s.arch if s.arch.family == "mlp" else dataclasses.replace(s.arch, conv_impl=conv_impl),
                    s.params,
                    s.names,
                )
                for s in self.stacks
            ]
        )

    def select(self, index: Sequence[int] | np.ndarray) -> Pool:
        """A new pool with the members at ``index`` (host side, for building sub-pools; use masks in attacks)."""
        index = [int(i) for i in np.atleast_1d(index)]
        members = []
        for i in index:
            for s, sl in zip(self.stacks, self.member_slices):
                if sl.start <= i < sl.stop:
                    members.append((s.arch, s.member(i - sl.start)))
        return Pool.from_members(members, [self.names[i] for i in index])

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.arch.name} x{s.size}" for s in self.stacks)
        return f"Pool(M={self.num_members}: {parts})"

    # -- evaluation ----------------------------------------------------------------------------
    def apply(self, params: Sequence[PyTree], x: jax.Array) -> jax.Array:
        """Logits of every member. Pure: jit it with ``params`` as an argument.

        Args:
          params: ``pool.params`` (one stacked pytree per stack).
          x: [B, *input_shape].

        Returns:
          [M, B, C] float32 logits.
        """
        outs = [s.apply(p, x) for s, p in zip(self.stacks, params)]
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)

    def prepare_apply(self, params: Sequence[PyTree]) -> tuple[Callable, tuple]:
        """``(fn, prepared)`` with ``fn(prepared, x) == self.apply(params, x)``.

        The x-independent weight layouts (:meth:`Stack.prepare`) are computed here, once; attack
        state machines call this once, before their step loops (:func:`sarjax.attacks.core.evaluate.prepare`).
        """
        return self.apply_prepared, tuple(s.prepare(p) for s, p in zip(self.stacks, params))

    def apply_prepared(self, prepared: Sequence[PyTree], x: jax.Array) -> jax.Array:
        """:meth:`apply` on the output of :meth:`prepare_apply`."""
        outs = [s.apply_prepared(p, x) for s, p in zip(self.stacks, prepared)]
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)

    @cached_property
    def _jit_apply(self) -> Callable:
        return jax.jit(self.apply)

    def check_input(self, x: Any) -> np.ndarray | jax.Array:
        """Validate a batch of inputs: [B, *input_shape], finite. Raises ValueError otherwise."""
        shape = tuple(np.shape(x))
        if len(shape) != 1 + len(self.input_shape) or shape[1:] != self.input_shape:
            raise ValueError(
                f"expected inputs of shape [B, {', '.join(map(str, self.input_shape))}], got {list(shape)}"
            )
        if not isinstance(x, jax.core.Tracer) and not bool(np.isfinite(np.asarray(x)).all()):
            raise ValueError("inputs contain NaN or inf")
        return x

    def logits(self, x: jax.Array) -> jax.Array:
        """[M, B, C] logits of every member on x: [B, *input_shape] (validated, jitted)."""
        self.check_input(x)
        return self._jit_apply(self.params, x)

    def predict(self, x: jax.Array, batch: int = 1000) -> np.ndarray:
        """[M, B] int32 predicted classes, evaluated in chunks of ``batch`` inputs."""
        self.check_input(x)
        out = [
            np.asarray(jnp.argmax(self._jit_apply(self.params, x[i : i + batch]), -1)) for i in range(0, len(x), batch)
        ]
        return np.concatenate(out, axis=1).astype(np.int32)

    def accuracy(self, x: jax.Array, y: np.ndarray, batch: int = 1000) -> np.ndarray:
        """[M] accuracy of each member on (x: [B, *S], y: [B])."""
        return (self.predict(x, batch) == np.asarray(y)[None]).mean(axis=1)
