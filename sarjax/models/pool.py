"""Pools of models as stacked pytrees.

A stack is one architecture with its members' params stacked on a leading axis (the protocol:
:class:`sarjax.models.stack.BaseStack`; :class:`Stack` is the built-in zoo's); a :class:`Pool` is
an ordered tuple of stacks of any kinds with named members. ``pool.apply(params, x)`` returns
logits ``[M, B, C]``: one vmapped call per stack, concatenated on the member axis. Subsets of
members are masks of shape ``[M]`` (or ``[B, M]``), never lists, so changing a subset never
recompiles anything.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import jax
import jax.core  # jax.core.Tracer: a concrete value can be checked on the host
import jax.numpy as jnp
import numpy as np

from sarjax.models import fused
from sarjax.models.flax_stacks import LinenStack, NnxStack
from sarjax.models.stack import (
    BaseStack,
    FunctionStack,
    leaf_signature,
    register_kind,
    stack_trees,
    unstack_tree,
)
from sarjax.models.torch_convert import torch_stacks
from sarjax.models.zoo import ACTIVATIONS, CONV_IMPLS, Arch

PyTree = Any
_leaf_signature = leaf_signature
__all__ = ["BaseStack", "FunctionStack", "Pool", "Stack", "stack_trees", "unstack_tree"]


@register_kind
@dataclass(frozen=True, eq=False)
class Stack(BaseStack):
    """The built-in zoo's stack (kind ``"zoo"``): one :class:`sarjax.models.zoo.Arch` and its members' params.

    Attributes:
      arch: the architecture (its ``apply(params, x: [B, *S]) -> [B, C]`` is for one member).
      params: pytree whose leaves have a leading axis of size ``size``.
      names: one name per member.
    """

    kind: ClassVar[str] = "zoo"
    needs_builder: ClassVar[bool] = False

    arch: Arch
    params: PyTree
    names: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "names", tuple(self.names))
        self._check_members()

    # -- the protocol --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.arch.name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.arch.input_shape

    @property
    def num_classes(self) -> int:
        return self.arch.num_classes

    @property
    def member_apply(self) -> Callable:
        """``arch.apply`` of the first-seen architecture equal to ``arch`` (:func:`canonical_arch`).

        Equal for equal architectures, so kernels built on it are shared: bound methods compare
        their ``__self__`` by identity, and two pools' archs are often equal, distinct objects
        (``with_conv_impl`` builds a new one), whose own ``apply`` would not compare equal.
        """
        return canonical_arch(self.arch).apply

    @property
    def conv_impl(self) -> str | None:
        """The convolution formulation of a convolutional stack; None for an MLP."""
        return None if self.arch.family == "mlp" else self.arch.conv_impl

    def spec(self) -> dict:
        return {"kind": self.kind, **self.arch.spec()}

    def hash_spec(self) -> dict:
        """The architecture spec without ``conv_impl`` (it changes rounding, not the model)."""
        return {k: v for k, v in self.arch.spec().items() if k != "conv_impl"}

    def with_params(self, params: PyTree, names: Sequence[str] | None = None) -> Stack:
        return Stack(self.arch, params, tuple(self.names if names is None else names))

    def with_conv_impl(self, conv_impl: str) -> Stack:
        """The same members with ``arch.conv_impl`` replaced (MLP stacks are returned unchanged)."""
        if self.arch.family == "mlp":
            return self
        return Stack(dataclasses.replace(self.arch, conv_impl=conv_impl), self.params, self.names)

    @classmethod
    def restore(cls, spec, leaves, paths, names, built) -> Stack:
        """Rebuild from ``spec`` (an :meth:`Arch.spec` with ``kind``); ``built`` is unused."""
        del built
        arch = Arch.from_spec({k: v for k, v in spec.items() if k != "kind"})
        abstract = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), len(names)))
        return cls(arch, jax.tree.unflatten(jax.tree.structure(abstract), list(leaves)), tuple(names))

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
        call, outside their step loops (XLA does not hoist the transposes out of a loop itself);
        the layout of the stack's own params is computed once and kept (:meth:`_dense0_cat`).
        """
        if self.arch.family == "mlp":
            return {**params, "_dense0_cat": self._dense0_cat(params)}
        return params

    def _dense0_cat(self, params: PyTree) -> jax.Array:
        """``[D, K * H]``: the first-layer weights side by side.

        For this stack's own params (``params is self.params`` with ``dense0.w`` a concrete
        ``jax.Array``, which is immutable) the layout is computed once and kept on the stack
        (keyed by that array: new params, new layout): an attack's audited entry prepares on the
        host (:func:`sarjax.attacks.core.protocol.prepare_outside`), so repeated calls on one
        pool skip the transpose (16 MB at M = 20, 784-256; docs/attacks.md).  Traced or other
        params are laid out here on every call, as before.
        """
        w = params["dense0"]["w"]  # [K, D, H]
        own = params is self.params and not isinstance(w, jax.core.Tracer) and isinstance(w, jax.Array)
        if own:
            hit = self.__dict__.get("_layout_cache")
            if hit is not None and hit[0] is w:
                return hit[1]
            cat = _jit_cat_layout(w)
            object.__setattr__(self, "_layout_cache", (w, cat))  # frozen dataclass: a private cache
            return cat
        return _cat_layout(w)

    def apply_prepared(self, prepared: PyTree, x: jax.Array) -> jax.Array:
        """:meth:`apply` on the output of :meth:`prepare`."""
        return _zoo_apply_prepared(self.arch, prepared, x)


def _zoo_apply_prepared(arch: Arch, prepared: PyTree, x: jax.Array) -> jax.Array:
    """:meth:`Stack.apply_prepared` of a stack of ``arch`` (it reads nothing else of the stack)."""
    if "_dense0_cat" in prepared:
        return _mlp_shared_apply(arch, prepared, x)
    if arch.conv_impl == "fused" and fused.supports(arch) and jax.default_backend() == "cpu":
        return fused.cnn_pool_apply(arch, prepared, x)
    return jax.vmap(arch.apply, in_axes=(0, None))(prepared, x)


def _zoo_pool_apply(archs: tuple[Arch, ...], params: Sequence[PyTree], x: jax.Array) -> jax.Array:
    """:meth:`Pool.apply` of a pool of zoo stacks of ``archs`` on traced ``params`` (the same operations)."""
    outs = []
    for arch, p in zip(archs, params):
        if arch.family == "mlp":  # Stack.prepare of params that are not the stack's own
            p = {**p, "_dense0_cat": _cat_layout(p["dense0"]["w"])}
        outs.append(_zoo_apply_prepared(arch, p, x))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)


# one jitted apply for every pool of zoo stacks: its programs are keyed by the architectures (static,
# compared by value) and the shapes, so two pools of one structure share them, and pools that differ
# in any architecture field (conv_impl included) never do
_jit_zoo_pool_apply = jax.jit(_zoo_pool_apply, static_argnums=0)

_CANONICAL_ARCHS: dict[Arch, Arch] = {}


def canonical_arch(arch: Arch) -> Arch:
    """The first :class:`Arch` seen equal to ``arch`` in this process (``arch`` itself the first time).

    Kernels cached on a member apply (:attr:`Stack.member_apply`) are keyed by ``arch.apply``,
    which compares ``arch`` by identity; this makes equal architectures one object.
    """
    return _CANONICAL_ARCHS.setdefault(arch, arch)


def _cat_layout(w: jax.Array) -> jax.Array:
    """``[K, D, H] -> [D, K * H]`` (member k's weights in columns ``k*H:(k+1)*H``)."""
    return jnp.moveaxis(w, 0, 1).reshape(w.shape[1], -1)


_jit_cat_layout = jax.jit(_cat_layout)


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
    """An ordered, named pool of models made of one or more stacks of any kinds.

    Args:
      stacks: the stacks (:class:`sarjax.models.stack.BaseStack`: the zoo's :class:`Stack`,
        :class:`FunctionStack`, flax stacks, ...), in member order.

    Raises:
      ValueError: empty pool, duplicate member names, members disagreeing on the class count or
        the input shape, or non-finite params (naming the member).
    """

    def __init__(self, stacks: Sequence[BaseStack]):
        self.stacks: tuple[BaseStack, ...]
        stacks = tuple(stacks)
        for s in stacks:
            if not isinstance(s, BaseStack):
                raise TypeError(f"Pool takes stacks (sarjax.models.stack.BaseStack), got {type(s).__name__}")
        if not stacks or sum(s.size for s in stacks) == 0:
            raise ValueError("a pool needs at least one member, got an empty pool")
        names = tuple(n for s in stacks for n in s.names)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"member names must be unique, duplicated: {dup}")
        ref = stacks[0]
        for s in stacks:
            if s.num_classes != ref.num_classes:
                raise ValueError(
                    f"class-count mismatch: member {s.names[0]!r} has {s.num_classes} classes, "
                    f"member {ref.names[0]!r} has {ref.num_classes}"
                )
            if tuple(s.input_shape) != tuple(ref.input_shape):
                raise ValueError(
                    f"input-shape mismatch: member {s.names[0]!r} takes {s.input_shape}, "
                    f"member {ref.names[0]!r} takes {ref.input_shape}"
                )
        for s in stacks:
            bad = np.zeros(s.size, bool)
            for leaf in jax.tree.leaves(s.params):
                if not jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.inexact):
                    continue  # integer counters, PRNG keys: nothing to be non-finite
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

    @classmethod
    def from_functions(
        cls,
        members: Sequence[tuple[Callable, PyTree]],
        names: Sequence[str] | None = None,
        *,
        input_shape: Sequence[int],
        num_classes: int | None = None,
    ) -> Pool:
        """Build a pool from plain ``(apply, params)`` pairs (:class:`FunctionStack`).

        Members go to the same stack when they share the apply (the same function object) and
        the params' tree structure, leaf shapes and dtypes; each stack runs ``jax.vmap`` of its
        apply over the stacked params.

        Args:
          members: ``(apply, params_one)`` with ``apply(params_one, x [B, *input_shape]) -> [B, C]`` float32.
          names: member names (default ``m0, m1, ...``).
          input_shape: one input's shape, e.g. ``(28, 28, 1)``.
          num_classes: checked against the applies' outputs (inferred when None).
        """
        if not members:
            raise ValueError("a pool needs at least one member, got an empty list")
        names = list(names) if names is not None else [f"m{i}" for i in range(len(members))]
        if len(names) != len(members):
            raise ValueError(f"{len(members)} members but {len(names)} names")
        groups: dict[tuple, list[int]] = {}
        for i, m in enumerate(members):
            if not (isinstance(m, tuple | list) and len(m) == 2 and callable(m[0])):
                raise TypeError(f"member {names[i]!r}: expected an (apply, params) pair, got {type(m).__name__}")
            groups.setdefault((id(m[0]), leaf_signature(m[1])), []).append(i)
        return cls(
            [
                FunctionStack(
                    members[idx[0]][0],
                    stack_trees([members[i][1] for i in idx]),
                    [names[i] for i in idx],
                    input_shape=input_shape,
                    num_classes=num_classes,
                )
                for idx in groups.values()
            ]
        )

    @classmethod
    def from_flax(
        cls,
        module: Any,
        variables: Sequence[PyTree],
        names: Sequence[str] | None = None,
        *,
        input_shape: Sequence[int],
        apply_kwargs: dict | None = None,
        name: str | None = None,
    ) -> Pool:
        """A one-stack pool of a flax linen ``module`` with one variables dict per member.

        See :class:`sarjax.models.flax_stacks.LinenStack` (eval mode: ``module.apply(variables, x,
        **apply_kwargs)`` with ``mutable=False``; ``apply_kwargs`` defaults to ``train=False`` /
        ``deterministic=True`` when ``__call__`` takes such an argument).

        Args:
          module: a ``flax.linen.Module``.
          variables: one ``module.init(...)`` result per member (same structure); ``batch_stats``
            and other collections are used as they are (running statistics).
          names: member names (default ``<module class>/i``).
          input_shape: one input's shape.
          apply_kwargs: keyword arguments of every ``module.apply`` call.
          name: the architecture's name (checkpoint builder key; default: the module's class name).
        """
        return cls(
            [
                LinenStack.from_members(
                    module, variables, names, input_shape=input_shape, apply_kwargs=apply_kwargs, name=name
                )
            ]
        )

    @classmethod
    def from_nnx(
        cls,
        modules: Sequence[Any],
        names: Sequence[str] | None = None,
        *,
        input_shape: Sequence[int],
        name: str | None = None,
    ) -> Pool:
        """A pool of flax nnx modules; members with the same graph (``nnx.split``'s graphdef) share a stack.

        See :class:`sarjax.models.flax_stacks.NnxStack` (eval mode: copies of the modules are put
        in ``.eval()`` mode; the user's modules are not changed).

        Args:
          modules: ``nnx.Module`` instances, ``module(x [B, *input_shape]) -> [B, C]``.
          names: member names (default ``<class>/i``).
          input_shape: one input's shape.
          name: the architecture's name for every stack (checkpoint builder key; default: the class name).
        """
        return cls(NnxStack.group(modules, names, input_shape=input_shape, name=name))

    @classmethod
    def from_torch(
        cls,
        modules: Sequence[Any],
        names: Sequence[str] | None = None,
        *,
        input_shape: Sequence[int],
        channels_last: bool | None = None,
        verify: bool = True,
    ) -> Pool:
        """A pool of PyTorch modules converted to JAX through ``torch.export`` (:mod:`sarjax.models.torch_convert`).

        Members of one architecture (the same exported graph) become one
        :class:`sarjax.models.torch_convert.TorchStack`: stacked params, one vmapped apply.
        Modules are converted in eval mode; normalisation inside the model is kept.

        Args:
          modules: ``torch.nn.Module`` instances taking ``[B, C, H, W]`` float32 and returning ``[B, C]``.
          names: member names (default ``<class>/i``).
          input_shape: one input as sarjax passes it, ``(H, W, C)`` (NHWC, transposed to NCHW inside;
            PyTorch's ``(C, H, W)`` is refused with the ``(H, W, C)`` meant). Modules that run a
            custom ``torch.autograd.Function`` are refused (ValueError naming it).
          channels_last: see :func:`sarjax.models.torch_convert.convert` (default: True for 3-axis shapes).
          verify: compare every member's converted logits with PyTorch's on two random inputs.
        """
        return cls(torch_stacks(modules, input_shape, names, channels_last=channels_last, verify=verify))

    @classmethod
    def concat(cls, *pools: Pool) -> Pool:
        """One pool with the stacks of ``pools`` in order (a heterogeneous pool from pools of any kinds)."""
        return cls([s for p in pools for s in p.stacks])

    # -- structure -----------------------------------------------------------------------------
    @property
    def num_members(self) -> int:
        return len(self.names)

    @property
    def num_classes(self) -> int:
        return self.stacks[0].num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.stacks[0].input_shape)

    @property
    def params(self) -> tuple[PyTree, ...]:
        """The stacks' params in stack order, one pytree each.

        The same tuple object on every access while every stack holds the same params object, so
        ``pool.params is pool.params`` (entries such as ``make_autoattack(pool, ...)`` tell the
        pool's own params from others by identity); rebuilt when a stack's params are replaced.
        """
        cur = tuple(s.params for s in self.stacks)
        hit = self.__dict__.get("_params_cache")
        if hit is not None and len(hit) == len(cur) and all(a is b for a, b in zip(hit, cur)):
            return hit
        self._params_cache = cur
        return cur

    @property
    def member_slices(self) -> tuple[slice, ...]:
        out, start = [], 0
        for s in self.stacks:
            out.append(slice(start, start + s.size))
            start += s.size
        return tuple(out)

    def content_hash(self) -> str:
        """SHA-256 (hex) of everything that determines the pool's outputs except ``conv_impl``.

        Covers the member names, each stack's :meth:`~sarjax.models.stack.BaseStack.hash_spec`
        (its kind and architecture; a zoo spec without ``conv_impl``, which changes how a
        convolution is computed, not its result), and every params leaf's path, shape, dtype and
        bytes, for stacks of every kind. Used to fingerprint checkpoints and resumable runs.
        """
        h = hashlib.sha256()
        for s in self.stacks:
            spec = s.hash_spec()
            if s.kind != "zoo":  # the zoo's hash predates the kinds: keep its bytes
                spec = {"kind": s.kind, **spec}
            h.update(repr((sorted(spec.items()), s.names)).encode())
            for path, leaf in jax.tree_util.tree_flatten_with_path(s.params)[0]:
                a = np.ascontiguousarray(np.asarray(leaf))
                h.update(repr((jax.tree_util.keystr(path), a.shape, str(a.dtype))).encode())
                h.update(a.tobytes())
        return h.hexdigest()

    def with_params(self, params: Sequence[PyTree]) -> Pool:
        """A pool with the same structure and new stacked params (e.g. after training)."""
        return Pool([s.with_params(p) for s, p in zip(self.stacks, params)])

    def with_conv_impl(self, conv_impl: str) -> Pool:
        """The same members (same params) with every convolutional stack's ``conv_impl`` replaced.

        E.g. ``pool.with_conv_impl("fused")`` before a joint attack on CPU (docs/models.md); MLP
        stacks and stacks of other kinds (no ``with_conv_impl``) are unchanged.  Raises ValueError
        for an unknown ``conv_impl``.
        """
        if conv_impl not in CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
        return Pool([s.with_conv_impl(conv_impl) if isinstance(s, Stack) else s for s in self.stacks])

    def select(self, index: Sequence[int] | np.ndarray) -> Pool:
        """A new pool with the members at ``index`` (host side, for building sub-pools; use masks in attacks)."""
        index = [int(i) for i in np.atleast_1d(index)]
        if all(isinstance(s, Stack) for s in self.stacks):  # the zoo regroups equal architectures
            members = []
            for i in index:
                for s, sl in zip(self.stacks, self.member_slices):
                    if sl.start <= i < sl.stop and isinstance(s, Stack):
                        members.append((s.arch, s.member(i - sl.start)))
            return Pool.from_members(members, [self.names[i] for i in index])
        groups: dict[int, list[int]] = {}  # stack -> local indices, stacks by first appearance
        for i in index:
            if not 0 <= i < self.num_members:
                raise IndexError(f"member index {i} out of range for a pool of {self.num_members}")
            for j, sl in enumerate(self.member_slices):
                if sl.start <= i < sl.stop:
                    groups.setdefault(j, []).append(i - sl.start)
        return Pool([self.stacks[j].select(loc) for j, loc in groups.items()])

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.name} x{s.size}" for s in self.stacks)
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
        """``jax.jit(self.apply)``; for a pool of zoo stacks, the one jitted apply of every pool
        of its architectures (:func:`_zoo_pool_apply`: compiled once per structure and shape, not
        once per pool object)."""
        if all(type(s) is Stack for s in self.stacks):
            return functools.partial(_jit_zoo_pool_apply, tuple(s.arch for s in self.stacks))  # type: ignore[union-attr]
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
        # argmax on the host (the first maximal class, as jnp.argmax): an eager jnp.argmax compiles per shape
        out = [np.asarray(self._jit_apply(self.params, x[i : i + batch])).argmax(-1) for i in range(0, len(x), batch)]
        return np.concatenate(out, axis=1).astype(np.int32)

    def accuracy(self, x: jax.Array, y: np.ndarray, batch: int = 1000) -> np.ndarray:
        """[M] accuracy of each member on (x: [B, *S], y: [B])."""
        return (self.predict(x, batch) == np.asarray(y)[None]).mean(axis=1)
