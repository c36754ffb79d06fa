"""Vision model zoo for 28x28x1 inputs: MLP, small CNN, small residual CNN.

Each family is an :class:`Arch`, a frozen (hashable) description with a pure
``init(key) -> params`` for ONE member and a pure ``apply(params, x) -> logits``.
Params are plain dicts of arrays, so members stack with ``jax.vmap(arch.init)(keys)``.

Convolutions default to ``conv_impl="im2col"``: the k*k shifted slices of the padded input
are concatenated on the channel axis and multiplied by the reshaped kernel (one matmul).
XLA on CPU runs convolution *gradients* slowly and matmuls well (docs/design.md, "Measured facts");
``conv_impl="xla"`` uses ``lax.conv_general_dilated`` instead, through a convolution whose
batching rule keeps XLA's convolutions ungrouped when a pool's members are stacked (see
:func:`_member_conv`); on CPU it runs a CNN pool's joint attack faster than ``im2col``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "tanh": jnp.tanh,
    "elu": jax.nn.elu,
    "swish": jax.nn.swish,
    "leaky_relu": jax.nn.leaky_relu,
}
FAMILIES = ("mlp", "cnn", "resnet")
CONV_IMPLS = ("im2col", "xla", "fused")

Params = dict[str, Any]


_INIT_KEYS = 64  # Arch.init splits its key into this many (one per layer, at most)


_DIMS = ("NHWC", "HWIO", "NHWC")
_MAX_UNROLL = 64  # larger stacked axes fall back to one grouped convolution


def lax_conv(x, w, pad):
    return jax.lax.conv_general_dilated(x, w, (1, 1), pad, dimension_numbers=_DIMS)


def same_padding(k: int) -> tuple:
    """XLA's SAME padding of a stride-1 ``k x k`` convolution: ``(k - 1) // 2`` before, the rest after."""
    lo = (k - 1) // 2
    return ((lo, k - 1 - lo), (lo, k - 1 - lo))


def input_grad_conv_args(w: jax.Array, pad: tuple) -> tuple:
    """``(kernel, padding)`` of the convolution that maps an output cotangent of
    ``lax_conv(., w, pad)`` to its input cotangent: the flipped kernel with input and output
    channels swapped, and the complementary padding."""
    kh, kw = w.shape[:2]
    (lh, hh), (lw, hw) = pad
    return jnp.flip(w, (0, 1)).swapaxes(2, 3), ((kh - 1 - lh, kh - 1 - hh), (kw - 1 - lw, kw - 1 - hw))


@functools.cache
def _batched_conv(pad: tuple) -> Any:
    """Stride-1 convolution with static padding ``pad`` whose vmap rule avoids grouped convolutions.

    ``jax.vmap`` of ``lax.conv_general_dilated`` over stacked members (inputs and kernels both
    batched) becomes ONE grouped convolution (``feature_group_count = M``), which XLA runs
    slowly on CPU (measured: ~5x slower than M ordinary convolutions, see
    benchmarks/joint_attack_throughput.py).  The rule instead: folds a batched input with a
    shared kernel into the batch dimension; stacks batched kernels on a shared input (the first
    layer of a joint attack, where every member sees the same ``x``) into one convolution with
    ``M * Cout`` output channels; and, with both batched, issues one ordinary convolution per
    member on CPU (a grouped one elsewhere, or past ``_MAX_UNROLL`` members).
    """

    @jax.custom_batching.custom_vmap
    def conv(x, w):
        return lax_conv(x, w, pad)

    @conv.def_vmap
    def _rule(axis_size, in_batched, x, w):
        xb, wb = in_batched
        if xb and not wb:
            n = x.shape[1]
            y = conv(x.reshape(axis_size * n, *x.shape[2:]), w)
            return y.reshape(axis_size, n, *y.shape[1:]), True
        if wb and not xb:
            kh, kw, cin, cout = w.shape[1:]
            y = conv(x, jnp.moveaxis(w, 0, 3).reshape(kh, kw, cin, axis_size * cout))
            return jnp.moveaxis(y.reshape(*y.shape[:3], axis_size, cout), 3, 0), True
        if jax.default_backend() == "cpu" and axis_size <= _MAX_UNROLL:
            return jnp.stack([conv(x[i], w[i]) for i in range(axis_size)]), True
        return jax.vmap(lambda a, b: lax_conv(a, b, pad))(x, w), True

    return conv


@functools.cache
def _conv_with_vjp(pad: tuple) -> Any:
    """:func:`_batched_conv` with its gradients written as convolutions of the same kind
    (``custom_vmap`` functions are not reverse-differentiable on their own)."""
    prim = _batched_conv(pad)
    (lh, hh), (lw, hw) = pad

    @jax.custom_vjp
    def conv(x, w):
        return prim(x, w)

    def fwd(x, w):
        return prim(x, w), (x, w)

    def bwd(res, g):
        x, w = res
        w_t, pad_t = input_grad_conv_args(w, pad)
        dx = _batched_conv(pad_t)(g, w_t)
        # kernel gradient dw[i, j, c, o] = sum_{b,h,w} xp[b, h+i, w+j, c] g[b, h, w, o]: a VALID
        # convolution with channels as the batch and the batch as the contracted channel
        xp = jnp.pad(x, ((0, 0), (lh, hh), (lw, hw), (0, 0)))
        dw = _batched_conv(((0, 0), (0, 0)))(xp.transpose(3, 1, 2, 0), g.transpose(1, 2, 0, 3))
        return dx, dw.transpose(1, 2, 0, 3)

    conv.defvjp(fwd, bwd)
    return conv


def _member_conv(x: jax.Array, w: jax.Array, padding: tuple) -> jax.Array:
    """Stride-1 convolution ``lax.conv_general_dilated(x, w, (1, 1), padding)`` (NHWC, HWIO) that
    stays an ordinary (ungrouped) convolution under ``jax.vmap`` over stacked members.

    Numerically a plain XLA convolution; differentiable in ``x`` and ``w`` (reverse mode only:
    the gradients are custom convolutions, so ``jax.jvp``/``jacfwd`` do not apply).

    Args:
      x: [B, H, W, Cin].
      w: [kh, kw, Cin, Cout].
      padding: ``((lo_h, hi_h), (lo_w, hi_w))`` ints (static).

    Returns:
      [B, H + lo_h + hi_h - kh + 1, W + lo_w + hi_w - kw + 1, Cout].
    """
    pad = tuple((int(a), int(b)) for a, b in padding)
    return _conv_with_vjp(pad)(x, w)


def conv2d(x: jax.Array, p: Params, impl: str = "im2col") -> jax.Array:
    """Stride-1 SAME convolution. x: [B, H, W, Cin]; p["w"]: [k, k, Cin, Cout] -> [B, H, W, Cout]."""
    w = p["w"]
    k, _, cin, cout = w.shape
    if impl in ("xla", "fused"):  # "fused": one member's convolutions are the "xla" ones
        return _member_conv(x, w, same_padding(k)) + p["b"]
    pad = k // 2
    b, h, wd, _ = x.shape
    xp = jnp.pad(x, ((0, 0), (pad, k - 1 - pad), (pad, k - 1 - pad), (0, 0)))
    cols = jnp.concatenate([xp[:, i : i + h, j : j + wd, :] for i in range(k) for j in range(k)], axis=-1)
    return cols @ w.reshape(k * k * cin, cout) + p["b"]


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def window_max(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``jnp.max(x, axes)`` whose derivative goes to ONE maximal element of each window.

    The value is ``jnp.max``'s, bit for bit. The derivative routes each window's tangent to the
    first element (row-major over ``axes``) where ``argmax`` finds the maximum, as PyTorch's
    max-pooling backward routes it to one index. ``jnp.max``'s own rule divides by the number of
    elements equal to the result instead, and XLA may compute the operand again inside the
    fusion that counts them, with other rounding (measured: batch norm -> ReLU -> 2x2 max-pool
    at ``--xla_backend_optimization_level=0``, where the count was 0 for 155 of 384 input
    gradients and the gradient 0/0 = NaN). With one element chosen by ``argmax`` nothing is
    divided. Ties (equal elements in a window) send the whole tangent to the first of them
    where ``jnp.max`` shares it.

    Args:
      x: any array.
      axes: the (static) axes to reduce, as non-negative or negative ints.

    Returns:
      ``x`` reduced over ``axes``.
    """
    return jnp.max(x, axis=axes)


@window_max.defjvp
def _window_max_jvp(axes, primals, tangents):
    (x,), (t,) = primals, tangents
    axes = tuple(a % x.ndim for a in axes)
    rest = [i for i in range(x.ndim) if i not in axes]
    window = math.prod(x.shape[a] for a in axes)

    def flat(a):  # [*rest, window]
        a = jnp.transpose(a, (*rest, *axes))
        return a.reshape(*a.shape[: len(rest)], window)

    first = jnp.argmax(flat(x), axis=-1)[..., None] == jnp.arange(window)
    return jnp.max(x, axis=axes), jnp.sum(jnp.where(first, flat(t), 0.0), axis=-1)


def max_pool2(x: jax.Array) -> jax.Array:
    """2x2 max pooling, stride 2 (floor). x: [B, H, W, C] -> [B, H//2, W//2, C].

    The gradient goes to one maximal element per window (:func:`window_max`)."""
    b, h, w, c = x.shape
    x = x[:, : h // 2 * 2, : w // 2 * 2]
    return window_max(x.reshape(b, h // 2, 2, w // 2, 2, c), (2, 4))


def _dropout(x, key, rate):
    if key is None:
        return x
    rate = jnp.asarray(rate, jnp.float32)
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.maximum(1.0 - rate, 1e-6), 0.0)


@dataclass(frozen=True)
class Arch:
    """One architecture: a family name and its hyperparameters.

    Attributes:
      family: "mlp", "cnn" or "resnet".
      widths: MLP hidden widths / CNN conv channels / ResNet channels per stage.
      act: activation name (see ``ACTIVATIONS``).
      dense: width of the dense layer after the convolutions (cnn, resnet).
      kernel: convolution kernel size.
      blocks: residual blocks per stage (resnet).
      conv_impl: "im2col", "xla" or "fused" (cnn: "xla" convolutions per member, and a pool
        kernel for shared inputs, :mod:`sarjax.models.fused`; other families treat it as "xla").
      input_shape: one input's shape, default (28, 28, 1).
      num_classes: number of logits.
    """

    family: str
    widths: tuple[int, ...]
    act: str = "relu"
    dense: int = 128
    kernel: int = 3
    blocks: int = 1
    conv_impl: str = "im2col"
    input_shape: tuple[int, ...] = (28, 28, 1)
    num_classes: int = 10
    name: str = field(default="", compare=False)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, got {self.act!r}")
        if self.conv_impl not in CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {self.conv_impl!r}")
        if not self.widths or any(int(w) <= 0 for w in self.widths):
            raise ValueError(f"widths must be a non-empty tuple of positive ints, got {self.widths!r}")
        object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
        object.__setattr__(self, "input_shape", tuple(int(s) for s in self.input_shape))
        if not self.name:
            object.__setattr__(self, "name", f"{self.family}-{'x'.join(map(str, self.widths))}-{self.act}")

    # -- serialization ---------------------------------------------------------------------
    def spec(self) -> dict:
        """A JSON-able description; ``Arch.from_spec(arch.spec()) == arch``."""
        return {
            "family": self.family,
            "widths": list(self.widths),
            "act": self.act,
            "dense": self.dense,
            "kernel": self.kernel,
            "blocks": self.blocks,
            "conv_impl": self.conv_impl,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "name": self.name,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> Arch:
        s = dict(spec)
        s["widths"] = tuple(s["widths"])
        s["input_shape"] = tuple(s["input_shape"])
        return cls(**s)

    # -- model -----------------------------------------------------------------------------
    def init_plan(self) -> tuple[tuple[str, tuple[int, ...], float], ...]:
        """The layers :meth:`init` draws, in the order they take their keys.

        Returns:
          ``(name, weight shape, scale)`` per layer: layer ``j`` draws its weights as
          ``jax.random.normal(jax.random.split(key, 64)[j], shape) * scale`` (He-normal: ``scale =
          sqrt(gain / fan_in)``) and its bias ``zeros(shape[-1])``.
        """
        h, w, c = self.input_shape
        plan: list[tuple[str, tuple[int, ...], float]] = []

        def dense(name: str, fan_in: int, fan_out: int, gain: float = 2.0) -> None:
            plan.append((name, (fan_in, fan_out), math.sqrt(gain / fan_in)))

        def conv(name: str, k: int, cin: int, cout: int, gain: float = 2.0) -> None:
            plan.append((name, (k, k, cin, cout), math.sqrt(gain / (k * k * cin))))

        if self.family == "mlp":
            fan = h * w * c
            for i, width in enumerate(self.widths):
                dense(f"dense{i}", fan, width)
                fan = width
            dense("out", fan, self.num_classes, gain=1.0)
            return tuple(plan)
        if self.family == "cnn":
            cin = c
            for i, ch in enumerate(self.widths):
                conv(f"conv{i}", self.kernel, cin, ch)
                cin = ch
                h, w = h // 2, w // 2
        else:  # resnet
            cin = self.widths[0]
            conv("stem", self.kernel, c, cin)
            h, w = h // 2, w // 2
            for s, ch in enumerate(self.widths):
                if ch != cin:
                    dense(f"proj{s}", cin, ch, gain=1.0)
                for b in range(self.blocks):
                    conv(f"s{s}b{b}c0", self.kernel, ch, ch)
                    conv(f"s{s}b{b}c1", self.kernel, ch, ch, gain=0.5)
                cin = ch
                if s < len(self.widths) - 1:
                    h, w = h // 2, w // 2
            h, w = h // 2, w // 2
        dense("dense", h * w * cin, self.dense)
        dense("out", self.dense, self.num_classes, gain=1.0)
        return tuple(plan)

    def init(self, key: jax.Array) -> Params:
        """Initialise ONE member (He-normal weights, zero biases; the layers of :meth:`init_plan`)."""
        keys = iter(jax.random.split(key, _INIT_KEYS))
        p: Params = {}
        for name, shape, scale in self.init_plan():
            w = jax.random.normal(next(keys), shape, jnp.float32) * scale
            p[name] = {"w": w, "b": jnp.zeros((shape[-1],), jnp.float32)}
        return p

    def apply(
        self, params: Params, x: jax.Array, *, key: jax.Array | None = None, dropout: float | jax.Array = 0.0
    ) -> jax.Array:
        """Logits of ONE member.

        Args:
          params: one member's params (from :meth:`init`).
          x: [B, *input_shape] in [0, 1].
          key: PRNG key for dropout (training only); None disables dropout.
          dropout: dropout rate on the penultimate features (may be traced).

        Returns:
          [B, num_classes] float32 logits.
        """
        f = ACTIVATIONS[self.act]
        b = x.shape[0]
        if self.family == "mlp":
            z = x.reshape(b, -1)
            for i in range(len(self.widths)):
                z = f(z @ params[f"dense{i}"]["w"] + params[f"dense{i}"]["b"])
            z = _dropout(z, key, dropout)
            return z @ params["out"]["w"] + params["out"]["b"]
        if self.family == "cnn":
            z = x
            for i in range(len(self.widths)):
                z = max_pool2(f(conv2d(z, params[f"conv{i}"], self.conv_impl)))
        else:
            z = max_pool2(f(conv2d(x, params["stem"], self.conv_impl)))
            for s in range(len(self.widths)):
                if f"proj{s}" in params:
                    z = z @ params[f"proj{s}"]["w"] + params[f"proj{s}"]["b"]
                for blk in range(self.blocks):
                    r = f(conv2d(z, params[f"s{s}b{blk}c0"], self.conv_impl))
                    z = f(z + conv2d(r, params[f"s{s}b{blk}c1"], self.conv_impl))
                if s < len(self.widths) - 1:
                    z = max_pool2(z)
            z = max_pool2(z)
        z = f(z.reshape(b, -1) @ params["dense"]["w"] + params["dense"]["b"])
        z = _dropout(z, key, dropout)
        return z @ params["out"]["w"] + params["out"]["b"]


#: the length of the one normal draw every weight of up to this many entries is cut from (:func:`init_members`)
NORMAL_DRAW = 1 << 19


@functools.partial(jax.jit, static_argnums=2)
def _layer_normals(key: jax.Array, layer: jax.Array, n: int) -> jax.Array:
    """``[n]`` float32 standard normals of ``jax.random.split(key, 64)[layer]`` (``layer`` traced)."""
    return jax.random.normal(jax.random.split(key, _INIT_KEYS)[layer], (n,), jnp.float32)


def init_members(arch: Arch, seeds: Sequence[int]) -> Params:
    """``jax.vmap(arch.init)(jnp.stack([jax.random.key(s) for s in seeds]))``, bit for bit, from one program.

    Eager ``vmap(arch.init)`` compiles a random-normal program per weight shape and member count
    (21 programs, about 10 s, for the demo's three pools). Here every weight is cut from ONE
    draw of :data:`NORMAL_DRAW` normals of its layer's key (a longer draw, a power of two, for a
    larger weight): JAX's threefry bits (``jax_threefry_partitionable``, the default) depend only
    on the key and an entry's flat index, so the first ``n`` entries of a longer draw are the
    ``n``-entry draw, and a vmapped draw is the per-member draws stacked. The He scale and the
    stacking run in numpy (a float32 product, rounded as XLA's). tests/models/test_init_members.py
    checks the equality on every zoo family.

    Args:
      arch: the architecture.
      seeds: ``K`` member seeds (member ``k`` is initialised from ``jax.random.key(seeds[k])``).

    Returns:
      Stacked params, every leaf ``[K, ...]`` float32.

    Raises:
      ValueError: no seed, or a seed that is not an int.
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("init_members needs at least one seed, got none")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise ValueError(f"init_members: seeds must be ints, got {type(s).__name__} {s!r}")
    if not jax.config.jax_threefry_partitionable:  # pyright: ignore[reportAttributeAccessIssue]  (the prefix property needs it)
        keys = jnp.stack([jax.random.key(int(s)) for s in seeds])
        return jax.tree.map(np.asarray, jax.vmap(arch.init)(keys))
    plan = arch.init_plan()
    members: list[dict[str, dict[str, np.ndarray]]] = []
    for s in seeds:
        key = jax.random.key(int(s))
        p = {}
        for j, (name, shape, scale) in enumerate(plan):
            n = math.prod(shape)
            draw = max(NORMAL_DRAW, 1 << (n - 1).bit_length())
            w = np.asarray(_layer_normals(key, np.int32(j), draw))[:n].reshape(shape)
            p[name] = {"w": w * np.float32(scale), "b": np.zeros(shape[-1], np.float32)}
        members.append(p)
    return jax.tree.map(lambda *xs: np.stack(xs), *members)


def mlp(widths=(256, 128), act="relu", **kw) -> Arch:
    """A multilayer perceptron with the given hidden widths."""
    return Arch("mlp", tuple(widths), act, **kw)


def cnn(channels=(16, 32), act="relu", dense=128, kernel=3, conv_impl="im2col", **kw) -> Arch:
    """A small CNN: [conv k x k -> act -> 2x2 max-pool] per channel entry, dense, logits."""
    return Arch("cnn", tuple(channels), act, dense=dense, kernel=kernel, conv_impl=conv_impl, **kw)


def resnet(channels=(16,), blocks=2, act="relu", dense=128, kernel=3, conv_impl="im2col", **kw) -> Arch:
    """A small residual CNN: stem conv + pool, ``blocks`` residual blocks per stage, pool, dense, logits."""
    return Arch("resnet", tuple(channels), act, dense=dense, kernel=kernel, blocks=blocks, conv_impl=conv_impl, **kw)
