"""Converted PyTorch CNNs on the zoo's fused pool kernel (joint attacks on CPU).

A converted PyTorch graph (:class:`sarjax.models.torch_convert.TorchProgram`) runs op by op:
each convolution, batch-norm, ReLU and max-pool is its own XLA operation, vmapped over the batch
and mapped over the members. The zoo's ``cnn`` family has a pool kernel for shared inputs
(:func:`sarjax.models.fused.cnn_pool_apply`: first layer and pooling folded together, members in
an unrolled scan, a hand-written input gradient) that is about 2x PyTorch on CPU. This module
recognizes converted graphs that ARE such a CNN and maps their params onto it:

  ``[conv2d(k x k, stride 1, padding k // 2) -> (eval batch-norm) -> relu -> max_pool2d(2)] * n
  -> flatten -> linear -> relu -> linear``

(one kernel size ``k``, odd; every pooled map of even side). Eval-mode batch-norm is folded into
the preceding convolution (``w * g / sqrt(v + eps)``, ``(b - mean) * g / sqrt(v + eps) + beta``),
kernels are transposed to HWIO and the first linear layer's rows are permuted from PyTorch's
``(C, H, W)`` flattening to the zoo's ``(H, W, C)``. Logits agree with the op-by-op graph to
float32 rounding (the folded batch-norm and the fused first layer sum in another order).

:func:`match_cnn` returns the :class:`CnnMatch` (the zoo ``Arch`` and the param mapping) or
None for any other graph, which keeps the op-by-op path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from sarjax.models import zoo

_CONV = ("aten.conv2d.default", "aten.convolution.default")
_BN = ("aten._native_batch_norm_legit_no_training.default", "aten.batch_norm.default")
_RELU = ("aten.relu.default", "aten.relu_.default")
_POOL = ("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default")
_FLATTEN = ("aten.view.default", "aten.reshape.default", "aten.flatten.using_ints", "aten._unsafe_view.default")
_LINEAR = ("aten.linear.default",)


@dataclass(frozen=True)
class _Conv:
    w: str
    b: str | None
    bn: tuple[str | None, str | None, str, str, float] | None  # (gamma, beta, mean, var) param names, eps


@dataclass(frozen=True)
class CnnMatch:
    """A converted graph recognized as a zoo ``cnn`` (see the module docstring).

    Attributes:
      arch: the zoo architecture (``conv_impl="fused"``) the graph computes.
      convs: per convolution, the param names of its weight, bias and folded batch-norm.
      dense: (weight, bias) names of the first linear layer.
      out: (weight, bias) names of the output layer.
    """

    arch: zoo.Arch
    convs: tuple[_Conv, ...]
    dense: tuple[str, str | None]
    out: tuple[str, str | None]

    def params(self, get: Callable[[str], Any]) -> dict:
        """ONE member's zoo params from its converted params (``get(dotted name) -> array``).

        Returns:
          ``{"conv{i}": {"w": [k, k, Cin, Cout], "b": [Cout]}, "dense": {"w": [H*W*C, D], "b": [D]},
          "out": {"w": [D, classes], "b": [classes]}}`` (batch-norm folded, rows in (H, W, C) order).
        """
        p: dict[str, dict] = {}
        for i, c in enumerate(self.convs):
            w = get(c.w)  # [O, I, k, k]
            b = get(c.b) if c.b is not None else jnp.zeros((w.shape[0],), w.dtype)
            if c.bn is not None:
                g, beta, mean, var, eps = c.bn
                gamma = get(g) if g is not None else jnp.ones_like(b)
                shift = get(beta) if beta is not None else jnp.zeros_like(b)
                scale = gamma * jax.lax.rsqrt(get(var) + eps)
                w = w * scale[:, None, None, None]
                b = (b - get(mean)) * scale + shift
            p[f"conv{i}"] = {"w": jnp.transpose(w, (2, 3, 1, 0)), "b": b}
        h, wd, _ = self.arch.input_shape
        for _ in self.convs:
            h, wd = h // 2, wd // 2
        c_last = self.arch.widths[-1]
        wd_t = get(self.dense[0])  # [D, C * h * w], PyTorch's (C, H, W) flattening
        d = wd_t.shape[0]
        w_dense = wd_t.reshape(d, c_last, h, wd).transpose(2, 3, 1, 0).reshape(h * wd * c_last, d)
        p["dense"] = {"w": w_dense, "b": _bias(get, self.dense[1], d, wd_t.dtype)}
        wo = get(self.out[0])  # [classes, D]
        p["out"] = {"w": wo.T, "b": _bias(get, self.out[1], wo.shape[0], wo.dtype)}
        return p


def _bias(get, name, n, dtype):
    return get(name) if name is not None else jnp.zeros((n,), dtype)


def _target(node) -> str:
    return str(getattr(node, "target", ""))


def _ints(v, n=2) -> tuple[int, ...] | None:
    if isinstance(v, int):
        return (v,) * n
    if isinstance(v, (list, tuple)) and all(isinstance(a, int) for a in v):
        v = tuple(v)
        return v * n if len(v) == 1 else v
    return None


def match_cnn(program) -> CnnMatch | None:
    """The :class:`CnnMatch` of a converted program, or None if its graph is not a zoo-style CNN.

    Args:
      program: a :class:`sarjax.models.torch_convert.TorchProgram`.

    Returns:
      The match (module docstring: the pattern), or None (the op-by-op path stays).
    """
    try:
        return _match(program)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


def _match(program) -> CnnMatch | None:
    if not program.channels_last or len(program.input_shape) != 3:
        return None
    ph = dict(program._placeholders)  # graph placeholder -> dotted param name (None: the input)
    (x_name,) = [k for k, v in ph.items() if v is None]
    batch_sizes = {  # the symbolic batch size of a graph exported with one (sym_size(x, 0))
        n.name
        for n in program._graph.nodes
        if _target(n) == "aten.sym_size.int" and getattr(n.args[0], "name", None) == x_name and n.args[1] == 0
    }
    nodes = [n for n in program._graph.nodes if n.op == "call_function" and n.name not in batch_sizes]
    users = {n.name: len(n.users) for n in program._graph.nodes}

    def param(a) -> str | None:
        if a is None:
            return None
        if getattr(a, "op", None) != "placeholder" or ph.get(a.name) is None:
            raise ValueError("not a param")
        return ph[a.name]

    def required(a) -> str:
        name = param(a)
        if name is None:
            raise ValueError("no param")
        return name

    h, w, cin = program.input_shape
    prev, i = x_name, 0
    convs, widths, kernel = [], [], None

    def take(n, targets) -> bool:
        return _target(n) in targets and n.args and getattr(n.args[0], "name", None) == prev

    while i < len(nodes) and _target(nodes[i]) in _CONV:
        n = nodes[i]
        if not take(n, _CONV):
            return None
        a = list(n.args) + [None] * 9
        kw = dict(n.kwargs)
        wname, bname = required(a[1]), param(a[2] if len(n.args) > 2 else kw.get("bias"))
        o, ci, kh, kw_ = program.param_shapes[wname]
        if kh != kw_ or kh % 2 == 0 or (kernel is not None and kh != kernel):
            return None
        kernel = kh
        if _target(n) == "aten.convolution.default":
            stride, pad, dil, transposed, _, groups = a[3], a[4], a[5], a[6], a[7], a[8]
            if transposed:
                return None
        else:
            stride, pad, dil, groups = a[3] or 1, a[4] or 0, a[5] or 1, a[6] or 1
        if _ints(stride) != (1, 1) or _ints(pad) != (kh // 2,) * 2 or _ints(dil) != (1, 1) or groups != 1:
            return None
        if ci != cin or users[n.name] != 1:
            return None
        prev, i = n.name, i + 1
        bn = None
        if _target(nodes[i]) in _BN and take(nodes[i], _BN):
            b = nodes[i]
            ba = list(b.args)
            if _target(b) == "aten.batch_norm.default":
                if ba[5]:  # training
                    return None
                eps = float(ba[7])
            else:
                eps = float(ba[6])
            bn = (param(ba[1]), param(ba[2]), required(ba[3]), required(ba[4]), eps)
            if users[b.name] != 1:
                return None
            prev, i = b.name, i + 1
            if _target(b) != "aten.batch_norm.default":  # (out, saved mean, saved rstd): getitem 0
                g = nodes[i]
                if g.target.__name__ != "getitem" or g.args[0].name != prev or g.args[1] != 0 or users[g.name] != 1:
                    return None
                prev, i = g.name, i + 1
        if not take(nodes[i], _RELU) or users[nodes[i].name] != 1:
            return None
        prev, i = nodes[i].name, i + 1
        p = nodes[i]
        if not take(p, _POOL):
            return None
        pa = list(p.args) + [None] * 6
        ks, st = _ints(pa[1]), _ints(pa[2]) if pa[2] not in (None, [], ()) else _ints(pa[1])
        if ks != (2, 2) or st != (2, 2) or _ints(pa[3] or 0) != (0, 0) or _ints(pa[4] or 1) != (1, 1) or pa[5]:
            return None
        if h % 2 or w % 2 or users[p.name] != 1:
            return None
        prev, i = p.name, i + 1
        if _target(p) == "aten.max_pool2d_with_indices.default":
            g = nodes[i]
            if g.target.__name__ != "getitem" or g.args[1] != 0 or users[g.name] != 1:
                return None
            prev, i = g.name, i + 1
        convs.append(_Conv(wname, bname, bn))
        widths.append(o)
        h, w, cin = h // 2, w // 2, o
    if not convs or kernel is None:
        return None
    f = nodes[i]
    if not take(f, _FLATTEN) or users[f.name] != 1:
        return None
    if _target(f) == "aten.flatten.using_ints":
        if tuple(f.args[1:3]) not in ((1, -1), (1, 3)):
            return None
    else:
        size = [1 if getattr(v, "name", None) in batch_sizes else v for v in f.args[1]]
        if tuple(size) not in ((1, h * w * cin), (-1, h * w * cin), (1, -1)):
            return None
    prev, i = f.name, i + 1
    lin: list[tuple[str, str | None]] = []
    for k in range(2):
        n = nodes[i]
        if not take(n, _LINEAR):
            return None
        lin.append((required(n.args[1]), param(n.args[2]) if len(n.args) > 2 else None))
        prev, i = n.name, i + 1
        if k == 0:
            if not take(nodes[i], _RELU) or users[n.name] != 1 or users[nodes[i].name] != 1:
                return None
            prev, i = nodes[i].name, i + 1
    if i != len(nodes):
        return None
    d, fan = program.param_shapes[lin[0][0]]
    classes, d2 = program.param_shapes[lin[1][0]]
    if fan != h * w * cin or d2 != d or classes != program.num_classes:
        return None
    arch = zoo.cnn(
        tuple(widths),
        dense=int(d),
        kernel=int(kernel),
        conv_impl="fused",
        input_shape=tuple(program.input_shape),
        num_classes=int(classes),
    )
    return CnnMatch(arch, tuple(convs), lin[0], lin[1])


__all__ = ["CnnMatch", "match_cnn"]
