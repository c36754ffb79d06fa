"""The ATen op table of the torch.export converter: each core ATen op as a ``jax.numpy`` / ``jax.lax`` function.

:data:`ATEN_OPS` maps an ATen op's schema name (any overload) to the JAX function that computes it,
with PyTorch's argument names and defaults; :data:`SUPPORTED_OPS` lists them. :func:`op_handler`
picks the function of one graph node (ATen or a Python ``operator`` on symbolic sizes) and names
the node, the module path and the source line (:func:`node_location`) when the op is missing.
The exporter (:mod:`sarjax.models.torch_convert`) walks the exported graph and calls them.
Nothing here imports torch: the functions see JAX arrays and Python values only.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from sarjax.models.zoo import window_max

_INT64_MAX = 9223372036854775807


# ----------------------------------------------------------------------------------- op handlers


class Missing:
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


def conv(x, w, b=None, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1, impl="xla"):
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


def conv_nd(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, impl="xla"):
    return conv(x, w, b, stride, padding, dilation, False, 0, groups, impl)


def _batch_norm_eval(x, w, b, mean, var, eps):
    y = (x - _channel_view(mean, x.ndim)) * lax.rsqrt(_channel_view(var, x.ndim) + eps)
    if w is not None:
        y = y * _channel_view(w, x.ndim)
    if b is not None:
        y = y + _channel_view(b, x.ndim)
    return y


def _bn_legit_no_training(x, w, b, mean, var, momentum, eps):
    del momentum
    return (_batch_norm_eval(x, w, b, mean, var, eps), Missing("batch-norm saved mean"), Missing("saved rstd"))


def _batch_norm(x, w, b, mean, var, training, momentum, eps, cudnn_enabled=True):
    del momentum, cudnn_enabled
    if training or mean is None:
        raise NotImplementedError("batch_norm in training mode (convert the module in eval mode)")
    return _batch_norm_eval(x, w, b, mean, var, eps)


def _native_batch_norm(x, w, b, mean, var, training, momentum, eps):
    return (_batch_norm(x, w, b, mean, var, training, momentum, eps), Missing("saved mean"), Missing("saved rstd"))


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
    return (_layer_norm(x, normalized_shape, w, b, eps), Missing("layer-norm mean"), Missing("rstd"))


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
    return (y, Missing("group-norm mean"), Missing("rstd"))


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
    return (_max_pool(x, kernel_size, stride, padding, dilation, ceil_mode), Missing("max-pool indices"))


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


def _adaptive_avg_axes(x, out, axes):
    """Adaptive average pooling of ``x`` to ``out[i]`` along ``axes[i]`` (None: keep the size)."""
    for ax, o in zip(axes, out):
        size = x.shape[ax]
        o = size if o is None else o
        if o == size:
            continue
        if o == 1:
            x = jnp.mean(x, axis=ax, keepdims=True)
            continue
        a = jnp.asarray(_adaptive_matrix(size, o), x.dtype)
        x = jnp.moveaxis(jnp.tensordot(x, a, axes=((ax,), (1,))), -1, ax)
    return x


def _adaptive_avg_pool(x, output_size):
    n = len(output_size) if not isinstance(output_size, int) else 2
    return _adaptive_avg_axes(x, _spatial(output_size, n), [x.ndim - n + i for i in range(n)])


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
    return (x, Missing("dropout mask"))


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
ATEN_OPS: dict[str, Callable] = {
    # convolution / linear algebra
    "convolution": conv,
    "conv1d": conv_nd,
    "conv2d": conv_nd,
    "conv3d": conv_nd,
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

CONV_IMPLS = ("auto", "im2col", "xla", "nhwc")

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(ATEN_OPS))
"""The ATen ops (schema names, any overload) the converter interprets."""


def aten_name(target) -> str | None:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    ns, _, name = schema.name.partition("::")
    return name if ns == "aten" else schema.name


def node_location(node) -> str:
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


def op_handler(node) -> Callable:
    if node.target in _PYTHON_OPS:
        return _PYTHON_OPS[node.target]
    name = aten_name(node.target)
    if name is not None and name in ATEN_OPS:
        return ATEN_OPS[name]
    label = str(node.target) if name is None else f"aten.{name}"
    raise NotImplementedError(
        f"torch op {label} ({node_location(node)}) is not supported by sarjax's torch.export converter "
        "(the supported ATen ops: sarjax.models.torch_ops.SUPPORTED_OPS)"
    )


# ------------------------------------------------------------------ channels-last (NHWC) execution


class ChannelsLast:
    """A logical NCHW tensor held channels-last: ``a`` is ``[N, H, W, C]`` for the graph's ``[N, C, H, W]``.

    The ``conv_impl="nhwc"`` interpreter keeps 4-D activations in this layout from convolution to
    convolution (XLA:CPU's NHWC convolutions and their input gradients are faster than NCHW ones
    and than the im2col lowering: benchmarks/torch_conv_ceiling.py); ops without a channels-last
    version (:func:`nhwc_call`) see the NCHW tensor (one transpose).
    """

    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a


_TO_NHWC = (0, 2, 3, 1)  # logical (NCHW) axis of each physical (NHWC) axis
_TO_PHYS = (0, 3, 1, 2)  # physical axis of each logical axis


def to_nchw(v):
    """``v`` with every :class:`ChannelsLast` (also inside lists / tuples) transposed back to NCHW."""
    if isinstance(v, ChannelsLast):
        return jnp.transpose(v.a, _TO_PHYS)
    if isinstance(v, (list, tuple)):
        return type(v)(to_nchw(u) for u in v)
    return v


def _as_nhwc(v):
    """A tensor operand broadcasting against a logical NCHW tensor, laid out to broadcast against its NHWC form."""
    if isinstance(v, ChannelsLast):
        return v.a
    if not hasattr(v, "ndim") or v.ndim == 0:
        return v
    v = jnp.reshape(v, (1,) * (4 - v.ndim) + tuple(v.shape))
    return jnp.transpose(v, _TO_NHWC)


def _is_scalar(v) -> bool:
    return not hasattr(v, "ndim") or v.ndim == 0


def _conv_nhwc(x, w, b=None, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1):
    if transposed:
        raise NotImplementedError("aten.convolution with transposed=True (ConvTranspose) is not supported")
    del output_padding
    ks, dil, st = tuple(w.shape[2:]), _spatial(dilation, 2), _spatial(stride, 2)
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * 2
        elif padding == "same":
            pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(ks, dil)]
        else:
            raise NotImplementedError(f"convolution padding={padding!r}")
    else:
        pads = [(p, p) for p in _spatial(padding, 2)]
    a, whwio = _as_nhwc(x), jnp.transpose(w, (2, 3, 1, 0))  # OIHW -> HWIO
    if int(groups) == 1:
        y = _conv_nhwc_xla(a, whwio, st, tuple(tuple(p) for p in pads), dil)
    else:
        y = lax.conv_general_dilated(
            a, whwio, st, pads, rhs_dilation=dil, dimension_numbers=_NHWC_DN, feature_group_count=int(groups)
        )
    return ChannelsLast(y if b is None else y + b)


_NHWC_DN = ("NHWC", "HWIO", "NHWC")


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv_nhwc_xla(a, w, stride, pads, dil):
    """``lax.conv_general_dilated`` of ``a [N, H, W, C]`` by ``w [kh, kw, C, O]``, whose input gradient
    is an explicit NHWC convolution by the flipped, transposed kernel: the transpose rule's own
    convolution (kernel dimensions swapped in place) runs 10-30x slower inside a loop body on
    XLA:CPU (an attack's steps), this one as fast as the forward."""
    return lax.conv_general_dilated(a, w, stride, pads, rhs_dilation=dil, dimension_numbers=_NHWC_DN)


def _conv_nhwc_xla_fwd(a, w, stride, pads, dil):
    return _conv_nhwc_xla(a, w, stride, pads, dil), (a, w)


def _conv_nhwc_xla_bwd(stride, pads, dil, res, dy):
    a, w = res
    kh, kw = w.shape[:2]
    pads_t = []
    for i, k in enumerate((kh, kw)):
        keff = dil[i] * (k - 1) + 1
        n, o = a.shape[1 + i], dy.shape[1 + i]
        lo = keff - 1 - pads[i][0]
        pads_t.append((lo, n + keff - 1 - (o - 1) * stride[i] - 1 - lo))
    wt = jnp.transpose(jnp.flip(w, (0, 1)), (0, 1, 3, 2))  # [kh, kw, O, C], flipped
    da = lax.conv_general_dilated(
        dy, wt, (1, 1), pads_t, lhs_dilation=stride, rhs_dilation=dil, dimension_numbers=_NHWC_DN
    )
    _, vjp_w = jax.vjp(
        lambda w: lax.conv_general_dilated(a, w, stride, pads, rhs_dilation=dil, dimension_numbers=_NHWC_DN), w
    )
    return da, vjp_w(dy)[0]


_conv_nhwc_xla.defvjp(_conv_nhwc_xla_fwd, _conv_nhwc_xla_bwd)


def _bn_nhwc(x: ChannelsLast, w, b, mean, var, eps) -> ChannelsLast:
    a = (x.a - mean) * lax.rsqrt(var + eps)
    if w is not None:
        a = a * w
    if b is not None:
        a = a + b
    return ChannelsLast(a)


def _max_pool_nhwc(x: ChannelsLast, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    a = x.a
    k = _spatial(kernel_size, 2)
    s = _spatial(stride, 2) if (stride is not None and stride != [] and stride != ()) else k
    p, d = _spatial(padding, 2), _spatial(dilation, 2)
    pads = [(0, 0)]
    for i in range(2):
        _, extra = _pool_geometry(a.shape[1 + i], k[i], s[i], p[i], d[i], bool(ceil_mode))
        pads.append((p[i], p[i] + extra))
    pads.append((0, 0))
    if k == s and p == (0, 0) and d == (1, 1) and all(hi == 0 for _, hi in pads):
        outs = [a.shape[1 + i] // k[i] for i in range(2)]
        a = a[:, : outs[0] * k[0], : outs[1] * k[1], :]
        a = a.reshape(a.shape[0], outs[0], k[0], outs[1], k[1], a.shape[-1])
        return ChannelsLast(window_max(a, (2, 4)))
    win, strides = (1, *k, 1), (1, *s, 1)
    return ChannelsLast(lax.reduce_window(a, -jnp.inf, lax.max, win, strides, pads, window_dilation=(1, *d, 1)))


def _avg_pool_nhwc(
    x: ChannelsLast, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    a = x.a
    k = _spatial(kernel_size, 2)
    s = _spatial(stride, 2) if (stride is not None and stride != [] and stride != ()) else k
    p = _spatial(padding, 2)
    pads, extras = [(0, 0)], []
    for i in range(2):
        _, extra = _pool_geometry(a.shape[1 + i], k[i], s[i], p[i], 1, bool(ceil_mode))
        pads.append((p[i], p[i] + extra))
        extras.append(extra)
    pads.append((0, 0))
    total = lax.reduce_window(a, 0.0, lax.add, (1, *k, 1), (1, *s, 1), pads)
    if divisor_override:
        return ChannelsLast(total / divisor_override)
    spatial = a.shape[1:3]
    if count_include_pad:
        ones = jnp.ones(tuple(sz + 2 * pi for sz, pi in zip(spatial, p)), a.dtype)
        ones_pads = [(0, e) for e in extras]
    else:
        ones = jnp.ones(spatial, a.dtype)
        ones_pads = [(pi, pi + e) for pi, e in zip(p, extras)]
    count = lax.reduce_window(ones, 0.0, lax.add, k, s, ones_pads)
    return ChannelsLast(total / count[None, :, :, None])


def _adaptive_avg_pool_nhwc(x: ChannelsLast, output_size):
    return ChannelsLast(_adaptive_avg_axes(x.a, _spatial(output_size, 2), [1, 2]))


def _pad_nhwc(name: str, x: ChannelsLast, pad, *rest, **kw):
    """constant_pad_nd / pad on a channels-last tensor (other modes: NCHW)."""
    mode = (rest[0] if rest else kw.get("mode", "constant")) if name == "pad" else "constant"
    value = (rest[1] if len(rest) > 1 else kw.get("value")) if name == "pad" else (rest[0] if rest else kw.get("value"))
    if mode != "constant":
        return to_nchw_call(ATEN_OPS[name], x, pad, *rest, **kw)
    pad = list(pad)
    widths = [(0, 0, 0)] * 4
    for j in range(len(pad) // 2):  # pairs from the last logical axis backwards
        widths[_TO_PHYS[3 - j]] = (pad[2 * j], pad[2 * j + 1], 0)
    return ChannelsLast(lax.pad(x.a, jnp.asarray(0.0 if value is None else value, x.a.dtype), widths))


def to_nchw_call(handler: Callable, *args, **kwargs):
    """``handler`` on NCHW operands (every :class:`ChannelsLast` transposed back)."""
    return handler(*to_nchw(tuple(args)), **{k: to_nchw(v) for k, v in kwargs.items()})


def _reduce_nhwc(fn):
    def reduce(x: ChannelsLast, dim=None, keepdim=False, dtype=None):
        dims = _reduce_dims(x.a, dim)
        logical = tuple(range(4)) if dims is None else dims
        phys = tuple(sorted(_TO_PHYS[d] for d in logical))
        y = fn(x.a, axis=phys, keepdims=keepdim)
        if dtype is not None:
            y = y.astype(_dtype(dtype))
        if keepdim:
            return ChannelsLast(y)
        kept = [_TO_NHWC[i] for i in range(4) if i not in phys]  # logical axis of each kept physical axis
        order = sorted(range(len(kept)), key=lambda i: kept[i])
        return jnp.transpose(y, order) if order != list(range(len(kept))) else y

    return reduce


_NHWC_UNARY = frozenset(
    {
        "relu", "gelu", "silu", "tanh", "sigmoid", "leaky_relu", "hardtanh", "elu", "hardswish", "hardsigmoid",
        "softplus", "mish", "clamp", "clamp_min", "clamp_max", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
        "reciprocal", "erf", "clone", "contiguous", "alias", "detach", "dropout", "feature_dropout",
        "alpha_dropout",
    }
)  # fmt: skip
_NHWC_BINARY = frozenset({"add", "sub", "rsub", "mul", "div", "maximum", "minimum", "pow"})


def nhwc_call(name: str | None, handler: Callable, args: tuple, kwargs: dict):
    """Run one graph op in the channels-last interpreter.

    Args:
      name: the op's ATen name (None for Python operators).
      handler: its NCHW function from :data:`ATEN_OPS` / the Python operators.
      args, kwargs: the operands; 4-D tensors may be :class:`ChannelsLast`.

    Returns:
      The op's result; a 4-D result computed channels-last stays :class:`ChannelsLast`.  Ops with no
      channels-last version get NCHW operands (:func:`to_nchw`).
    """
    if name in ("convolution", "conv2d") and getattr(args[0], "ndim", 4) == 4 and getattr(args[1], "ndim", 0) == 4:
        x = args[0]
        names = ("b", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
        rest: dict[str, Any] = dict(zip(names, args[2:]))
        if name == "conv2d":  # conv2d(x, w, b, stride, padding, dilation, groups)
            rest = dict(zip(("b", "stride", "padding", "dilation", "groups"), args[2:]))
        rest.update({k: v for k, v in kwargs.items() if k != "impl"})
        if "bias" in rest:
            rest["b"] = rest.pop("bias")
        return _conv_nhwc(x, args[1], **rest)
    first = args[0] if args else None
    if isinstance(first, ChannelsLast):
        if name in ("_native_batch_norm_legit_no_training", "native_batch_norm", "batch_norm"):
            x, w, b, mean, var = args[:5]
            if name == "_native_batch_norm_legit_no_training":
                eps = args[6] if len(args) > 6 else kwargs["eps"]
            else:
                training = args[5] if len(args) > 5 else kwargs.get("training", False)
                if training or mean is None:
                    raise NotImplementedError("batch_norm in training mode (convert the module in eval mode)")
                eps = args[7] if len(args) > 7 else kwargs["eps"]
            y = _bn_nhwc(x, w, b, mean, var, eps)
            return y if name == "batch_norm" else (y, Missing("batch-norm saved mean"), Missing("saved rstd"))
        if name in ("max_pool2d", "max_pool2d_with_indices"):
            y = _max_pool_nhwc(*args, **kwargs)
            return y if name == "max_pool2d" else (y, Missing("max-pool indices"))
        if name == "avg_pool2d":
            return _avg_pool_nhwc(*args, **kwargs)
        if name in ("adaptive_avg_pool2d", "_adaptive_avg_pool2d"):
            return _adaptive_avg_pool_nhwc(*args, **kwargs)
        if name in ("constant_pad_nd", "pad"):
            return _pad_nhwc(name, *args, **kwargs)
        if name in ("mean", "sum") and all(_is_scalar(a) or isinstance(a, (list, tuple)) for a in args[1:]):
            return _reduce_nhwc(jnp.mean if name == "mean" else jnp.sum)(*args, **kwargs)
        if name in _NHWC_UNARY and all(_is_scalar(a) for a in args[1:]) and all(_is_scalar(v) for v in kwargs.values()):
            return ChannelsLast(handler(first.a, *args[1:], **kwargs))
    if name in _NHWC_BINARY and len(args) == 2 and any(isinstance(a, ChannelsLast) for a in args):
        if all(isinstance(a, ChannelsLast) or _is_scalar(a) or a.ndim <= 4 for a in args):
            return ChannelsLast(handler(*(_as_nhwc(a) for a in args), **kwargs))
    if name is None and handler is operator.getitem:  # a tuple element (batch norm's output) keeps its layout
        return handler(*args)
    return to_nchw_call(handler, *args, **kwargs)
