"""A CNN pool's logits with a hand-written input gradient, for joint attacks on CPU.

``Stack.apply`` of a ``zoo.cnn(..., conv_impl="fused")`` stack runs here on the CPU backend.  The
logits are those of ``conv_impl="xla"`` (first layer: the same products summed in another order,
agreeing to float32 rounding); what changes is how the pool is evaluated and differentiated,
because a joint attack evaluates every member on ONE shared batch and needs the gradient in ``x``
only.  What measured slow on a 2-core CPU (``benchmarks/joint_attack_throughput.py``) and what
replaces it:

* Layer 1 on the shared input (1 input channel): XLA's convolution with ``M * C0`` output
  channels ran at about 7 GFLOP/s and wrote ``B x H x W x M x C0`` floats before pooling.  Here
  the 2x2 max-pool is folded in: the input is cut into four pooling phases of ``k*k*Cin`` taps
  (:func:`phase_taps`, computed once for all members), each phase's pre-activation is a short sum
  of products, and only the pooled ``[M, B, H/2, W/2, C0]`` map is written, with the winning
  phase as an int8 index for the backward pass.
* Later layers (different input per member): vmapped, they become batched matmuls or grouped
  convolutions and write every member's activations before the next layer reads them, far out
  of cache.  Here members run in ``lax.scan`` (one member's activations at a time), each layer an
  ordinary XLA convolution followed by the pooling over strided slices; the scan is unrolled
  (``MEMBER_UNROLL`` members per iteration), which lets XLA's CPU runtime run independent members
  on different cores (1.5x on 2 cores).
* The backward pass: XLA's transposed max-pool (``select_and_scatter`` or the tie-splitting rule
  of ``reduce_max``) and convolution gradients ran 3-10x slower than the forward pass.  Here the
  forward pass keeps only the winning phase (int8) of every pooled unit and the dense layer's
  activation derivative; the backward pass (another member scan) routes the cotangent to the
  winning phase with selects, runs the input gradient of each convolution as the convolution of
  the flipped, transposed kernel, and for layer 1 contracts the routed cotangent with all
  members' kernels at once (one matmul over ``M * C0`` per phase, in blocks of ``ROUTE_CHUNK``
  samples so the four routed copies stay in cache) before scattering the taps back onto ``x``.

Gradients agree with ``jax.grad`` of the ``"xla"`` formulation except at exact ties inside a
pooling window, where this kernel routes the whole cotangent to the first maximal phase (as
``reduce_window`` and PyTorch do) and ``jnp.max`` splits it.  Reverse mode only.  Gradients with
respect to the params are computed by the ``"xla"`` formulation (correct, not fast): train
members with ``arch.apply``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from sarjax.models.zoo import ACTIVATIONS, input_grad_conv_args, lax_conv, same_padding

_ELEMENTWISE_TAPS = 32  # first layer: sum of products up to this many taps, one matmul above
ROUTE_CHUNK = 4  # samples per block when routing the first layer's cotangent
MEMBER_UNROLL = 32  # members per iteration of the member loops (whole pools up to 32)


def phase_taps(x: jax.Array, k: int) -> jax.Array:
    """Pooling-phase patches of a stride-1 SAME convolution followed by a 2x2 max-pool.

    Args:
      x: [B, H, W, C].
      k: kernel size (XLA's SAME padding: ``(k - 1) // 2`` before, the rest after).

    Returns:
      [4, B, H // 2, W // 2, k * k * C]: for phase ``2 * a + b`` the input taps of the
      convolution output at row ``2 i + a``, column ``2 j + b``, ordered (di, dj, c) like
      ``w.reshape(k * k * C, Cout)`` of an HWIO kernel.
    """
    _, h, w, _ = x.shape
    ho, wo = h // 2, w // 2
    xp = jnp.pad(x, ((0, 0), *same_padding(k), (0, 0)))
    phases = []
    for a in (0, 1):
        for b in (0, 1):
            taps = [
                xp[:, a + di : a + di + 2 * ho - 1 : 2, b + dj : b + dj + 2 * wo - 1 : 2, :]
                for di in range(k)
                for dj in range(k)
            ]
            phases.append(jnp.concatenate(taps, axis=-1))
    return jnp.stack(phases)


def _max4_first(v):
    """(maximum, index 0-3 of the first maximal) of the four ``v``, by a tournament of pairs.

    The index comes from comparisons between the ``v`` themselves, never from an equality with a
    maximum computed elsewhere: if XLA computed that maximum from the ``v`` again with other
    rounding, no phase would equal it and the gradient would go to a fallback phase silently (the
    failure that ``zoo.window_max`` fixes for ``jnp.max``, where it was a NaN). Strict comparisons
    keep the first of tied phases, as PyTorch's max-pool does."""
    m01, m23 = jnp.maximum(v[0], v[1]), jnp.maximum(v[2], v[3])
    i01, i23 = jnp.where(v[1] > v[0], 1, 0), jnp.where(v[3] > v[2], 3, 2)
    return jnp.maximum(m01, m23), jnp.where(m23 > m01, i23, i01)


def _pool(zs: list, act, relu: bool):
    """Pooled activation of four phase pre-activations, with what its gradient needs.

    Returns ``(y, idx, dact)``: ``y = max_p act(z_p)``; ``idx`` (int8) the first maximal phase,
    -1 where the gradient is zero (relu: the maximum is not positive); ``dact`` the activation's
    derivative at the winning phase (None for relu).
    """
    if relu:
        m, first = _max4_first(zs)
        return jax.nn.relu(m), jnp.where(m > 0, first, -1).astype(jnp.int8), None
    acts = [act(z) for z in zs]
    y, idx = _max4_first(acts)
    zsel = jnp.where(idx == 0, zs[0], jnp.where(idx == 1, zs[1], jnp.where(idx == 2, zs[2], zs[3])))
    dact = jax.jvp(act, (zsel,), (jnp.ones_like(zsel),))[1]
    return y, idx.astype(jnp.int8), dact


def _route(g, idx, dact, p):
    """Cotangent of phase ``p`` from the pooled cotangent ``g``."""
    if dact is not None:
        g = g * dact
    return jnp.where(idx == p, g, jnp.zeros_like(g))


def _unpool(g, idx, dact, h, w):
    """Cotangent of the pre-activation map [B, h, w, C] from the pooled cotangent [B, h/2, w/2, C]."""
    b, ho, wo, c = g.shape
    parts = jnp.stack([_route(g, idx, dact, p) for p in range(4)], axis=3)  # [B, ho, wo, 4, C]
    z = parts.reshape(b, ho, wo, 2, 2, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, 2 * ho, 2 * wo, c)
    if (h, w) != (2 * ho, 2 * wo):
        z = jnp.pad(z, ((0, 0), (0, h - 2 * ho), (0, w - 2 * wo), (0, 0)))
    return z


def _conv(x, w):
    return lax_conv(x, w, same_padding(w.shape[0]))


def _conv_input_grad(g, w):
    """Input gradient of :func:`_conv` (:func:`sarjax.models.zoo.input_grad_conv_args`)."""
    return lax_conv(g, *input_grad_conv_args(w, same_padding(w.shape[0])))


def _first_layer(arch, p0, taps):
    """All members' first conv + act + pool on the shared input, member-major: [M, B, h, w, C0]."""
    w, b = p0["w"], p0["b"]  # [M, k, k, Cin, C0], [M, C0]
    m, k, _, cin, c0 = w.shape
    t = k * k * cin
    wt = w.reshape(m, t, c0)[:, :, None, None, None, :]  # [M, T, 1, 1, 1, C0]
    bb = b[:, None, None, None, :]
    if t <= _ELEMENTWISE_TAPS:
        zs = [sum(taps[p, None, ..., i, None] * wt[:, i] for i in range(t)) + bb for p in range(4)]
    else:
        zs = [jnp.einsum("bhwt,mtc->mbhwc", taps[p], w.reshape(m, t, c0)) + bb for p in range(4)]
    return _pool(zs, _act(arch), arch.act == "relu")


def _first_layer_taps_grad(dh1, idx0, dact0, w0, chunk):
    """Cotangent of the phase taps [4, B, h, w, T] from the members' pooled first-layer cotangent.

    dh1, idx0, dact0: [B, h, w, M, C0] (batch-major).  For each phase, the routed cotangent is
    contracted with all members' kernels at once (K = M * C0); batches of ``chunk`` samples keep
    the four routed copies in cache.
    """
    bsz, ho, wo, m, c0 = dh1.shape
    t = w0.shape[1] * w0.shape[2] * w0.shape[3]
    wt = w0.reshape(m, t, c0).transpose(0, 2, 1).reshape(m * c0, t)  # [M*C0, T]

    def one(args):
        d, i, a = args
        n = d.shape[0]
        return jnp.stack(
            [(_route(d, i, a, p).reshape(n * ho * wo, m * c0) @ wt).reshape(n, ho, wo, t) for p in range(4)]
        )

    chunk = max(1, min(chunk, bsz))
    while bsz % chunk:  # the largest block size <= chunk that divides the batch
        chunk -= 1
    split = lambda v: None if v is None else v.reshape(bsz // chunk, chunk, *v.shape[1:])
    out = jax.lax.map(one, (split(dh1), split(idx0), split(dact0)))  # [n, 4, chunk, h, w, T]
    return jnp.moveaxis(out, 1, 0).reshape(4, bsz, ho, wo, t)


def _act(arch):
    return ACTIVATIONS[arch.act]


def _member_forward(arch, p, h):
    """Layers 2.. and the head of ONE member on its pooled first-layer map h [B, h, w, C0]."""
    act, relu = _act(arch), arch.act == "relu"
    res = []
    for i in range(1, len(arch.widths)):
        z = _conv(h, p[f"conv{i}"]["w"]) + p[f"conv{i}"]["b"]
        _, hh, ww, _ = z.shape
        ho, wo = hh // 2, ww // 2
        zs = [z[:, a : 2 * ho : 2, c : 2 * wo : 2] for a in (0, 1) for c in (0, 1)]
        h, idx, dact = _pool(zs, act, relu)
        res.append((idx, dact))
    b = h.shape[0]
    u = h.reshape(b, -1) @ p["dense"]["w"] + p["dense"]["b"]
    du = jax.jvp(act, (u,), (jnp.ones_like(u),))[1]
    logits = act(u) @ p["out"]["w"] + p["out"]["b"]
    return logits, (tuple(res), du)


def _member_backward(arch, p, res, g, shapes):
    """Cotangent of ONE member's pooled first-layer map from its logits' cotangent g [B, C]."""
    layer_res, du = res
    dh = ((g @ p["out"]["w"].T) * du) @ p["dense"]["w"].T
    dh = dh.reshape(layer_res[-1][0].shape if layer_res else (g.shape[0], *shapes["pooled0"]))
    for i in reversed(range(1, len(arch.widths))):
        idx, dact = layer_res[i - 1]
        h, w = shapes[f"conv{i}"]
        dh = _conv_input_grad(_unpool(dh, idx, dact, h, w), p[f"conv{i}"]["w"])
    return dh


def _reference_apply(arch, params, x):
    return jax.vmap(arch.apply, in_axes=(0, None))(params, x)


@functools.cache
def _kernel(arch, route_chunk: int, unroll: int) -> Any:
    k = arch.kernel

    def forward(params, x):
        p0 = params["conv0"]
        rest = {n: v for n, v in params.items() if n != "conv0"}
        h1, idx0, dact0 = _first_layer(arch, p0, phase_taps(x, k))  # [M, B, h, w, C0]
        logits, res = _member_map(lambda a: _member_forward(arch, *a), (rest, h1), unroll)
        return logits, (rest, p0["w"], idx0, dact0, res)

    @jax.custom_vjp
    def apply(params, x):
        return forward(params, x)[0]

    def fwd(params, x):
        perturbed = jax.tree.leaves(jax.tree.map(lambda v: v.perturbed, params, is_leaf=_is_primal))
        if any(perturbed):
            # the params are differentiated: the generic formulation, not the attack kernel
            out, vjp = jax.vjp(lambda p, z: _reference_apply(arch, p, z), _values(params), x.value)
            return out, (None, jax.tree_util.Partial(vjp))
        logits, res = forward(_values(params), x.value)
        return logits, (res, None)

    def bwd(residuals, g):
        res, vjp = residuals
        if res is None:
            return vjp(g)
        rest, w0, idx0, dact0, member_res = res
        shapes = _shapes(arch)
        dh1 = _member_map(
            lambda a: _member_backward(arch, a[0], a[1], a[2], shapes), (rest, member_res, g), unroll
        )  # [M, B, h, w, C0]
        batch_major = lambda v: None if v is None else jnp.moveaxis(v, 0, 3)
        dtaps = _first_layer_taps_grad(batch_major(dh1), batch_major(idx0), batch_major(dact0), w0, route_chunk)
        x_spec = jax.ShapeDtypeStruct((dh1.shape[1], *arch.input_shape), dtaps.dtype)
        (dx,) = jax.linear_transpose(lambda z: phase_taps(z, k), x_spec)(dtaps)
        return None, dx

    apply.defvjp(fwd, bwd, symbolic_zeros=True)
    return apply


def _member_map(f, xs, unroll):
    """``lax.map`` over the member axis, ``unroll`` members per loop iteration (independent
    members in one iteration let XLA's CPU runtime run them on different cores)."""
    return jax.lax.scan(lambda c, a: (c, f(a)), 0, xs, unroll=unroll)[1]


def _is_primal(v) -> bool:
    return hasattr(v, "perturbed")


def _values(tree):
    return jax.tree.map(lambda v: v.value if _is_primal(v) else v, tree, is_leaf=_is_primal)


def _shapes(arch) -> dict[str, tuple[int, ...]]:
    """Spatial sizes of conv i's map (before pooling); ``pooled0``: the pooled first-layer map."""
    h, w, _ = arch.input_shape
    out: dict[str, tuple[int, ...]] = {"pooled0": (h // 2, w // 2, arch.widths[0])}
    for i in range(len(arch.widths)):
        out[f"conv{i}"] = (h, w)
        h, w = h // 2, w // 2
    return out


def supports(arch) -> bool:
    """Whether :func:`cnn_pool_apply` handles ``arch`` (the zoo's ``cnn`` family)."""
    return arch.family == "cnn"


def cnn_pool_apply(arch, params, x: jax.Array) -> jax.Array:
    """Logits ``[M, B, C]`` of a stack of ``zoo.cnn`` members on one shared batch ``x [B, H, W, C]``.

    Same values as ``jax.vmap(arch.apply, in_axes=(0, None))`` with ``conv_impl="xla"`` (first
    layer to float32 rounding); differentiable in ``x`` by the kernel described in this module's
    docstring, in the params by the generic formulation.
    """
    if not supports(arch):
        raise ValueError(f"cnn_pool_apply supports the cnn family, got {arch.family!r}")
    return _kernel(arch, ROUTE_CHUNK, MEMBER_UNROLL)(params, x)
