"""flax stacks: linen modules (``module.apply`` over stacked variables) and nnx modules (split / merge).

Both run in evaluation mode: batch norm reads its running statistics, dropout is off, and nothing
is mutated (a pool is a fixed set of functions; attacks differentiate it with respect to the
input only).  Params are float32 (sarjax pools compute float32 logits).

- :class:`LinenStack` (kind ``"linen"``): ONE ``flax.linen.Module`` and one variables dict per
  member (``module.init`` results: ``params``, ``batch_stats``, ...), stacked on a leading axis;
  a member's logits are ``module.apply(variables, x, mutable=False, **apply_kwargs)``.
- :class:`NnxStack` (kind ``"nnx"``): ``flax.nnx`` modules of one graph (``nnx.split``'s
  graphdef); a member's logits are ``nnx.merge(graphdef, state)(x)`` on a copy of the module put
  in ``.eval()`` mode.  Random-number state (``nnx.Rngs`` streams) is not stacked: it is taken
  from the first member and unused in eval mode.

Build pools with :meth:`sarjax.models.pool.Pool.from_flax` and :meth:`sarjax.models.pool.Pool.from_nnx`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from sarjax.models.stack import (
    StoredStack,
    check_member_output,
    leaf_signature,
    register_kind,
    stack_trees,
    tree_from_paths,
)

PyTree = Any

# evaluation-mode values of the mode arguments a linen __call__ commonly takes
_EVAL_ARGS = {
    "train": False,
    "training": False,
    "is_training": False,
    "deterministic": True,
    "use_running_average": True,
}


def eval_kwargs(module: Any) -> dict:
    """The evaluation-mode keyword arguments of a linen module's ``__call__`` (``train=False``,
    ``deterministic=True``, ... for the ones its signature takes; ``{}`` when it takes none)."""
    try:
        params = inspect.signature(type(module).__call__).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in _EVAL_ARGS.items() if k in params}


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class _LinenApply:
    """``f(variables, x) = module.apply(variables, x, mutable=False, **kwargs)``; equal for equal modules and kwargs."""

    def __init__(self, module: Any, kwargs: dict):
        self.module, self.kwargs = module, dict(kwargs)

    def __call__(self, variables: PyTree, x: jax.Array) -> jax.Array:
        return self.module.apply(variables, x, mutable=False, **self.kwargs)

    def _key(self):
        return (self.module, tuple(sorted(self.kwargs.items())))

    def __eq__(self, other):
        return isinstance(other, _LinenApply) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


def _plain(tree: PyTree) -> PyTree:
    """Variables as plain nested dicts (a FrozenDict unfrozen) so that a checkpoint restores the same tree."""
    from flax.core import unfreeze  # flax only for flax pools: keeps sarjax.models light

    return unfreeze(tree)


@register_kind
class LinenStack(StoredStack):
    """A flax linen module with its members' variables stacked on a leading axis.

    Args:
      module: a ``flax.linen.Module`` (hyperparameters bound as its fields).
      params: the members' variables stacked (every leaf ``[K, ...]``), e.g.
        ``stack_trees([v0, v1, ...])`` of ``module.init`` results.
      names: ``K`` member names.
      input_shape: one input's shape, e.g. ``(32, 32, 3)``.
      apply_kwargs: keyword arguments of every ``module.apply`` call (default :func:`eval_kwargs`:
        ``train=False`` / ``deterministic=True`` when ``__call__`` takes them). Must be JSON data
        (they go to checkpoints).
      name: the architecture's name (checkpoint builder key; default: the module's class name).
      num_classes: checked against the module's output (inferred when None).

    Raises:
      TypeError: an apply that fails on ``[B, *input_shape]`` float32 (e.g. batch norm in training
        mode: pass ``apply_kwargs``), or logits that are not float32 ``[B, C]``.
    """

    kind: ClassVar[str] = "linen"

    def __init__(
        self,
        module: Any,
        params: PyTree,
        names: Sequence[str],
        *,
        input_shape: Sequence[int],
        apply_kwargs: dict | None = None,
        name: str | None = None,
        num_classes: int | None = None,
    ):
        self.module = module
        self.params = _plain(params)
        self.names = tuple(str(n) for n in names)
        self._input_shape = tuple(int(s) for s in input_shape)
        self.apply_kwargs = dict(eval_kwargs(module) if apply_kwargs is None else apply_kwargs)
        self._name = name or type(module).__name__
        self._apply = _LinenApply(module, self.apply_kwargs)
        self._check_members()
        self._num_classes = check_member_output(self, num_classes)

    @classmethod
    def from_members(
        cls,
        module: Any,
        variables: Sequence[PyTree],
        names: Sequence[str] | None = None,
        *,
        input_shape: Sequence[int],
        apply_kwargs: dict | None = None,
        name: str | None = None,
    ) -> LinenStack:
        """Stack one variables dict per member (all of ``module``'s structure, shapes and dtypes)."""
        variables = [_plain(v) for v in variables]
        if not variables:
            raise ValueError("a pool needs at least one member, got an empty list of variables")
        label = name or type(module).__name__
        names = list(names) if names is not None else [f"{label}/{i}" for i in range(len(variables))]
        if len(names) != len(variables):
            raise ValueError(f"{len(variables)} variables but {len(names)} names")
        ref = leaf_signature(variables[0])
        for n, v in zip(names, variables):
            if leaf_signature(v) != ref:
                raise ValueError(
                    f"member {n!r}: its variables differ in structure, shapes or dtypes from member {names[0]!r}'s "
                    f"(one module, one structure: build another pool for another architecture)"
                )
        return cls(module, stack_trees(variables), names, input_shape=input_shape, apply_kwargs=apply_kwargs, name=name)

    def spec(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "module_class": _qualname(self.module),
            "module": _ADDRESS.sub("", repr(self.module)),  # fields; no object addresses (stable across runs)
            "apply_kwargs": self.apply_kwargs,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
        }

    def with_params(self, params: PyTree, names: Sequence[str] | None = None) -> LinenStack:
        out = LinenStack.__new__(LinenStack)
        vars(out).update(vars(self))
        out.params = _plain(params)
        out.names = tuple(str(n) for n in (self.names if names is None else names))
        out._check_members()
        return out

    @classmethod
    def restore(cls, spec, leaves, paths, names, built) -> LinenStack:
        """``built``: the linen module (variables come back as the nested dicts they were)."""
        import flax.linen as nn  # flax only for flax pools: keeps sarjax.models light

        if not isinstance(built, nn.Module):
            raise TypeError(f"a 'linen' stack's builder must return a flax.linen.Module, got {type(built).__name__}")
        return cls(
            built,
            tree_from_paths(paths, leaves),
            names,
            input_shape=spec["input_shape"],
            apply_kwargs=spec.get("apply_kwargs"),
            name=spec["name"],
            num_classes=spec["num_classes"],
        )


class _NnxApply:
    """``f(state, x) = nnx.merge(graphdef, rng_state, state)(x)``."""

    def __init__(self, graphdef: Any, rng_state: Any):
        self.graphdef, self.rng_state = graphdef, rng_state

    def __call__(self, state: PyTree, x: jax.Array) -> jax.Array:
        from flax import nnx  # flax only for flax pools: keeps sarjax.models light

        return nnx.merge(self.graphdef, self.rng_state, state)(x)


def _nnx_eval_split(module: Any) -> Any:
    """(graphdef, rng state, state) of an eval-mode COPY of ``module`` (the user's module is not changed)."""
    from flax import nnx  # flax only for flax pools: keeps sarjax.models light

    if not isinstance(module, nnx.Module):
        raise TypeError(f"expected a flax.nnx.Module, got {type(module).__name__}")
    copy = nnx.merge(*nnx.split(module))
    copy.eval()
    return nnx.split(copy, nnx.RngState, ...)


def _paths(tree: PyTree) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@register_kind
class NnxStack(StoredStack):
    """flax nnx modules of one graph with their states stacked on a leading axis.

    Build it with :meth:`group` (or :meth:`sarjax.models.pool.Pool.from_nnx`).

    Args:
      graphdef: the members' ``nnx.split`` graphdef (of an eval-mode module).
      rng_state: the ``nnx.RngState`` part (kept from one member; unused in eval mode).
      params: the members' states (every other variable: ``Param``, ``BatchStat``, ...) stacked.
      names: member names.
      input_shape: one input's shape.
      name: the architecture's name (checkpoint builder key; default: the module's class name).
      module_class: the module's qualified class name (recorded in the spec).
      num_classes: checked against the module's output (inferred when None).
    """

    kind: ClassVar[str] = "nnx"

    def __init__(
        self,
        graphdef: Any,
        rng_state: Any,
        params: PyTree,
        names: Sequence[str],
        *,
        input_shape: Sequence[int],
        name: str,
        module_class: str = "",
        num_classes: int | None = None,
    ):
        self.graphdef, self.rng_state = graphdef, rng_state
        self.params = params
        self.names = tuple(str(n) for n in names)
        self._input_shape = tuple(int(s) for s in input_shape)
        self._name = name
        self.module_class = module_class
        self._apply = _NnxApply(graphdef, rng_state)
        self._check_members()
        self._num_classes = check_member_output(self, num_classes)

    @classmethod
    def group(
        cls,
        modules: Sequence[Any],
        names: Sequence[str] | None = None,
        *,
        input_shape: Sequence[int],
        name: str | None = None,
    ) -> list[NnxStack]:
        """Stacks of ``modules``: members with equal graphdefs and state shapes / dtypes share one.

        Stacks are ordered by first appearance, members keep their order within a stack.
        """
        modules = list(modules)
        if not modules:
            raise ValueError("a pool needs at least one member, got an empty list of modules")
        names = list(names) if names is not None else [f"{name or type(m).__name__}/{i}" for i, m in enumerate(modules)]
        if len(names) != len(modules):
            raise ValueError(f"{len(modules)} modules but {len(names)} names")
        groups: dict[Any, list[int]] = {}
        splits = []
        for i, m in enumerate(modules):
            try:
                gd, rng, state = _nnx_eval_split(m)
            except TypeError as e:
                raise TypeError(f"member {names[i]!r}: {e}") from e
            splits.append((gd, rng, state))
            groups.setdefault((gd, leaf_signature(state)), []).append(i)
        stacks = []
        for idx in groups.values():
            gd, rng, _ = splits[idx[0]]
            m0 = modules[idx[0]]
            stacks.append(
                cls(
                    gd,
                    rng,
                    stack_trees([splits[i][2] for i in idx]),
                    [names[i] for i in idx],
                    input_shape=input_shape,
                    name=name or type(m0).__name__,
                    module_class=_qualname(m0),
                )
            )
        return stacks

    def spec(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "module_class": self.module_class,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
        }

    def with_params(self, params: PyTree, names: Sequence[str] | None = None) -> NnxStack:
        out = NnxStack.__new__(NnxStack)
        vars(out).update(vars(self))
        out.params = params
        out.names = tuple(str(n) for n in (self.names if names is None else names))
        out._check_members()
        return out

    @classmethod
    def restore(cls, spec, leaves, paths, names, built) -> NnxStack:
        """``built``: an nnx module of the architecture (its weights are replaced by the saved ones)."""
        gd, rng, state = _nnx_eval_split(built)
        want = _paths(state)
        if want != list(paths):
            diff = sorted(set(want) ^ set(paths))[:4]
            raise ValueError(
                f"the builder's module has state paths that differ from the saved ones (e.g. {diff}; "
                f"{len(want)} paths vs {len(paths)} saved)"
            )
        params = jax.tree.unflatten(jax.tree.structure(state), [np.asarray(l) for l in leaves])
        return cls(
            gd,
            rng,
            params,
            names,
            input_shape=spec["input_shape"],
            name=spec["name"],
            module_class=spec.get("module_class", ""),
            num_classes=spec["num_classes"],
        )
