"""A CNN member's logits with the fused kernel's input gradient, for members on their OWN inputs.

:mod:`sarjax.models.fused` evaluates a stack on one shared batch (a joint attack). Adversarial
training attacks every member on its own batch: the trainer vmaps a one-member objective over
the stack, and the inner attack differentiates ``apply(params_m, x_m)`` in ``x_m`` ten times per
update. :func:`member_apply` is that one-member ``apply`` for a ``zoo.cnn`` architecture,
written so that vmapping it over stacked members with per-member inputs runs the fused
kernel's layers instead of vmapped (grouped / batched) convolutions:

* vmapped over members (params and ``x`` both batched), the forward pass and the input
  gradient are each ONE ``lax.scan`` over the members (``custom_vmap`` rules; two members per
  iteration, :data:`MEMBER_UNROLL`), one member's activations in cache at a time and the two
  members of an iteration on both cores;
* per member, layer 1 and its 2x2 max-pool are ONE stride-1 convolution of the input's
  space-to-depth layout (``[B, H/2, W/2, 4 Cin]``) with the phase kernel (:func:`_phase_kernel`:
  the four pooling phases' pre-activations as ``4 * C0`` output channels), so the
  full-resolution map is never written; the pooled map keeps the winning phase (int8) for the
  backward pass. The later layers and their hand-written backward pass are the fused kernel's
  (:func:`~sarjax.models.fused._member_forward`, :func:`~sarjax.models.fused._member_backward`):
  the cotangent is routed to the winning phase with selects and every convolution's input
  gradient is a convolution with the flipped kernel; layer 1's routed phases go back through the
  transposed phase kernel and a depth-to-space. (Layer 1 by :func:`sarjax.models.fused.phase_taps`,
  36 strided slices, cost about 4x more in the backward pass, where their transpose is 36 padded
  adds.)

Values equal ``arch.apply`` with ``conv_impl="xla"`` to float32 rounding (layer 1 sums the same
products in another order); input gradients equal ``jax.grad`` of it except at exact ties
inside a pooling window (the whole cotangent goes to the first maximal phase, as PyTorch does).
Gradients in the params (the training step) run the generic formulation, ``arch.apply`` itself.
Reverse mode only. Measured in ``benchmarks/adv_training_throughput.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sarjax.models import fused as F
from sarjax.models.zoo import Arch, input_grad_conv_args, lax_conv

MEMBER_UNROLL = 2
"""Members per iteration of the member scans. Two: both cores can run a member each; unrolling the
whole pool (``fused.MEMBER_UNROLL``) let XLA merge the forward and backward member bodies and recompute
layer 1's pooling inside the backward routing (PGD-AT of 8 CNNs: 15-20% slower, measured)."""


def supports(arch: Arch) -> bool:
    """Whether :func:`member_apply` handles ``arch``: the zoo's ``cnn`` family with even input sides."""
    h, w, _ = arch.input_shape
    return arch.family == "cnn" and h % 2 == 0 and w % 2 == 0


def _phase_offsets(k: int) -> tuple[int, int]:
    """``(o_min, o_max)``: the offsets on the half-resolution grid through which a SAME ``k x k``
    convolution followed by a 2x2 pool connects pooling phases (rows ``2 i + a``) to input
    phases (rows ``2 s + c``)."""
    lo = (k - 1) // 2
    offs = [(a + di - lo - c) // 2 for a in (0, 1) for c in (0, 1) for di in range(k) if (a + di - lo - c) % 2 == 0]
    return min(offs), max(offs)


def _phase_kernel(w: jax.Array) -> jax.Array:
    """Layer 1 on the half-resolution grid: ``w [k, k, Cin, C0]`` as the kernel
    ``[n, n, 4 * Cin, 4 * C0]`` of a stride-1 convolution from the input's four phases
    (space-to-depth, channel ``(c * 2 + d) * Cin + ci``) to the four pooling phases' pre-activations
    (channel ``(a * 2 + b) * C0 + co``), ``n = o_max - o_min + 1``."""
    k, _, cin, c0 = w.shape
    lo = (k - 1) // 2
    o_min, o_max = _phase_offsets(k)
    n = o_max - o_min + 1
    rows, src = [], []
    for a in (0, 1):
        for c in (0, 1):
            for di in range(k):
                if (a + di - lo - c) % 2:
                    continue
                for b in (0, 1):
                    for d in (0, 1):
                        for dj in range(k):
                            if (b + dj - lo - d) % 2:
                                continue
                            rows.append(
                                ((a + di - lo - c) // 2 - o_min, (b + dj - lo - d) // 2 - o_min, c * 2 + d, a * 2 + b)
                            )
                            src.append((di, dj))
    kern = jnp.zeros((n, n, 4, 4, cin, c0), w.dtype)
    th, tw, ci, co = (jnp.array([r[i] for r in rows]) for i in range(4))
    sh, sw = jnp.array([s_[0] for s_ in src]), jnp.array([s_[1] for s_ in src])
    kern = kern.at[th, tw, ci, co].set(w[sh, sw])  # [n, n, 4, 4, Cin, C0]
    return kern.transpose(0, 1, 2, 4, 3, 5).reshape(n, n, 4 * cin, 4 * c0)


def _space_to_depth(x: jax.Array) -> jax.Array:
    """``[B, 2h, 2w, C] -> [B, h, w, 4 C]`` (channel ``(c * 2 + d) * C + ci`` holds ``x[2 s + c, 2 t + d, ci]``)."""
    b, hh, ww, ch = x.shape
    return x.reshape(b, hh // 2, 2, ww // 2, 2, ch).transpose(0, 1, 3, 2, 4, 5).reshape(b, hh // 2, ww // 2, 4 * ch)


def _depth_to_space(x: jax.Array) -> jax.Array:
    b, h, w, c4 = x.shape
    ch = c4 // 4
    return x.reshape(b, h, w, 2, 2, ch).transpose(0, 1, 3, 2, 4, 5).reshape(b, 2 * h, 2 * w, ch)


def _phase_padding(k: int) -> tuple:
    o_min, o_max = _phase_offsets(k)
    return ((-o_min, o_max), (-o_min, o_max))


def _first_layer(arch: Arch, p0, x):
    """ONE member's first conv + act + 2x2 pool on its own ``x [B, H, W, Cin]`` (H, W even):
    ``(h1 [B, h, w, C0], idx int8, dact)`` (see :func:`sarjax.models.fused._pool`). The four
    pooling phases' pre-activations are one stride-1 convolution of the input's space-to-depth
    layout (:func:`_phase_kernel`), so the full-resolution map is never written."""
    w, b = p0["w"], p0["b"]
    c0 = w.shape[-1]
    z = lax_conv(_space_to_depth(x), _phase_kernel(w), _phase_padding(w.shape[0]))  # [B, h, w, 4 C0]
    z = z.reshape(*z.shape[:3], 4, c0) + b
    return F._pool([z[..., p, :] for p in range(4)], F._act(arch), arch.act == "relu")


def _first_layer_input_grad(arch: Arch, w0, dh1, idx0, dact0):
    """Cotangent of ONE member's input ``[B, H, W, Cin]`` from its pooled layer-1 cotangent: the
    cotangent routed to each pooling phase's winner, through the transpose of :func:`_first_layer`'s
    phase convolution (a convolution with the flipped, transposed phase kernel), back to full
    resolution (depth-to-space of ``Cin`` channels)."""
    g = dh1 if dact0 is None else dh1 * dact0
    phase = jnp.arange(4, dtype=idx0.dtype)[:, None]
    routed = jnp.where(idx0[..., None, :] == phase, g[..., None, :], jnp.zeros((), g.dtype))  # [B, h, w, 4, C0]
    routed = routed.reshape(*routed.shape[:3], -1)
    pad = _phase_padding(w0.shape[0])
    return _depth_to_space(lax_conv(routed, *input_grad_conv_args(_phase_kernel(w0), pad)))


def _split(params):
    return params["conv0"], {n: v for n, v in params.items() if n != "conv0"}


def _member_fwd(arch: Arch, params, x):
    p0, rest = _split(params)
    h1, idx0, dact0 = _first_layer(arch, p0, x)
    logits, res = F._member_forward(arch, rest, h1)
    return logits, (idx0, dact0, res)


def _member_bwd(arch: Arch, params, res, g):
    p0, rest = _split(params)
    idx0, dact0, layer_res = res
    dh1 = F._member_backward(arch, rest, layer_res, g, F._shapes(arch))
    return _first_layer_input_grad(arch, p0["w"], dh1, idx0, dact0)


@functools.cache
def _prims(arch: Arch, unroll: int):
    """The forward pass (with residuals) and the input gradient of one member as ``custom_vmap``
    functions whose vmap rule runs every member in one unrolled scan."""

    @jax.custom_batching.custom_vmap
    def fwd(params, x):
        return _member_fwd(arch, params, x)

    @fwd.def_vmap
    def _fwd_rule(axis_size, in_batched, params, x):
        params = _broadcast_tree(axis_size, in_batched[0], params)
        x = _broadcast_tree(axis_size, in_batched[1], x)
        out = F._member_map(lambda a: _member_fwd(arch, *a), (params, x), unroll)
        return out, jax.tree.map(lambda _: True, out)

    @jax.custom_batching.custom_vmap
    def bwd(params, res, g):
        return _member_bwd(arch, params, res, g)

    @bwd.def_vmap
    def _bwd_rule(axis_size, in_batched, params, res, g):
        params = _broadcast_tree(axis_size, in_batched[0], params)
        res = _broadcast_tree(axis_size, in_batched[1], res)
        g = _broadcast_tree(axis_size, in_batched[2], g)
        return F._member_map(lambda a: _member_bwd(arch, *a), (params, res, g), unroll), True

    return fwd, bwd


def _broadcast_tree(axis_size, batched, tree):
    """Leaves of ``tree`` not batched (per ``batched``, a bool or a matching tree) get a leading
    axis of ``axis_size``."""
    if isinstance(batched, bool):
        batched = jax.tree.map(lambda _: batched, tree)
    return jax.tree.map(lambda v, b: v if b else jnp.broadcast_to(v, (axis_size, *jnp.shape(v))), tree, batched)


@functools.cache
def member_apply(arch: Arch, unroll: int = MEMBER_UNROLL) -> Callable:
    """One member's ``apply(params, x [B, H, W, C]) -> logits [B, C]`` (module docstring).

    Args:
      arch: a ``zoo.cnn`` architecture (any ``conv_impl``; the generic path used for gradients
        in the params is ``arch.apply`` with ``conv_impl="xla"`` when ``arch`` is ``"fused"``,
        else ``arch.apply`` itself).
      unroll: members per iteration of the member scan when vmapped.

    Returns:
      ``apply(params, x)``: differentiable in ``x`` by the fused kernel, in the params by the
      generic formulation (reverse mode).

    Raises:
      ValueError: ``arch`` is not of the cnn family.
    """
    if not supports(arch):
        raise ValueError(f"member_apply supports the cnn family, got {arch.family!r}")
    generic = arch.apply if arch.conv_impl != "fused" else dataclasses.replace(arch, conv_impl="xla").apply
    fwd_prim, bwd_prim = _prims(arch, int(unroll))

    @jax.custom_vjp
    def apply(params, x):
        return fwd_prim(params, x)[0]

    def fwd(params, x):
        perturbed = jax.tree.leaves(jax.tree.map(lambda v: v.perturbed, params, is_leaf=F._is_primal))
        if any(perturbed):
            # the params are differentiated (a training step): the generic formulation
            out, vjp = jax.vjp(generic, F._values(params), x.value)
            return out, (None, None, jax.tree_util.Partial(vjp))
        params = F._values(params)
        logits, res = fwd_prim(params, x.value)
        return logits, (params, res, None)

    def bwd(r, g):
        params, res, vjp = r
        if vjp is not None:
            return vjp(g)
        return None, bwd_prim(params, res, g)

    apply.defvjp(fwd, bwd, symbolic_zeros=True)
    return apply


__all__ = ["member_apply", "supports"]
