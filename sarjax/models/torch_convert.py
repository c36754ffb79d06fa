"""PyTorch modules as pure JAX functions, through ``torch.export``.

:func:`convert` exports a module in eval mode with :func:`torch.export.export` on a batch of ONE
example, lowers the program to core ATen (``ExportedProgram.run_decompositions()``) and returns a
:class:`TorchProgram` whose ``apply(params, x [B, *input_shape]) -> logits [B, C]`` interprets that
graph with ``jax.numpy`` / ``jax.lax`` (once, at trace time: the compiled function holds no Python
and no host callback), plus the params: the module's parameters, buffers and lifted tensor
constants as a nested dict of ``jnp`` arrays (float32), keyed by their dotted names
(``{"layer1": {"0": {"conv1": {"weight": ...}}}}``).  Members of one architecture therefore stack
on a leading axis and run under one ``jax.vmap``.

Why not torchax: torchax 0.0.7 - 0.0.13 (every version on the package index) fail to import with
torch 2.13 (they register ``aten.prod.dim_Dimname``, an overload torch removed), so sarjax
interprets the exported graph itself.  The op set is the one image classifiers use (the op table,
:mod:`sarjax.models.torch_ops`, lists it in :data:`sarjax.models.torch_ops.SUPPORTED_OPS`); anything
else raises :class:`NotImplementedError` naming the op, the graph node, the module path and the
source line, at conversion time.  This module is the exporter: it exports the module, walks the
graph calling the op table's functions, and builds the stacks of ``Pool.from_torch``.

Semantics:

* the graph is exported with a symbolic batch dimension and runs on the whole batch (the
  convolutions see ``[B, ...]``); a module that does not export that way (it specialises on the
  batch size) is exported for one example and ``jax.vmap``-ped over the batch
  (:attr:`TorchProgram.batched` says which).  Eval-mode classifiers have no cross-sample
  operations, so both compute each image as the PyTorch module computes it alone.
* convolutions (``conv_impl``): on CPU, ``"auto"`` runs the graph channels-last (``"nhwc"``: 4-D
  activations stay NHWC from convolution to convolution, batch norm, activations, residual adds
  and pooling follow the layout, other ops see NCHW), as ``lax.conv`` is fastest in that layout.
* images: sarjax inputs are NHWC in [0, 1]; with ``channels_last=True`` (the default for a
  3-dimensional ``input_shape`` ``(H, W, C)``) the apply transposes to NCHW at its input.
* in-model normalisation (mean/std buffers or constants, as RobustBench models have) is part of
  the graph and of the params, so it is honoured and stacks like any weight.
* custom ``torch.autograd.Function`` classes are refused (their forward is inlined into the exported
  graph, so the converted model would differentiate it instead of running their backward).
* limits: eval mode only (dropout is the identity, batch norm uses running statistics; a graph
  that updates buffers is refused), no data-dependent Python control flow (``torch.export``
  traces one path), float32 (float64 / half params are cast to float32, integer buffers to
  int32), no transposed convolutions, no max-pool indices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from sarjax.models.fused import cnn_pool_apply
from sarjax.models.stack import BaseStack, check_member_output, register_kind
from sarjax.models.torch_fused import match_cnn
from sarjax.models.torch_ops import (
    ATEN_OPS,
    CONV_IMPLS,
    ChannelsLast,
    Missing,
    aten_name,
    conv,
    conv_nd,
    nhwc_call,
    node_location,
    op_handler,
    to_nchw,
)

PyTree = Any

UNROLL_MEMBERS = 16
"""The most members :meth:`TorchStack.apply_prepared` unrolls on CPU (more: ``lax.map``, a loop)."""


# ------------------------------------------------------------------------------------ conversion


def _to_jax(t) -> jax.Array:
    a = t.detach().cpu()
    if a.is_floating_point():
        return jnp.asarray(a.float().numpy())
    if str(a.dtype) in ("torch.int64", "torch.int32", "torch.int16"):
        return jnp.asarray(a.to(dtype=__import__("torch").int32).numpy())  # optional dependency: torch
    return jnp.asarray(a.numpy())


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b.c": v}`` -> ``{"a": {"b": {"c": v}}}``."""
    out: dict[str, Any] = {}
    for key, v in flat.items():
        d = out
        *head, last = key.split(".")
        for h in head:
            d = d.setdefault(h, {})
            if not isinstance(d, dict):
                raise ValueError(f"torch state name {key!r} collides with another tensor's name")
        if last in d:
            raise ValueError(f"torch state name {key!r} collides with another tensor's name")
        d[last] = v
    return out


def _lookup(tree: dict[str, Any], key: str):
    for part in key.split("."):
        tree = tree[part]
    return tree


@dataclass(frozen=True, eq=False)
class TorchProgram:
    """One PyTorch architecture as a pure JAX function (from :func:`convert`).

    Attributes:
      name: a label (the module's class name).
      input_shape: one example's shape as sarjax sees it (``(H, W, C)`` for images).
      num_classes: size of the output's last axis.
      channels_last: whether ``apply`` transposes NHWC inputs to the module's NCHW.
      signature: SHA-256 of the exported graph, the placeholders' targets, shapes and dtypes:
        two modules with the same signature share one ``apply`` (and stack).
      param_shapes: ``{dotted name: shape}`` of the params the graph reads.
      conv_impl: how 2-D convolutions run: ``"nhwc"`` (the graph runs channels-last,
        ``lax.conv_general_dilated`` in NHWC / HWIO), ``"xla"`` (``lax.conv_general_dilated`` in
        NCHW), ``"im2col"`` (NCHW, strided slices and one contraction) or ``"auto"`` (nhwc on the
        CPU backend, xla elsewhere; the fused kernel for a zoo-style CNN, see :attr:`fused_cnn`).
        Same logits to float32 rounding.
      batched: whether the graph was exported with a symbolic batch (``apply`` runs it on the
        whole batch) or for one example (``apply`` vmaps it).
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    channels_last: bool
    signature: str
    param_shapes: dict[str, tuple[int, ...]] = field(repr=False)
    _graph: Any = field(repr=False)
    _placeholders: tuple[tuple[str, str | None], ...] = field(repr=False)
    _output: Any = field(repr=False)
    conv_impl: str = "auto"

    batched: bool = True

    @property
    def resolved_conv_impl(self) -> str:
        """The lowering :attr:`conv_impl` picks on the current backend (``"auto"``: ``"nhwc"`` on CPU,
        ``"xla"`` elsewhere)."""
        if self.conv_impl == "auto":
            return "nhwc" if jax.default_backend() == "cpu" else "xla"
        return self.conv_impl

    def _run(self, params: PyTree, x: jax.Array) -> jax.Array:
        """Interpret the graph on a batch: x [N, *input_shape] -> [N, C] (N = 1 for a batch-1 export)."""
        from torch.fx.node import Node, map_arg  # optional dependency: torch

        impl = self.resolved_conv_impl
        nhwc = impl == "nhwc"
        inp: Any = x
        if self.channels_last:
            inp = ChannelsLast(x) if (nhwc and x.ndim == 4) else jnp.moveaxis(x, -1, 1)  # NHWC -> NCHW
        env: dict[str, Any] = {}
        for ph, target in self._placeholders:
            env[ph] = inp if target is None else _lookup(params, target)

        def fetch(n: Node):
            v = env[n.name]
            if isinstance(v, Missing):
                raise NotImplementedError(f"{node_location(n)} uses the {v.what}, which sarjax does not compute")
            return v

        for node in self._graph.nodes:
            if node.op != "call_function":
                continue
            args = map_arg(node.args, fetch)
            kwargs = map_arg(node.kwargs, fetch)
            kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "layout", "pin_memory", "memory_format")}
            handler = op_handler(node)
            try:
                if nhwc:
                    env[node.name] = nhwc_call(aten_name(node.target), handler, tuple(args), kwargs)
                else:
                    if handler is conv or handler is conv_nd:
                        kwargs["impl"] = impl
                    env[node.name] = handler(*args, **kwargs)
            except NotImplementedError as e:
                raise NotImplementedError(f"{e} ({node_location(node)})") from None
        (out,) = map_arg(self._output, fetch)
        out = to_nchw(out)
        if not isinstance(out, jax.Array):
            raise TypeError(f"{self.name}: the graph's output is a {type(out).__name__}, expected one array [N, C]")
        return out

    def apply_one(self, params: PyTree, x: jax.Array) -> jax.Array:
        """Logits of ONE example: params (one member), x: [*input_shape] -> [C]."""
        return self._run(params, x[None])[0]

    def apply(self, params: PyTree, x: jax.Array) -> jax.Array:
        """Logits of one member on a batch: params (one member), x: [B, *input_shape] -> [B, C].

        A graph exported with a symbolic batch (:attr:`batched`, the default) runs on the whole batch
        (the convolutions see ``[B, ...]``); a batch-1 export is ``jax.vmap``-ped over the examples.
        """
        if self.batched:
            return self._run(params, x)
        return jax.vmap(self.apply_one, in_axes=(None, 0))(params, x)

    @cached_property
    def member_apply(self) -> Callable:
        """:meth:`apply` as ONE object per program (stacks hand it to attacks, whose kernels cache on it)."""
        return self.apply

    @cached_property
    def fused_cnn(self):
        """The :class:`sarjax.models.torch_fused.CnnMatch` of this graph when ``conv_impl="auto"`` and
        the graph is a zoo-style CNN (conv -> eval batch-norm -> relu -> 2x2 max-pool, ..., linear ->
        relu -> linear), else None: on the CPU backend such a stack runs the zoo's fused pool kernel."""
        if self.conv_impl != "auto":
            return None
        return match_cnn(self)

    @cached_property
    def jit_apply(self) -> Callable:
        """``jax.jit(self.apply)``, compiled once per input shape."""
        return jax.jit(self.apply)


def _signature(ep, inputs: list[tuple[str, str | None]], state: dict[str, Any], channels_last: bool) -> str:
    h = hashlib.sha256()
    h.update(ep.graph_module.code.encode())
    h.update(repr(inputs).encode())
    h.update(repr(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in state.items())).encode())
    h.update(repr(channels_last).encode())
    return h.hexdigest()


_FAITHFUL_FUNCTIONS = frozenset({"torch.utils.checkpoint.CheckpointFunction"})
"""Custom ``torch.autograd.Function`` classes whose backward is the gradient of their forward (so
converting the forward is exact); every other Function is refused by :func:`convert`."""


def _calling_module(paths: dict[int, str]) -> tuple[str, str] | None:
    """(path, class name) of the innermost submodule of the converted module on the call stack."""
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and id(owner) in paths:
            return paths[id(owner)], type(owner).__name__
        frame = frame.f_back
    return None


@contextlib.contextmanager
def _record_autograd_functions(module, calls: list):
    """Record ``(Function class, calling module)`` for every ``torch.autograd.Function.apply`` run
    inside the block.

    ``torch.export`` inlines a custom Function's forward into the graph and keeps no trace of the
    Function (no higher-order op, no node metadata naming it), so the converter would differentiate
    the forward where PyTorch runs the Function's backward.  The export runs the module's Python
    (non-strict), so wrapping ``Function.apply`` for its duration sees every call.

    The original ``apply`` is called through the descriptor protocol (``__get__(None, cls)``), not
    through ``__func__``: torch <= 2.13 defines it as a Python ``classmethod``, torch 2.14 as the C
    ``classmethod_descriptor`` of ``torch._C._FunctionBase`` (which has no ``__func__``); both bind
    to the calling Function class that way.
    """
    import torch  # optional dependency: torch

    base = torch.autograd.Function
    original = base.__dict__["apply"]  # a classmethod (torch <= 2.13) or a classmethod_descriptor (2.14)
    if not isinstance(original, (classmethod, types.ClassMethodDescriptorType)):
        raise TypeError(
            f"torch.autograd.Function.apply is a {type(original).__name__} in torch {torch.__version__}, "
            "expected a classmethod (torch <= 2.13) or a classmethod_descriptor (torch 2.14): sarjax "
            "cannot record the custom autograd Functions the module runs, so it does not convert it"
        )
    paths = {id(m): p for p, m in module.named_modules()}

    def apply(cls, *args, **kwargs):
        calls.append((cls, _calling_module(paths)))
        return original.__get__(None, cls)(*args, **kwargs)

    base.apply = classmethod(apply)  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield calls
    finally:
        base.apply = original  # pyright: ignore[reportAttributeAccessIssue]


def _refuse_autograd_functions(calls: list) -> None:
    for cls, where in calls:
        qualname = f"{cls.__module__}.{cls.__qualname__}"
        if qualname in _FAITHFUL_FUNCTIONS:
            continue
        place = "" if where is None else f" called in module {where[0] or '<root>'!r} ({where[1]})"
        raise ValueError(
            f"the module uses the custom torch.autograd.Function {qualname}{place}: sarjax converts "
            "its forward and would differentiate that, not its backward, so input gradients would "
            "differ from PyTorch's; replace it by plain tensor ops (its forward, if the backward is "
            "the forward's gradient) before converting"
        )


def _export(module, input_shape: tuple[int, ...], channels_last: bool):
    """``(exported program, batched)``: the export with a symbolic batch dimension (example batch 2),
    or, where the module does not export that way (it specialises on the batch size), on a batch of
    one (``batched=False``: the converted apply vmaps it over the examples)."""
    import torch  # optional dependency: torch

    example_shape = (input_shape[-1], *input_shape[:-1]) if channels_last else tuple(input_shape)
    was_training = module.training
    module.eval()
    calls: list = []
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # torch 2.13 internals
            ep, batched = None, True
            try:
                with _record_autograd_functions(module, calls):
                    example = torch.zeros((2, *example_shape), dtype=torch.float32)
                    (arg_name,) = _forward_arg_names(module)
                    dyn = {arg_name: {0: torch.export.Dim("batch", min=1)}}
                    ep = torch.export.export(module, (example,), dynamic_shapes=dyn, strict=False)
            except Exception:
                ep, batched = None, False
            if ep is None:
                calls.clear()
                try:
                    with _record_autograd_functions(module, calls):
                        example = torch.zeros((1, *example_shape), dtype=torch.float32)
                        ep = torch.export.export(module, (example,), strict=False)
                except Exception as e:
                    hint = _nhwc_hint(module, input_shape, channels_last)
                    if hint is not None:
                        raise ValueError(hint) from e
                    raise
            _refuse_autograd_functions(calls)
            ep = ep.run_decompositions(_decomposition_table())
    finally:
        module.train(was_training)
    return ep, batched


def _forward_arg_names(module) -> list[str]:
    """The names of ``module.forward``'s positional parameters (the export's ``dynamic_shapes`` keys)."""
    import inspect

    params = inspect.signature(module.forward).parameters.values()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not names:
        raise ValueError("forward takes no positional tensor")
    return names[:1]


def _nhwc_hint(module, input_shape: tuple[int, ...], channels_last: bool) -> str | None:
    """The message for an ``input_shape`` written as PyTorch's (C, H, W) when the export failed:
    None unless the module fails on the shape read as (H, W, C) and runs on it read as (C, H, W)."""
    import torch  # optional dependency: torch

    if not channels_last or len(input_shape) != 3:
        return None
    guess = (*input_shape[1:], input_shape[0])
    if guess == input_shape:
        return None

    def runs(nchw: tuple[int, ...]) -> bool:
        try:
            with torch.no_grad():
                module(torch.zeros((1, *nchw), dtype=torch.float32))
        except Exception:
            return False
        return True

    if runs((input_shape[-1], *input_shape[:-1])) or not runs(input_shape):
        return None  # the export failed for another reason, or the shape is wrong in both orders
    return (
        f"input_shape is one example in sarjax's NHWC order (H, W, C), got {input_shape} (the "
        f"module runs on it as NCHW (C, H, W)): did you mean {guess}?"
    )


def _decomposition_table():
    """torch.export's default (core ATen) decompositions, minus the ops interpreted directly.

    Keeping e.g. ``aten.pad`` (reflect / replicate) or ``aten.adaptive_avg_pool2d`` whole avoids
    their decompositions into index arithmetic (``arange``, ``index``) that sarjax does not interpret.
    """
    import torch  # optional dependency: torch

    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if aten_name(op) in ATEN_OPS:
            del table[op]
    return table


def convert(
    module,
    input_shape: Sequence[int],
    *,
    channels_last: bool | None = None,
    name: str | None = None,
    verify: bool = True,
    conv_impl: str = "auto",
) -> tuple[TorchProgram, PyTree]:
    """Convert a PyTorch module into a :class:`TorchProgram` and its params.

    Args:
      module: a ``torch.nn.Module`` taking ``[B, C, H, W]`` (or ``[B, *input_shape]`` when not
        ``channels_last``) float32 and returning logits ``[B, num_classes]``. It is exported in
        eval mode (its training flag is restored afterwards).
      input_shape: one example as sarjax passes it: ``(H, W, C)`` for images.
      channels_last: transpose NHWC inputs to NCHW in ``apply``; default True when
        ``input_shape`` has 3 axes.
      name: label of the program (default: the module's class name).
      verify: run the converted function and the module on a fixed random batch of 2 examples
        and raise ValueError if the logits differ by more than 1e-3 * (1 + max |logit|).
      conv_impl: ``"auto"``, ``"im2col"`` or ``"xla"`` (see :class:`TorchProgram`).

    Returns:
      ``(program, params)``: ``program.apply(params, x [B, *input_shape]) -> [B, C]`` and the
      params as a nested dict of float32 ``jnp`` arrays (integer buffers int32).

    Raises:
      NotImplementedError: an op (or an op's mode, e.g. training-mode batch norm) the converter
        does not interpret, naming the op, the graph node, the module path and the source line.
      TypeError: ``module`` is not a ``torch.nn.Module``, or the installed torch defines
        ``torch.autograd.Function.apply`` as neither a classmethod (torch <= 2.13) nor a C
        classmethod descriptor (torch 2.14), so the Functions a module runs cannot be recorded.
      ValueError: a bad ``input_shape`` (one written as PyTorch's ``(C, H, W)`` is named, with
        the ``(H, W, C)`` meant), a module that runs a custom ``torch.autograd.Function``
        (named, with the calling module's path: its backward would be ignored), an output that
        is not one ``[B, C]`` tensor, or a failed verification.
    """
    import torch  # optional dependency: torch
    from torch.export.graph_signature import InputKind, OutputKind  # optional dependency: torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if conv_impl not in CONV_IMPLS:
        raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
    input_shape = tuple(int(s) for s in input_shape)
    if not input_shape or any(s <= 0 for s in input_shape):
        raise ValueError(f"input_shape must be positive sizes, e.g. (32, 32, 3), got {input_shape}")
    channels_last = len(input_shape) == 3 if channels_last is None else bool(channels_last)
    if channels_last and len(input_shape) < 2:
        raise ValueError(f"channels_last needs an input_shape (..., C) with >= 2 axes, got {input_shape}")
    ep, batched = _export(module, input_shape, channels_last)
    graph = ep.graph_module.graph
    users = {n.name: len(n.users) for n in graph.nodes}
    lifted = {**ep.state_dict, **ep.constants}
    placeholders: list[tuple[str, str | None]] = []
    state: dict[str, Any] = {}
    n_user = 0
    for spec in ep.graph_signature.input_specs:
        ph = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            placeholders.append((ph, None))
            n_user += 1
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            if users.get(ph, 0) == 0:
                continue  # e.g. BatchNorm's num_batches_tracked
            target = str(spec.target)
            placeholders.append((ph, target))
            state[target] = lifted[target]
        else:
            raise NotImplementedError(f"exported input {ph!r} of kind {spec.kind.name} is not supported")
    if n_user != 1:
        raise ValueError(f"the module must take exactly one tensor input, its export has {n_user}")
    for spec in ep.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise NotImplementedError(
                f"the exported graph has a {spec.kind.name} output ({spec.arg.name}): convert an "
                "eval-mode module that does not update its buffers in forward"
            )
    (out_node,) = [n for n in graph.nodes if n.op == "output"]
    outputs = out_node.args[0]
    if len(outputs) != 1:
        raise ValueError(f"the module must return one logits tensor [B, C], its export returns {len(outputs)} outputs")
    for node in graph.nodes:  # unsupported ops fail here, before any tracing
        if node.op == "call_function":
            op_handler(node)
        elif node.op not in ("placeholder", "output", "get_attr"):
            raise NotImplementedError(f"graph node kind {node.op!r} ({node_location(node)}) is not supported")
        if node.op == "get_attr":
            raise NotImplementedError(f"get_attr node ({node_location(node)}) (a submodule call in the graph)")
    params = _nest({k: _to_jax(v) for k, v in state.items()})
    out_val = outputs[0].meta.get("val")
    if out_val is None or out_val.dim() != 2 or (not batched and int(out_val.shape[0]) != 1):
        shape = None if out_val is None else tuple(out_val.shape)
        raise ValueError(f"the module must return logits [B, C]; for a batch of 1 it returns shape {shape}")
    if batched and isinstance(out_val.shape[0], int):
        raise ValueError(
            f"the module must return logits [B, C]; for a batch of B it returns shape {tuple(out_val.shape)}"
        )
    program = TorchProgram(
        name=name or type(module).__name__,
        input_shape=input_shape,
        num_classes=int(out_val.shape[1]),
        channels_last=channels_last,
        signature=_signature(ep, placeholders, state, channels_last),
        param_shapes={k: tuple(v.shape) for k, v in state.items()},
        _graph=graph,
        _placeholders=tuple(placeholders),
        _output=outputs,
        conv_impl=conv_impl,
        batched=batched,
    )
    if verify:
        verify_against_torch(program, params, module)
    return program, params


def verify_against_torch(program: TorchProgram, params: PyTree, module, *, n: int = 2, seed: int = 0) -> float:
    """Max |JAX - PyTorch| logits on ``n`` fixed random inputs in [0, 1); raises ValueError above tolerance.

    The tolerance is ``1e-3 * (1 + max |PyTorch logit|)`` (float32 convolutions summed in another
    order differ at about 1e-6 relative; a wrong op differs at order 1).  A graph exported with a
    symbolic batch is also checked on the first example alone (torch.export traces the batch as a
    size other than 1, so a module that branches on a batch of 1 is caught here).
    """
    import torch  # optional dependency: torch

    x = np.random.default_rng(seed).random((n, *program.input_shape), dtype=np.float32)
    err = 0.0
    # the batch of n, and (a graph exported with a symbolic batch, which torch.export traces as a
    # size other than 1) one example alone
    for xb in (x, x[:1]) if (program.batched and n > 1) else (x,):
        xt = torch.from_numpy(np.moveaxis(xb, -1, 1).copy() if program.channels_last else xb)
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                ref = module(xt).float().numpy()
        finally:
            module.train(was_training)
        with jax.default_matmul_precision("highest"):
            got = np.asarray(program.jit_apply(params, jnp.asarray(xb)))
        e = float(np.max(np.abs(got - ref))) if got.shape == ref.shape else math.inf
        tol = 1e-3 * (1.0 + float(np.max(np.abs(ref))))
        if not math.isfinite(e) or e > tol:
            raise ValueError(
                f"converted {program.name} disagrees with PyTorch on a batch of {len(xb)}: max |logit "
                f"difference| {e:.3g} > {tol:.3g}"
            )
        err = max(err, e)
    return err


@dataclass(frozen=True, eq=False)
class TorchGroup:
    """Modules of one architecture after :func:`convert_many`.

    Attributes:
      program: the shared :class:`TorchProgram`.
      indices: positions of the members in the input list.
      params: the members' params stacked on a leading axis.
    """

    program: TorchProgram
    indices: tuple[int, ...]
    params: PyTree


def convert_many(
    modules: Sequence[Any],
    input_shape: Sequence[int],
    *,
    channels_last: bool | None = None,
    verify: bool = True,
) -> list[TorchGroup]:
    """Convert modules and group those with the same exported graph (same :attr:`TorchProgram.signature`).

    Each group's params are stacked on a leading member axis; groups are ordered by first
    appearance.  Verification (see :func:`convert`) runs for every member.
    """
    groups: dict[str, tuple[TorchProgram, list[int], list[PyTree]]] = {}
    for i, m in enumerate(modules):
        prog, params = convert(m, input_shape, channels_last=channels_last, verify=False)
        if prog.signature not in groups:
            groups[prog.signature] = (prog, [], [])
        groups[prog.signature][1].append(i)
        groups[prog.signature][2].append(params)
    out = []
    for prog, idx, plist in groups.values():
        if verify:
            for i, p in zip(idx, plist):
                verify_against_torch(prog, p, modules[i])
        out.append(TorchGroup(prog, tuple(idx), jax.tree.map(lambda *xs: jnp.stack(xs), *plist)))
    return out


# ------------------------------------------------------------------------------------ the stack


@register_kind
class TorchStack(BaseStack):
    """Members of ONE converted PyTorch architecture (kind ``"torch"``), params stacked.

    ``apply`` runs :attr:`TorchProgram.member_apply` over the stacked params inside one compiled
    kernel (``jax.vmap``; ``lax.map`` on the CPU backend, see :meth:`apply_prepared`): no host
    callback and no Python loop over members.

    Args:
      program: the converted architecture (:func:`convert`).
      params: the members' params (see :func:`convert`) stacked on a leading axis ``[K, ...]``.
      names: ``K`` member names.
      name: the architecture's name: a checkpoint restores the stack through the builder
        registered under it (default: ``program.name``, the module's class name).

    Build it with :func:`torch_stacks` or :meth:`sarjax.models.pool.Pool.from_torch`.
    """

    kind: ClassVar[str] = "torch"

    def __init__(self, program: TorchProgram, params: PyTree, names: Sequence[str], *, name: str | None = None):
        if not isinstance(program, TorchProgram):
            raise TypeError(f"TorchStack: expected a TorchProgram, got {type(program).__name__}")
        self.program = program
        self.params = params
        self.names = tuple(str(n) for n in names)
        self._name = name or program.name
        self._check_members()
        check_member_output(self, program.num_classes)

    @property
    def name(self) -> str:
        return self._name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.program.input_shape

    @property
    def num_classes(self) -> int:
        return self.program.num_classes

    @property
    def member_apply(self) -> Callable:
        return self.program.member_apply

    def spec(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "module_class": self.program.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "channels_last": self.program.channels_last,
            "signature": self.program.signature,
        }

    def hash_spec(self) -> dict:
        """The spec without the graph signature (torch versions may print the same graph differently)."""
        return {k: v for k, v in self.spec().items() if k != "signature"}

    def apply_prepared(self, prepared: PyTree, x: jax.Array) -> jax.Array:
        """Logits ``[K, B, C]`` of the stacked members on the batch ``x [B, *input_shape]``.

        On the CPU backend: the fused pool kernel for a zoo-style CNN (:attr:`TorchProgram.fused_cnn`);
        with channels-last convolutions (``conv_impl`` ``"auto"`` / ``"nhwc"``) and at most
        :data:`UNROLL_MEMBERS` members, the members one after the other, unrolled in the compiled
        call (each runs the graph on the whole batch; a ``lax.map`` loop body runs XLA:CPU's
        convolutions several times slower, and a convolution vmapped over members becomes a
        grouped one);
        otherwise ``lax.map`` over the members (with ``"auto"``: im2col convolutions, vmapped over
        the examples, the faster lowering inside a loop).  Off CPU: ``jax.vmap`` over the members.
        """
        if jax.default_backend() != "cpu":
            return jax.vmap(self.member_apply, in_axes=(0, None))(prepared, x)
        if self.program.fused_cnn is not None:
            m = self.program.fused_cnn
            zoo_params = jax.vmap(lambda p: m.params(lambda name: _lookup(p, name)))(prepared)
            return cnn_pool_apply(m.arch, zoo_params, x)
        k_members = int(jax.tree.leaves(prepared)[0].shape[0])
        if k_members == 1 or (self.program.resolved_conv_impl == "nhwc" and k_members <= UNROLL_MEMBERS):
            f = self.member_apply
            return jnp.stack([f(jax.tree.map(lambda a, k=k: a[k], prepared), x) for k in range(k_members)])
        f = self._looped_program.apply
        return lax.map(lambda p: f(p, x), prepared)

    @cached_property
    def _looped_program(self) -> TorchProgram:
        """The program :meth:`apply_prepared` runs under ``lax.map``: ``"auto"`` picks im2col, per example."""
        if self.program.conv_impl != "auto":
            return self.program
        return dataclasses.replace(self.program, conv_impl="im2col", batched=False)

    def with_params(self, params: PyTree, names: Sequence[str] | None = None) -> TorchStack:
        return TorchStack(self.program, params, self.names if names is None else names, name=self.name)

    @classmethod
    def restore(cls, spec, leaves, paths, names, built) -> TorchStack:
        """``built``: a ``torch.nn.Module`` of the saved architecture (any weights: the saved ones replace them).

        The module is converted again (its graph gives the apply); the saved leaves take the
        structure of its params, whose paths must equal the saved ones.
        """
        try:
            program, template = convert(
                built,
                spec["input_shape"],
                channels_last=spec["channels_last"],
                name=spec.get("module_class"),
                verify=False,
            )
        except (TypeError, ValueError, NotImplementedError):
            raise
        except Exception as e:  # torch.export raises RuntimeError (and others) for a module of another shape
            raise ValueError(
                f"cannot export the builder's module on inputs {spec['input_shape']}: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}"
            ) from e
        flat, treedef = jax.tree_util.tree_flatten_with_path(template)
        want = [jax.tree_util.keystr(p) for p, _ in flat]
        if want != list(paths):
            missing, extra = sorted(set(paths) - set(want)), sorted(set(want) - set(paths))
            raise ValueError(
                f"the builder's torch module has other tensors than the checkpoint: saved only {missing[:5]}, "
                f"module only {extra[:5]}"
            )
        params = jax.tree.unflatten(treedef, [jnp.asarray(l) for l in leaves])
        return cls(program, params, names, name=spec["name"])


def torch_stacks(
    modules: Sequence[Any],
    input_shape: Sequence[int],
    names: Sequence[str] | None = None,
    *,
    channels_last: bool | None = None,
    verify: bool = True,
) -> list[TorchStack]:
    """Convert PyTorch modules into :class:`TorchStack` objects, one per architecture.

    Modules whose exported graphs agree (:attr:`TorchProgram.signature`: same code, same tensor
    names and shapes) share a stack; stacks are ordered by first appearance.  A stack is named
    after its module class, with ``-2``, ``-3``, ... appended when several architectures share a
    class name (the checkpoint builder keys).

    Args:
      modules: ``torch.nn.Module`` instances (see :func:`convert`).
      input_shape: one example as sarjax passes it, ``(H, W, C)`` for images.
      names: member names (default ``<class>/i``).
      channels_last, verify: see :func:`convert` (verification runs for every member).
    """
    modules = list(modules)
    if not modules:
        raise ValueError("expected at least one torch module, got none")
    names = list(names) if names is not None else [f"{type(m).__name__}/{i}" for i, m in enumerate(modules)]
    if len(names) != len(modules):
        raise ValueError(f"{len(modules)} modules but {len(names)} names")
    groups = convert_many(modules, input_shape, channels_last=channels_last, verify=verify)
    seen: dict[str, int] = {}
    out = []
    for g in groups:
        seen[g.program.name] = seen.get(g.program.name, 0) + 1
        label = g.program.name if seen[g.program.name] == 1 else f"{g.program.name}-{seen[g.program.name]}"
        out.append(TorchStack(g.program, g.params, [names[i] for i in g.indices], name=label))
    return out
