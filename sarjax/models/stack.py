"""The Stack protocol: what attacks, the cover, sharding and checkpoints need from a group of models.

A *stack* is ONE architecture and the params of its ``K`` members stacked on a leading axis.
Everything above :mod:`sarjax.models` sees a stack only through the members of
:class:`BaseStack` below; no caller reads an architecture's internals.  A :class:`sarjax.models.pool.Pool`
is an ordered tuple of stacks of any kinds (a heterogeneous pool mixes kinds freely).

Implementations (``kind`` in brackets):

- :class:`sarjax.models.pool.Stack` (``"zoo"``): the built-in vision zoo (:class:`sarjax.models.zoo.Arch`).
- :class:`FunctionStack` (``"function"``): a plain ``apply(params_one, x) -> logits`` and stacked params.
- :class:`sarjax.models.flax_stacks.LinenStack` (``"linen"``) and
  :class:`sarjax.models.flax_stacks.NnxStack` (``"nnx"``): flax modules.

Writing a new kind
------------------

Subclass :class:`BaseStack` and provide:

1. the data attributes ``params`` (a pytree whose every leaf has a leading member axis of size
   ``K``) and ``names`` (``K`` unique strings); call :meth:`BaseStack._check_members` at the end
   of ``__init__`` / ``__post_init__``;
2. the properties ``input_shape`` (one input's shape, e.g. ``(32, 32, 3)``; inputs are float32 in
   [0, 1]), ``num_classes`` and ``name`` (a short, stable name of the architecture: checkpoints
   look the builder up under it);
3. the property :attr:`BaseStack.member_apply`: a pure, jit-able and reverse-differentiable
   ``f(params_one, x [B, *input_shape] float32) -> logits [B, C] float32`` for ONE member (no host
   callbacks, no Python state; dropout and other stochastic layers off, batch norm reading its
   running statistics).  Return the same object every time and pass it on in ``with_params``
   (build it once): attack kernels are cached on it;
4. :meth:`BaseStack.spec`: a JSON-able dict with at least ``kind``, ``name``, ``input_shape``
   and ``num_classes``; :meth:`BaseStack.hash_spec` (default: the spec) is what
   :meth:`sarjax.models.pool.Pool.content_hash` mixes in next to the params bytes;
5. :meth:`BaseStack.with_params`: the same architecture with other stacked params (and names);
6. the classmethod :meth:`BaseStack.restore` (``spec``, restored leaves, their paths, names, and
   the object returned by the user's builder) that rebuilds the stack from a checkpoint, and
   :func:`register_kind` at import time (add the module to ``_KIND_MODULES`` so that a checkpoint
   loads without the user importing it first).

Optional, for speed: :meth:`BaseStack.prepare` (x-independent weight layouts, computed once per
attack call outside the step loop) with :meth:`BaseStack.apply_prepared`, or a whole-stack
:meth:`BaseStack.apply` better than the default ``jax.vmap(member_apply)``.  ``apply`` must equal
the per-member loop (within float32 summation-order error) and may not switch on data.
"""

from __future__ import annotations

import abc
import ast
import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

# where the built-in kinds live (imported on demand by :func:`stack_kind`)
_KIND_MODULES = {
    "zoo": "sarjax.models.pool",
    "function": "sarjax.models.stack",
    "linen": "sarjax.models.flax_stacks",
    "nnx": "sarjax.models.flax_stacks",
    "torch": "sarjax.models.torch_convert",
    "self-ensemble": "sarjax.defenses.self_ensemble",
}
_KINDS: dict[str, type[BaseStack]] = {}
_K = TypeVar("_K", bound="type[BaseStack]")


def register_kind(cls: _K) -> _K:
    """Register a :class:`BaseStack` subclass under ``cls.kind`` (usable as a class decorator)."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{cls.__name__}: a stack kind needs a non-empty string class attribute 'kind'")
    _KINDS[kind] = cls
    return cls


def stack_kind(kind: str) -> type[BaseStack]:
    """The :class:`BaseStack` subclass registered for ``kind`` (importing its module if needed).

    Raises:
      ValueError: for a kind that no module registers.
    """
    if kind not in _KINDS and kind in _KIND_MODULES:
        importlib.import_module(_KIND_MODULES[kind])
    if kind not in _KINDS:
        raise ValueError(f"unknown stack kind {kind!r}; known: {sorted(set(_KINDS) | set(_KIND_MODULES))}")
    return _KINDS[kind]


def stack_trees(trees: Sequence[PyTree]) -> PyTree:
    """Stack a sequence of identically structured pytrees on a new leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack_tree(tree: PyTree, i: int) -> PyTree:
    """Member ``i`` of a stacked pytree."""
    return jax.tree.map(lambda a: a[i], tree)


def leaf_signature(tree: PyTree) -> tuple:
    """(treedef, ((shape, dtype), ...)): trees with equal signatures stack together."""
    leaves, treedef = jax.tree.flatten(tree)
    return (treedef, tuple((tuple(np.shape(l)), str(jnp.asarray(l).dtype)) for l in leaves))


def _callable_name(fn: Any) -> str:
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{mod}.{qual}"


class BaseStack(abc.ABC):
    """One architecture with ``K`` members whose params are stacked on a leading axis.

    Attributes:
      kind: the registered kind (class attribute), e.g. ``"zoo"``, ``"function"``, ``"linen"``.
      params: pytree; every leaf ``[K, ...]``.
      names: ``K`` member names.
    """

    kind: ClassVar[str] = ""
    params: PyTree
    names: tuple[str, ...]

    # -- what a kind provides ----------------------------------------------------------------
    @property
    @abc.abstractmethod
    def name(self) -> str:
        """A short, stable name of the architecture (the key of its builder in a checkpoint)."""

    @property
    @abc.abstractmethod
    def input_shape(self) -> tuple[int, ...]:
        """One input's shape (inputs are ``[B, *input_shape]`` float32 in [0, 1])."""

    @property
    @abc.abstractmethod
    def num_classes(self) -> int:
        """Number of logits per input."""

    @property
    @abc.abstractmethod
    def member_apply(self) -> Callable[[PyTree, jax.Array], jax.Array]:
        """``f(params_one, x [B, *S]) -> [B, C]`` float32: logits of ONE member (no leading axis on its params).

        The same object on every access and across :meth:`with_params` (attack kernels are cached on it).
        """

    @abc.abstractmethod
    def spec(self) -> dict:
        """A JSON-able description: ``kind``, ``name``, ``input_shape``, ``num_classes`` and the kind's own fields."""

    @abc.abstractmethod
    def with_params(self, params: PyTree, names: Sequence[str] | None = None) -> BaseStack:
        """The same architecture with other stacked params (and, optionally, other member names)."""

    @classmethod
    @abc.abstractmethod
    def restore(
        cls, spec: dict, leaves: list[np.ndarray], paths: list[str], names: Sequence[str], built: Any
    ) -> BaseStack:
        """Rebuild a stack from a checkpoint.

        Args:
          spec: what :meth:`spec` returned when the stack was saved.
          leaves: the stacked params leaves ``[K, ...]``, in ``jax.tree.leaves`` order of the saved params.
          paths: their ``jax.tree_util.keystr`` paths in the saved params.
          names: the member names.
          built: what the user's builder for ``spec["name"]`` returned (None for kinds that need none).
        """

    #: whether :meth:`restore` needs a user-supplied builder (the zoo restores from its spec alone)
    needs_builder: ClassVar[bool] = True

    # -- shared behaviour ----------------------------------------------------------------------
    def _check_members(self) -> None:
        """Validate the leading member axis and the names (call at the end of construction)."""
        sizes = {np.shape(l)[0] if np.ndim(l) else None for l in jax.tree.leaves(self.params)}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(f"stack {self.name}: params leaves must share one leading member axis, got sizes {sizes}")
        (n,) = sizes
        if len(self.names) != n:
            raise ValueError(f"stack {self.name}: {n} members but {len(self.names)} names")

    @property
    def size(self) -> int:
        """Number of members ``K``."""
        return len(self.names)

    def member(self, i: int) -> PyTree:
        """Member ``i``'s params (no leading axis)."""
        return unstack_tree(self.params, i)

    def select(self, index: Sequence[int]) -> BaseStack:
        """The members at ``index`` (host side), as a stack of the same kind."""
        idx = np.asarray([int(i) for i in index], np.int32)
        return self.with_params(jax.tree.map(lambda a: a[idx], self.params), [self.names[i] for i in idx])

    def hash_spec(self) -> dict:
        """The part of :meth:`spec` that determines the outputs (hashed by ``Pool.content_hash``)."""
        return self.spec()

    def prepare(self, params: PyTree) -> PyTree:
        """x-independent layouts of the stacked params for :meth:`apply_prepared` (default: params)."""
        return params

    def apply_prepared(self, prepared: PyTree, x: jax.Array) -> jax.Array:
        """:meth:`apply` on the output of :meth:`prepare` (default: ``jax.vmap`` of :meth:`member_apply`)."""
        return jax.vmap(self.member_apply, in_axes=(0, None))(prepared, x)

    def apply(self, params: PyTree, x: jax.Array) -> jax.Array:
        """Logits of every member: params stacked ``[K, ...]``; x: [B, *S] -> [K, B, C]."""
        return self.apply_prepared(self.prepare(params), x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r} x{self.size})"


def check_member_output(stack: BaseStack, num_classes: int | None = None) -> int:
    """Check a stack's member apply on an abstract batch of 2 inputs; returns the class count.

    Raises:
      TypeError: logits that are not float32 ``[B, C]`` (or an apply that fails on ``[B, *input_shape]``).
      ValueError: a class count other than ``num_classes`` (when given).
    """
    x = jax.ShapeDtypeStruct((2, *stack.input_shape), jnp.float32)
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.asarray(a).dtype), stack.params)
    try:
        out = jax.eval_shape(stack.member_apply, one, x)
    except Exception as e:
        raise TypeError(
            f"stack {stack.name}: the member apply fails on inputs [B, {', '.join(map(str, stack.input_shape))}] "
            f"float32: {type(e).__name__}: {e}"
        ) from e
    if not hasattr(out, "shape") or len(out.shape) != 2 or out.shape[0] != 2:
        raise TypeError(f"stack {stack.name}: the member apply must return logits [B, C], got {out}")
    if out.dtype != jnp.float32:
        raise TypeError(
            f"stack {stack.name}: logits must be float32 (sarjax pools are float32), got {out.dtype}; "
            f"cast the params or the outputs to float32"
        )
    c = int(out.shape[1])
    if num_classes is not None and int(num_classes) != c:
        raise ValueError(f"stack {stack.name}: num_classes={num_classes} but the apply returns {c} logits")
    return c


_PATH_TOKEN = re.compile(r"""\[('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\d+)\]|\.(\w+)""")


def tree_from_paths(paths: Sequence[str], leaves: Sequence[Any]) -> PyTree:
    """Rebuild nested dicts / lists from ``keystr`` paths (``['a'][0]['w']``) and their leaves.

    Dict keys become dicts, integer indices lists (tuples come back as lists).

    Raises:
      ValueError: a path with attribute nodes (``.field``: a dataclass or namedtuple, whose type
        the paths do not record) or that is not a keystr.
    """
    root: dict = {}
    for path, leaf in zip(paths, leaves):
        toks = []
        pos = 0
        for m in _PATH_TOKEN.finditer(path):
            if m.start() != pos:
                break
            pos = m.end()
            if m.group(2) is not None:
                raise ValueError(
                    f"params path {path!r} has an attribute node; the builder must give the params' structure"
                )
            toks.append(ast.literal_eval(m.group(1)))
        if pos != len(path) or not toks:
            raise ValueError(f"cannot parse params path {path!r}")
        node = root
        for t in toks[:-1]:
            node = node.setdefault(t, {})
        node[toks[-1]] = leaf

    def listify(n):
        if not isinstance(n, dict):
            return n
        if n and all(isinstance(k, int) for k in n):
            return [listify(n[k]) for k in sorted(n)]
        return {k: listify(v) for k, v in n.items()}

    return listify(root)


class StoredStack(BaseStack):
    """A :class:`BaseStack` whose protocol properties read what its constructor stored.

    For kinds that wrap a user's apply (:class:`FunctionStack`, the flax stacks): the constructor
    sets ``_name``, ``_input_shape``, ``_num_classes`` and ``_apply`` (the member apply: keep the
    same object across :meth:`~BaseStack.with_params` so kernels cached on it are shared).
    """

    _name: str
    _input_shape: tuple[int, ...]
    _num_classes: int
    _apply: Callable

    @property
    def name(self) -> str:
        return self._name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._input_shape

    @property
    def num_classes(self) -> int:
        return self._num_classes

    @property
    def member_apply(self) -> Callable:
        return self._apply


@register_kind
class FunctionStack(StoredStack):
    """A plain ``apply(params_one, x) -> logits`` with its members' params stacked.

    Args:
      apply: pure ``apply(params_one, x [B, *input_shape] float32) -> [B, C] float32`` for ONE member.
      params: stacked params (every leaf ``[K, ...]``); see :func:`stack_trees`.
      names: ``K`` member names.
      input_shape: one input's shape.
      num_classes: checked against the apply's output (inferred when None).
      name: the architecture's name (default: the apply's qualified name); a checkpoint restores
        through the builder registered under it.

    Raises:
      ValueError / TypeError: params without one leading member axis, a names count that differs,
        an apply that does not return float32 ``[B, C]``.
    """

    kind: ClassVar[str] = "function"

    def __init__(
        self,
        apply: Callable,
        params: PyTree,
        names: Sequence[str],
        *,
        input_shape: Sequence[int],
        num_classes: int | None = None,
        name: str | None = None,
    ):
        if not callable(apply):
            raise TypeError(f"FunctionStack: apply must be callable, got {type(apply).__name__}")
        self._apply = apply
        self.params = params
        self.names = tuple(str(n) for n in names)
        self._input_shape = tuple(int(s) for s in input_shape)
        self._name = name or _callable_name(apply).rsplit(".", 1)[-1]
        self._check_members()
        self._num_classes = check_member_output(self, num_classes)

    def spec(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "apply": _callable_name(self._apply),
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
        }

    def with_params(self, params: PyTree, names: Sequence[str] | None = None) -> FunctionStack:
        return FunctionStack(
            self._apply,
            params,
            self.names if names is None else names,
            input_shape=self.input_shape,
            num_classes=self.num_classes,
            name=self.name,
        )

    @classmethod
    def restore(cls, spec, leaves, paths, names, built) -> FunctionStack:
        """``built``: the apply, or ``(apply, params_one)`` whose structure the params take
        (without it, params come back as nested dicts and lists)."""
        if isinstance(built, tuple) and len(built) == 2 and callable(built[0]):
            apply, template = built
            treedef = jax.tree.structure(template)
            if treedef.num_leaves != len(leaves):
                raise ValueError(
                    f"the builder's example params have {treedef.num_leaves} leaves, the checkpoint {len(leaves)}"
                )
            params = jax.tree.unflatten(treedef, leaves)
        elif callable(built):
            apply, params = built, tree_from_paths(paths, leaves)
        else:
            raise TypeError(
                f"a 'function' stack's builder must return the apply or (apply, example params), got {type(built).__name__}"
            )
        return cls(
            apply, params, names, input_shape=spec["input_shape"], num_classes=spec["num_classes"], name=spec["name"]
        )
