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
interprets the exported graph itself.  The op set is the one image classifiers use (see
:data:`SUPPORTED_OPS`); anything else raises :class:`NotImplementedError` naming the op, the graph
node, the module path and the source line, at conversion time.

Semantics:

* the graph is exported for one example (batch 1) and ``jax.vmap``-ped over the batch, so a
  converted model computes each image as the PyTorch module computes it alone; eval-mode models
  without cross-sample operations (every classifier in eval mode) give the batched outputs.
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
import hashlib
import math
import operator
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from sarjax.models.stack import BaseStack, check_member_output, register_kind
from sarjax.models.zoo import window_max

PyTree = Any
_INT64_MAX = 9223372036854775807


# ----------------------------------------------------------------------------------- op handlers


class _Missing:
    """A value the converter does not compute (e.g. max-pool indices); using it raises."""

    def __init__(self, what: str):
        self.what = what


def _spatial(v, n: int) -> tuple[int, ...]:
    """A torch int-or-list spatial argument as an ``n``-tuple (a 1-list broadcasts)."""
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(a) for a in v)
    return v * n if len(v) == 1 else v


def _channel_view(p, ndim: int):
    """A per-channel [C] vector shaped to broadcast against an NC... tensor of rank ``ndim``."""
    return p.reshape((1, -1) + (1,) * (ndim - 2))


def _conv(x, w, b=None, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1, impl="xla"):
    """aten.convolution on NC... tensors; ``impl="im2col"``: 2-D convolutions as one matmul (CPU)."""
    if transposed:
        raise NotImplementedError("aten.convolution with transposed=True (ConvTranspose) is not supported")
    n = x.ndim - 2
    ks, dil, st = tuple(w.shape[2:]), _spatial(dilation, n), _spatial(stride, n)
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * n
        elif padding == "same":  # torch: total d*(k-1), the odd element on the right
            pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(ks, dil)]
        else:
            raise NotImplementedError(f"convolution padding={padding!r}")
    else:
        pads = [(p, p) for p in _spatial(padding, n)]
    if impl == "im2col" and n == 2:
        y = _conv2d_im2col(x, w, st, pads, dil, int(groups))
    else:
        sp = "DHW"[3 - n :]
        dn = lax.conv_dimension_numbers(x.shape, w.shape, (f"NC{sp}", f"OI{sp}", f"NC{sp}"))
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=st,
            padding=pads,
            rhs_dilation=dil,
            dimension_numbers=dn,
            feature_group_count=int(groups),
        )
    return y if b is None else y + _channel_view(b, y.ndim)


def _conv2d_im2col(x, w, stride, pads, dil, groups):
    """A 2-D convolution as shifted strided slices and one contraction (XLA's convolution
    gradients are slow on CPU; the zoo's ``conv_impl="im2col"`` does the same, in NHWC)."""
    nb, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    x = jnp.pad(x, ((0, 0), (0, 0), pads[0], pads[1]))
    ho = (x.shape[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (x.shape[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    cols = [
        x[
            :,
            :,
            i * dil[0] : i * dil[0] + stride[0] * (ho - 1) + 1 : stride[0],
            j * dil[1] : j * dil[1] + stride[1] * (wo - 1) + 1 : stride[1],
        ]
        for i in range(kh)
        for j in range(kw)
    ]
    patches = jnp.stack(cols, axis=2).reshape(nb, groups, cg, kh * kw, ho, wo)
    wg = w.reshape(groups, o // groups, cg, kh * kw)
    y = jnp.einsum("ngckhw,gock->ngohw", patches, wg)
    return y.reshape(nb, o, ho, wo)


def _conv_nd(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, impl="xla"):
    return _conv(x, w, b, stride, padding, dilation, False, 0, groups, impl)


def _batch_norm_eval(x, w, b, mean, var, eps):
    y = (x - _channel_view(mean, x.ndim)) * lax.rsqrt(_channel_view(var, x.ndim) + eps)
    if w is not None:
        y = y * _channel_view(w, x.ndim)
    if b is not None:
        y = y + _channel_view(b, x.ndim)
    return y


def _bn_legit_no_training(x, w, b, mean, var, momentum, eps):
    del momentum
    return (_batch_norm_eval(x, w, b, mean, var, eps), _Missing("batch-norm saved mean"), _Missing("saved rstd"))


def _batch_norm(x, w, b, mean, var, training, momentum, eps, cudnn_enabled=True):
    del momentum, cudnn_enabled
    if training or mean is None:
        raise NotImplementedError("batch_norm in training mode (convert the module in eval mode)")
    return _batch_norm_eval(x, w, b, mean, var, eps)


def _native_batch_norm(x, w, b, mean, var, training, momentum, eps):
    return (_batch_norm(x, w, b, mean, var, training, momentum, eps), _Missing("saved mean"), _Missing("saved rstd"))


def _layer_norm(x, normalized_shape, w=None, b=None, eps=1e-5, cudnn_enable=True):
    del cudnn_enable
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mu = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=axes, keepdims=True)
    y = (x - mu) * lax.rsqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def _native_layer_norm(x, normalized_shape, w, b, eps):
    return (_layer_norm(x, normalized_shape, w, b, eps), _Missing("layer-norm mean"), _Missing("rstd"))


def _native_group_norm(x, w, b, n, c, hw, groups, eps):
    del n, hw
    shape = x.shape
    g = x.reshape((shape[0], int(groups), -1))
    mu = jnp.mean(g, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(g - mu), axis=-1, keepdims=True)
    y = ((g - mu) * lax.rsqrt(var + eps)).reshape(shape)
    if w is not None:
        y = y * _channel_view(w, x.ndim)
    if b is not None:
        y = y + _channel_view(b, x.ndim)
    del c
    return (y, _Missing("group-norm mean"), _Missing("rstd"))


def _pool_geometry(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> tuple[int, int]:
    """(output length, extra right padding) of a torch pooling window along one axis."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:  # torch: the last window must start inside the input
        out -= 1
    extra = max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))
    return out, extra


def _max_pool(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = len(_spatial(kernel_size, 1)) if not isinstance(kernel_size, int) else 2
    n = max(n, 1)
    k = _spatial(kernel_size, n)
    n = len(k)
    s = _spatial(stride, n) if (stride is not None and stride != [] and stride != ()) else k
    p, d = _spatial(padding, n), _spatial(dilation, n)
    pads = [(0, 0)] * (x.ndim - n)
    for i in range(n):
        _, extra = _pool_geometry(x.shape[x.ndim - n + i], k[i], s[i], p[i], d[i], bool(ceil_mode))
        pads.append((p[i], p[i] + extra))
    lead = (1,) * (x.ndim - n)
    if k == s and all(pi == 0 for pi in p) and all(di == 1 for di in d) and all(hi == 0 for _, hi in pads):
        # non-overlapping windows (e.g. 2x2 / stride 2): a reshape and a max, whose gradient is a
        # select (reduce_window's is a select-and-scatter, slow on CPU); the trailing rows that
        # floor mode drops are cropped first
        spatial = x.shape[x.ndim - n :]
        outs = [sz // ki for sz, ki in zip(spatial, k)]
        x = x[(Ellipsis, *(slice(0, o * ki) for o, ki in zip(outs, k)))]
        shape = x.shape[: x.ndim - n] + tuple(v for o, ki in zip(outs, k) for v in (o, ki))
        axes = tuple(x.ndim - n + 2 * i + 1 for i in range(n))
        return window_max(x.reshape(shape), axes)  # gradient to one element per window, as torch's
    return lax.reduce_window(x, -jnp.inf, lax.max, lead + k, lead + s, pads, window_dilation=lead + d)


def _max_pool_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return (_max_pool(x, kernel_size, stride, padding, dilation, ceil_mode), _Missing("max-pool indices"))


def _avg_pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    k = _spatial(kernel_size, 2) if isinstance(kernel_size, int) else tuple(kernel_size)
    n = len(k)
    s = _spatial(stride, n) if (stride is not None and stride != [] and stride != ()) else k
    p = _spatial(padding, n)
    lead = (1,) * (x.ndim - n)
    pads, ones_pads, extras = [(0, 0)] * (x.ndim - n), [], []
    for i in range(n):
        _, extra = _pool_geometry(x.shape[x.ndim - n + i], k[i], s[i], p[i], 1, bool(ceil_mode))
        pads.append((p[i], p[i] + extra))
        extras.append(extra)
    total = lax.reduce_window(x, 0.0, lax.add, lead + k, lead + s, pads)
    if divisor_override:
        return total / divisor_override
    spatial = x.shape[x.ndim - n :]
    if count_include_pad:  # torch counts the zero padding, not the ceil-mode overhang
        ones = jnp.ones(tuple(sz + 2 * pi for sz, pi in zip(spatial, p)), x.dtype)
        ones_pads = [(0, e) for e in extras]
    else:
        ones = jnp.ones(spatial, x.dtype)
        ones_pads = [(pi, pi + e) for pi, e in zip(p, extras)]
    count = lax.reduce_window(ones, 0.0, lax.add, k, s, ones_pads)
    return total / count


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """[out, size] averaging matrix of torch's adaptive pooling (windows floor(i*L/o)..ceil((i+1)*L/o))."""
    a = np.zeros((out, size), np.float32)
    for i in range(out):
        lo, hi = (i * size) // out, -(-((i + 1) * size) // out)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a


def _adaptive_avg_pool(x, output_size):
    n = len(output_size) if not isinstance(output_size, int) else 2
    out = _spatial(output_size, n)
    for i in range(n):
        ax = x.ndim - n + i
        size = x.shape[ax]
        o = size if out[i] is None else out[i]
        if o == size:
            continue
        if o == 1:
            x = jnp.mean(x, axis=ax, keepdims=True)
            continue
        a = jnp.asarray(_adaptive_matrix(size, o), x.dtype)
        x = jnp.moveaxis(jnp.tensordot(x, a, axes=((ax,), (1,))), -1, ax)
    return x


def _pad_nd(x, pad, mode: str, value=0.0):
    pad = list(pad)
    widths = [(0, 0)] * x.ndim
    for j in range(len(pad) // 2):
        widths[x.ndim - 1 - j] = (pad[2 * j], pad[2 * j + 1])
    if mode == "constant":
        cfg = [(lo, hi, 0) for lo, hi in widths]  # lax.pad accepts negative widths (cropping), as torch does
        return lax.pad(x, jnp.asarray(value, x.dtype), cfg)
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise NotImplementedError(f"{mode} padding with negative widths")
    return jnp.pad(x, widths, mode={"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


def _pad(x, pad, mode="constant", value=None):
    return _pad_nd(x, pad, mode, 0.0 if value is None else value)


def _reduce_dims(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return tuple(d % x.ndim for d in ([dim] if isinstance(dim, int) else dim))


def _mean(x, dim=None, keepdim=False, dtype=None):
    y = jnp.mean(x, axis=_reduce_dims(x, dim), keepdims=keepdim)
    return y if dtype is None else y.astype(_dtype(dtype))


def _sum(x, dim=None, keepdim=False, dtype=None):
    y = jnp.sum(x, axis=_reduce_dims(x, dim), keepdims=keepdim)
    return y if dtype is None else y.astype(_dtype(dtype))


def _view(x, size):
    return jnp.reshape(x, tuple(int(s) for s in size))


def _expand(x, size, implicit=False):
    del implicit
    size = list(size)
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if (s == -1 and i >= lead) else int(s) for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


def _slice(x, dim=0, start=None, end=None, step=1):
    idx = [slice(None)] * x.ndim
    end = None if end is None or end >= _INT64_MAX else end
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


def _squeeze(x, dim=None):
    if dim is None:
        return jnp.squeeze(x)
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = tuple(d % x.ndim for d in dims if x.shape[d] == 1)  # torch: squeezing a non-1 dim is a no-op
    return jnp.squeeze(x, dims) if dims else x


def _flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return x.reshape(1)
    s, e = start_dim % x.ndim, end_dim % x.ndim
    return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1 :])


def _split(x, split_size, dim=0):
    n = x.shape[dim]
    if isinstance(split_size, int):
        bounds = list(range(split_size, n, split_size))
    else:
        bounds = list(np.cumsum(split_size)[:-1])
    return list(jnp.split(x, bounds, axis=dim))


def _softplus(x, beta=1.0, threshold=20.0):
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


def _gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=(approximate == "tanh"))


def _div(a, b, rounding_mode=None):
    if rounding_mode is None:
        return jnp.true_divide(a, b)
    q = jnp.true_divide(a, b)
    return jnp.floor(q) if rounding_mode == "floor" else jnp.trunc(q)


def _clamp(x, min=None, max=None):  # noqa: A002 - torch's argument names
    if min is not None:
        x = jnp.maximum(x, min)
    if max is not None:
        x = jnp.minimum(x, max)
    return x


def _dropout(x, p=0.5, train=False):
    if train:
        raise NotImplementedError("dropout in training mode (convert the module in eval mode)")
    return x


def _native_dropout(x, p, train):
    if train:
        raise NotImplementedError("dropout in training mode (convert the module in eval mode)")
    return (x, _Missing("dropout mask"))


_DTYPES: dict[str, Any] = {
    "torch.float32": jnp.float32,
    "torch.float64": jnp.float32,  # sarjax computes in float32
    "torch.float16": jnp.float32,
    "torch.bfloat16": jnp.float32,
    "torch.int64": jnp.int32,
    "torch.int32": jnp.int32,
    "torch.int16": jnp.int16,
    "torch.int8": jnp.int8,
    "torch.uint8": jnp.uint8,
    "torch.bool": jnp.bool_,
}


def _dtype(d):
    if d is None:
        return None
    try:
        return _DTYPES[str(d)]
    except KeyError:
        raise NotImplementedError(f"tensor dtype {d}") from None


def _to_copy(x, dtype=None, **_):
    return x if dtype is None else jnp.asarray(x).astype(_dtype(dtype))


def _full(size, fill_value, dtype=None, **_):
    dt = _dtype(dtype) or (jnp.float32 if isinstance(fill_value, float) else None)
    return jnp.full(tuple(int(s) for s in size), fill_value, dt)


def _full_like(x, fill_value, dtype=None, **_):
    return jnp.full(x.shape, fill_value, _dtype(dtype) or x.dtype)


def _scalar_tensor(v, dtype=None, **_):
    return jnp.asarray(v, _dtype(dtype) or jnp.float32)


def _identity(x, *_, **__):
    return x


def _noop(*_, **__):
    return None


def _addmm(bias, a, b, beta=1, alpha=1):
    return beta * bias + alpha * (a @ b)


def _linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


# Handler per ATen op name (the schema name without "aten::" and without the overload: the handlers
# follow the overloads' argument order, which agrees across the overloads listed here).
_ATEN: dict[str, Callable] = {
    # convolution / linear algebra
    "convolution": _conv,
    "conv1d": _conv_nd,
    "conv2d": _conv_nd,
    "conv3d": _conv_nd,
    "addmm": _addmm,
    "mm": jnp.matmul,
    "bmm": jnp.matmul,
    "matmul": jnp.matmul,
    "linear": _linear,
    # normalisation
    "_native_batch_norm_legit_no_training": _bn_legit_no_training,
    "batch_norm": _batch_norm,
    "native_batch_norm": _native_batch_norm,
    "layer_norm": _layer_norm,
    "native_layer_norm": _native_layer_norm,
    "native_group_norm": _native_group_norm,
    # activations
    "relu": jax.nn.relu,
    "gelu": _gelu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "leaky_relu": lambda x, negative_slope=0.01: jnp.where(x > 0, x, x * negative_slope),
    "hardtanh": lambda x, min_val=-1.0, max_val=1.0: jnp.clip(x, min_val, max_val),
    "elu": lambda x, alpha=1.0, scale=1.0, input_scale=1.0: (
        scale * jnp.where(x > 0, x, alpha * jnp.expm1(x * input_scale))
    ),
    "hardswish": lambda x: x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hardsigmoid": lambda x: jnp.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "softplus": _softplus,
    "mish": lambda x: x * jnp.tanh(_softplus(x)),
    "clamp": _clamp,
    "clamp_min": lambda x, m: jnp.maximum(x, m),
    "clamp_max": lambda x, m: jnp.minimum(x, m),
    "_softmax": lambda x, dim, half_to_float=False: jax.nn.softmax(x, axis=dim),
    "_log_softmax": lambda x, dim, half_to_float=False: jax.nn.log_softmax(x, axis=dim),
    "softmax": lambda x, dim, dtype=None: jax.nn.softmax(x, axis=dim),
    "log_softmax": lambda x, dim, dtype=None: jax.nn.log_softmax(x, axis=dim),
    # pooling and padding
    "max_pool2d_with_indices": _max_pool_with_indices,
    "max_pool2d": _max_pool,
    "max_pool1d": _max_pool,
    "avg_pool2d": _avg_pool,
    "avg_pool1d": _avg_pool,
    "adaptive_avg_pool2d": _adaptive_avg_pool,
    "_adaptive_avg_pool2d": _adaptive_avg_pool,
    "adaptive_avg_pool1d": _adaptive_avg_pool,
    "constant_pad_nd": lambda x, pad, value=0.0: _pad_nd(x, pad, "constant", value),
    "pad": _pad,
    "reflection_pad1d": lambda x, pad: _pad_nd(x, pad, "reflect"),
    "reflection_pad2d": lambda x, pad: _pad_nd(x, pad, "reflect"),
    "replication_pad1d": lambda x, pad: _pad_nd(x, pad, "replicate"),
    "replication_pad2d": lambda x, pad: _pad_nd(x, pad, "replicate"),
    # elementwise arithmetic
    "add": lambda a, b, alpha=1: a + alpha * b if alpha != 1 else a + b,
    "sub": lambda a, b, alpha=1: a - alpha * b if alpha != 1 else a - b,
    "rsub": lambda a, b, alpha=1: b - alpha * a if alpha != 1 else b - a,
    "mul": jnp.multiply,
    "div": _div,
    "neg": jnp.negative,
    "abs": jnp.abs,
    "exp": jnp.exp,
    "log": jnp.log,
    "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt,
    "reciprocal": jnp.reciprocal,
    "pow": jnp.power,
    "erf": jax.scipy.special.erf,
    "maximum": jnp.maximum,
    "minimum": jnp.minimum,
    "where": jnp.where,
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
    # reductions
    "mean": _mean,
    "sum": _sum,
    "amax": lambda x, dim=(), keepdim=False: jnp.max(x, axis=_reduce_dims(x, dim), keepdims=keepdim),
    "amin": lambda x, dim=(), keepdim=False: jnp.min(x, axis=_reduce_dims(x, dim), keepdims=keepdim),
    # shapes and copies
    "view": _view,
    "_unsafe_view": _view,
    "reshape": _view,
    "flatten": _flatten,
    "unflatten": lambda x, dim, sizes: x.reshape(x.shape[:dim] + tuple(sizes) + x.shape[dim % x.ndim + 1 :]),
    "permute": lambda x, dims: jnp.transpose(x, tuple(dims)),
    "transpose": lambda x, d0, d1: jnp.swapaxes(x, d0, d1),
    "t": lambda x: x.T,
    "expand": _expand,
    "unsqueeze": jnp.expand_dims,
    "squeeze": _squeeze,
    "slice": _slice,
    "select": lambda x, dim, index: jnp.take(x, index, axis=dim),
    "cat": lambda tensors, dim=0: jnp.concatenate(tensors, axis=dim),
    "stack": lambda tensors, dim=0: jnp.stack(tensors, axis=dim),
    "split": _split,
    "split_with_sizes": _split,
    "clone": _identity,
    "contiguous": _identity,
    "alias": _identity,
    "detach": _identity,
    "lift_fresh_copy": _identity,
    "_to_copy": _to_copy,
    "dropout": _dropout,
    "feature_dropout": _dropout,
    "alpha_dropout": _dropout,
    "native_dropout": _native_dropout,
    # creation
    "full": _full,
    "full_like": _full_like,
    "zeros_like": lambda x, dtype=None, **_: jnp.zeros(x.shape, _dtype(dtype) or x.dtype),
    "ones_like": lambda x, dtype=None, **_: jnp.ones(x.shape, _dtype(dtype) or x.dtype),
    "scalar_tensor": _scalar_tensor,
    "sym_size": lambda x, dim: x.shape[dim],
    "sym_numel": lambda x: int(np.prod(x.shape)),
    # assertions inserted by export: nothing to compute
    "_assert_tensor_metadata": _noop,
    "_assert_scalar": _noop,
    "_assert_async": _noop,
    "sym_constrain_range": _noop,
    "sym_constrain_range_for_size": _noop,
}

_PYTHON_OPS: dict[Any, Callable] = {
    operator.getitem: operator.getitem,
    operator.add: operator.add,
    operator.sub: operator.sub,
    operator.mul: operator.mul,
    operator.floordiv: operator.floordiv,
    operator.truediv: operator.truediv,
    operator.neg: operator.neg,
}

CONV_IMPLS = ("auto", "im2col", "xla")

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(_ATEN))
"""The ATen ops (schema names, any overload) the converter interprets."""


def _aten_name(target) -> str | None:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    ns, _, name = schema.name.partition("::")
    return name if ns == "aten" else schema.name


def _where(node) -> str:
    """Where a graph node comes from: module path and source line (for error messages)."""
    parts = [f"graph node {node.name!r}"]
    stack = node.meta.get("nn_module_stack")
    if stack:
        path, cls = list(stack.values())[-1]
        cls_name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
        parts.append(f"in module {path or '<root>'!r} ({cls_name.rsplit('.', 1)[-1]})")
    trace = node.meta.get("stack_trace")
    if trace:
        lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
        if len(lines) > 1:
            parts.append(f"at {lines[-2]}: {lines[-1]}")
        elif lines:
            parts.append(f"at {lines[-1]}")
    return ", ".join(parts)


def _handler(node) -> Callable:
    if node.target in _PYTHON_OPS:
        return _PYTHON_OPS[node.target]
    name = _aten_name(node.target)
    if name is not None and name in _ATEN:
        return _ATEN[name]
    label = str(node.target) if name is None else f"aten.{name}"
    raise NotImplementedError(
        f"torch op {label} ({_where(node)}) is not supported by sarjax's torch.export converter "
        "(the supported ATen ops: sarjax.models.torch_convert.SUPPORTED_OPS)"
    )


# ------------------------------------------------------------------------------------ conversion


def _to_jax(t) -> jax.Array:
    a = t.detach().cpu()
    if a.is_floating_point():
        return jnp.asarray(a.float().numpy())
    if str(a.dtype) in ("torch.int64", "torch.int32", "torch.int16"):
        return jnp.asarray(a.to(dtype=__import__("torch").int32).numpy())
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
      conv_impl: how 2-D convolutions run: ``"xla"`` (``lax.conv_general_dilated``),
        ``"im2col"`` (strided slices and one contraction: XLA's convolution gradients are slow on
        CPU) or ``"auto"`` (im2col on the CPU backend, xla elsewhere).  Same logits to float32
        rounding.
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

    def apply_one(self, params: PyTree, x: jax.Array) -> jax.Array:
        """Logits of ONE example: params (one member), x: [*input_shape] -> [C]."""
        from torch.fx.node import Node, map_arg

        if self.channels_last:
            x = jnp.moveaxis(x, -1, 0)  # HWC -> CHW
        env: dict[str, Any] = {}
        for ph, target in self._placeholders:
            env[ph] = x[None] if target is None else _lookup(params, target)

        def fetch(n: Node):
            v = env[n.name]
            if isinstance(v, _Missing):
                raise NotImplementedError(f"{_where(n)} uses the {v.what}, which sarjax does not compute")
            return v

        impl = self.conv_impl
        if impl == "auto":
            impl = "im2col" if jax.default_backend() == "cpu" else "xla"
        for node in self._graph.nodes:
            if node.op != "call_function":
                continue
            args = map_arg(node.args, fetch)
            kwargs = map_arg(node.kwargs, fetch)
            kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "layout", "pin_memory", "memory_format")}
            handler = _handler(node)
            if handler is _conv or handler is _conv_nd:
                kwargs["impl"] = impl
            try:
                env[node.name] = handler(*args, **kwargs)
            except NotImplementedError as e:
                raise NotImplementedError(f"{e} ({_where(node)})") from None
        (out,) = map_arg(self._output, fetch)
        return out[0]  # the graph's batch of one

    def apply(self, params: PyTree, x: jax.Array) -> jax.Array:
        """Logits of one member on a batch: params (one member), x: [B, *input_shape] -> [B, C]."""
        return jax.vmap(self.apply_one, in_axes=(None, 0))(params, x)

    @cached_property
    def member_apply(self) -> Callable:
        """:meth:`apply` as ONE object per program (stacks hand it to attacks, whose kernels cache on it)."""
        return self.apply

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
    """
    import torch

    base = torch.autograd.Function
    original = base.__dict__["apply"]  # the classmethod object
    paths = {id(m): p for p, m in module.named_modules()}

    def apply(cls, *args, **kwargs):
        calls.append((cls, _calling_module(paths)))
        return original.__func__(cls, *args, **kwargs)

    base.apply = classmethod(apply)  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield calls
    finally:
        base.apply = original


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
    import torch

    example_shape = (input_shape[-1], *input_shape[:-1]) if channels_last else tuple(input_shape)
    example = torch.zeros((1, *example_shape), dtype=torch.float32)
    was_training = module.training
    module.eval()
    calls: list = []
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # torch 2.13 internals
            try:
                with _record_autograd_functions(module, calls):
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
    return ep


def _nhwc_hint(module, input_shape: tuple[int, ...], channels_last: bool) -> str | None:
    """The message for an ``input_shape`` written as PyTorch's (C, H, W) when the export failed:
    None unless the module fails on the shape read as (H, W, C) and runs on it read as (C, H, W)."""
    import torch

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
    import torch

    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if _aten_name(op) in _ATEN:
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
      TypeError: ``module`` is not a ``torch.nn.Module``.
      ValueError: a bad ``input_shape`` (one written as PyTorch's ``(C, H, W)`` is named, with
        the ``(H, W, C)`` meant), a module that runs a custom ``torch.autograd.Function``
        (named, with the calling module's path: its backward would be ignored), an output that
        is not one ``[B, C]`` tensor, or a failed verification.
    """
    import torch
    from torch.export.graph_signature import InputKind, OutputKind

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
    ep = _export(module, input_shape, channels_last)
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
            _handler(node)
        elif node.op not in ("placeholder", "output", "get_attr"):
            raise NotImplementedError(f"graph node kind {node.op!r} ({_where(node)}) is not supported")
        if node.op == "get_attr":
            raise NotImplementedError(f"get_attr node ({_where(node)}) (a submodule call in the graph)")
    params = _nest({k: _to_jax(v) for k, v in state.items()})
    out_val = outputs[0].meta.get("val")
    if out_val is None or out_val.dim() != 2 or int(out_val.shape[0]) != 1:
        shape = None if out_val is None else tuple(out_val.shape)
        raise ValueError(f"the module must return logits [B, C]; for a batch of 1 it returns shape {shape}")
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
    )
    if verify:
        verify_against_torch(program, params, module)
    return program, params


def verify_against_torch(program: TorchProgram, params: PyTree, module, *, n: int = 2, seed: int = 0) -> float:
    """Max |JAX - PyTorch| logits on ``n`` fixed random inputs in [0, 1); raises ValueError above tolerance.

    The tolerance is ``1e-3 * (1 + max |PyTorch logit|)`` (float32 convolutions summed in another
    order differ at about 1e-6 relative; a wrong op differs at order 1).
    """
    import torch

    x = np.random.default_rng(seed).random((n, *program.input_shape), dtype=np.float32)
    xt = torch.from_numpy(np.moveaxis(x, -1, 1).copy() if program.channels_last else x)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            ref = module(xt).float().numpy()
    finally:
        module.train(was_training)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(program.jit_apply(params, jnp.asarray(x)))
    err = float(np.max(np.abs(got - ref)))
    tol = 1e-3 * (1.0 + float(np.max(np.abs(ref))))
    if not math.isfinite(err) or err > tol:
        raise ValueError(
            f"converted {program.name} disagrees with PyTorch: max |logit difference| {err:.3g} > {tol:.3g}"
        )
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
        """Logits ``[K, B, C]``: ``jax.vmap`` of the member apply over the stacked params; on the CPU
        backend ``lax.map`` (the members one after the other inside the same compiled call): a
        vmapped convolution over members becomes a grouped convolution or a batched contraction,
        slower on CPU (benchmarks/torch_pool_throughput.py: joint PGD on 8 CNNs 1.4-1.75x faster)."""
        if jax.default_backend() == "cpu" and self.size > 1:
            f = self.member_apply
            return lax.map(lambda p: f(p, x), prepared)
        return jax.vmap(self.member_apply, in_axes=(0, None))(prepared, x)

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
