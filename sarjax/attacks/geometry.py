"""Norms, dual norms, projections and steepest-ascent directions.

Every function here is written for ONE example of any shape (all elements
count as one vector) with a scalar ``eps``; ``jax.vmap`` them for batches.
``p`` is a static Python value (``0, 1, 2, inf`` or a string like ``"linf"``).

Projections return the Euclidean-nearest point of
``{x' : ||x' - x0||_p <= eps} ∩ [lo, hi]^d`` (``x0`` is assumed to lie in the
box).  linf and l0 are solved in closed form; l2 and l1 by bisection on the
scalar KKT multiplier, which keeps the feasible end of the bracket so the
result never leaves the ball.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sarjax.attacks.threat import canonical_norm

_BISECT_ITERS = 48  # float32 bracket collapses to one ulp well before 48 halvings
_TINY = 1e-12


def norm(v: jnp.ndarray, p) -> jnp.ndarray:
    """lp norm of ``v`` over all its elements.

    Args:
      v: ``[*S]`` any shape.
      p: ``0`` (count of non-zero elements), ``1``, ``2`` or ``inf``.

    Returns:
      Scalar float32.
    """
    p = canonical_norm(p)
    v = jnp.ravel(v)
    if p == 0.0:
        return jnp.sum(jnp.abs(v) > 0).astype(v.dtype)
    if p == 1.0:
        return jnp.sum(jnp.abs(v))
    if p == 2.0:
        return jnp.sqrt(jnp.sum(v * v))
    return jnp.max(jnp.abs(v))


def dual_exponent(p) -> float:
    """q with ``1/p + 1/q = 1``: l1 <-> linf, l2 <-> l2.

    For ``p = 0`` (not a norm) returns ``inf``: a k-sparse perturbation of
    l1 size e is bounded by the linf size of the gradient, as for l1.
    """
    p = canonical_norm(p)
    return {0.0: math.inf, 1.0: math.inf, 2.0: 2.0, math.inf: 1.0}[p]


def dual_norm(v: jnp.ndarray, p) -> jnp.ndarray:
    """Dual norm ``||v||_q`` with ``1/p + 1/q = 1`` (see :func:`dual_exponent`).

    For an affine score ``w . x`` the smallest lp perturbation that changes it
    by ``t`` has lp size ``|t| / ||w||_q`` (without box constraints).

    Args:
      v: ``[*S]``.
      p: the primal norm.

    Returns:
      Scalar.
    """
    return norm(v, dual_exponent(p))


def _clip_box(x, box):
    return jnp.clip(x, box[0], box[1])


def project(x: jnp.ndarray, x0: jnp.ndarray, eps, p, box=(0.0, 1.0)) -> jnp.ndarray:
    """Nearest point (Euclidean) of ``{x' : ||x' - x0||_p <= eps} ∩ [box]``.

    Args:
      x: ``[*S]`` point to project.
      x0: ``[*S]`` centre of the ball, inside the box.
      eps: scalar radius >= 0 (for ``p = 0``: number of elements allowed to
        differ from ``x0``; non-integers are floored).
      p: ``0, 1, 2, inf``.
      box: ``(lo, hi)`` element bounds.

    Returns:
      ``[*S]`` projected point, same dtype as ``x``.
    """
    p = canonical_norm(p)
    eps = jnp.asarray(eps, x.dtype)
    lo, hi = box
    if p == math.inf:
        return jnp.clip(x, jnp.maximum(x0 - eps, lo), jnp.minimum(x0 + eps, hi))
    if p == 2.0:
        return _project_l2(x, x0, eps, box)
    if p == 1.0:
        return _project_l1(x, x0, eps, box)
    return _project_l0(x, x0, eps, box)


def _project_l2(x, x0, eps, box):
    # x' - x0 = clip(t * delta, lo - x0, hi - x0) for t = 1 / (1 + lambda) in [0, 1];
    # ||.|| increases with t, so bisect on t for ||.|| = eps.
    delta = x - x0
    lo_d, hi_d = box[0] - x0, box[1] - x0

    def size(t):
        d = jnp.clip(t * delta, lo_d, hi_d)
        return jnp.sum(d * d)

    eps2 = eps * eps

    def body(_, bracket):
        a, b = bracket
        m = 0.5 * (a + b)
        ok = size(m) <= eps2
        return jnp.where(ok, m, a), jnp.where(ok, b, m)

    inside = size(jnp.ones((), x.dtype)) <= eps2
    a, _ = jax.lax.fori_loop(0, _BISECT_ITERS, body, (jnp.zeros((), x.dtype), jnp.ones((), x.dtype)))
    t = jnp.where(inside, 1.0, a)
    return x0 + jnp.clip(t * delta, lo_d, hi_d)


def _project_l1(x, x0, eps, box):
    # KKT: d_i = sign(delta_i) * clip(|delta_i| - tau, 0, cap_i) with cap_i the room
    # to the box on delta_i's side; the l1 size decreases in tau: bisect.
    delta = x - x0
    cap = jnp.where(delta >= 0, box[1] - x0, x0 - box[0])
    mag = jnp.abs(delta)

    def size(tau):
        return jnp.sum(jnp.clip(mag - tau, 0.0, cap))

    def body(_, bracket):
        a, b = bracket  # size(b) <= eps always
        m = 0.5 * (a + b)
        ok = size(m) <= eps
        return jnp.where(ok, a, m), jnp.where(ok, m, b)

    hi_tau = jnp.max(mag)
    inside = size(jnp.zeros((), x.dtype)) <= eps
    _, b = jax.lax.fori_loop(0, _BISECT_ITERS, body, (jnp.zeros((), x.dtype), hi_tau))
    tau = jnp.where(inside, 0.0, b)
    return x0 + jnp.sign(delta) * jnp.clip(mag - tau, 0.0, cap)


def _project_l0(x, x0, eps, box):
    # Keep the k coordinates whose move to clip(x) saves the most squared distance;
    # revert the others to x0.  Gain_i = (x_i - x0_i)^2 - (x_i - clip(x_i))^2 >= 0.
    xc = _clip_box(x, box)
    gain = jnp.ravel((x - x0) ** 2 - (x - xc) ** 2)
    k = jnp.floor(eps + 1e-6).astype(jnp.int32)  # tolerate eps = 2.9999999
    rank = jnp.argsort(jnp.argsort(-gain, stable=True), stable=True)
    keep = (rank < k) & (gain > 0)
    return jnp.where(keep.reshape(x.shape), xc, x0)


def steepest(g: jnp.ndarray, p) -> jnp.ndarray:
    """Unit-lp-norm direction ``d`` maximising ``<g, d>`` (steepest ascent).

    linf: ``sign(g)``; l2: ``g / ||g||_2``; l1 and l0: a signed one-hot at
    ``argmax |g|`` (the l1 ball's vertex; for sparse multi-coordinate l1
    steps see :func:`sparse_l1_direction`).  A zero gradient gives zeros.

    Args:
      g: ``[*S]`` gradient.
      p: ``0, 1, 2, inf``.

    Returns:
      ``[*S]``.
    """
    p = canonical_norm(p)
    if p == math.inf:
        return jnp.sign(g)
    if p == 2.0:
        n = jnp.sqrt(jnp.sum(g * g))
        return g / jnp.maximum(n, _TINY)
    flat = jnp.ravel(g)
    i = jnp.argmax(jnp.abs(flat))
    return jnp.zeros_like(flat).at[i].set(jnp.sign(flat[i])).reshape(g.shape)


def sparse_l1_direction(g: jnp.ndarray, x: jnp.ndarray, q: float, box=(0.0, 1.0)) -> jnp.ndarray:
    """Sparse l1 ascent direction (SLIDE, Tramer & Boneh 2019; APGD-l1, Croce & Hein 2021).

    Keeps the coordinates whose ``|g|`` is in the top ``(1 - q)`` quantile,
    ignoring coordinates that sit on the box face the gradient pushes into,
    and normalises the signed result to unit l1 norm.

    Args:
      g: ``[*S]`` gradient.
      x: ``[*S]`` current point (to drop coordinates stuck at the box).
      q: quantile in ``[0, 1)``; 0.99 keeps the top 1% (AutoAttack's l1 APGD
        uses a sparsity it adapts from the current perturbation).
      box: element bounds.

    Returns:
      ``[*S]`` direction with unit l1 norm (zeros if ``g`` is zero).
    """
    stuck = ((x <= box[0]) & (g < 0)) | ((x >= box[1]) & (g > 0))
    a = jnp.where(stuck, 0.0, jnp.abs(g))
    flat = jnp.ravel(a)
    n = flat.shape[0]
    k = jnp.maximum(jnp.ceil((1.0 - q) * n), 1.0)
    thresh = jnp.sort(flat)[n - k.astype(jnp.int32)]
    d = jnp.where((a >= thresh) & (a > 0), jnp.sign(g), 0.0)
    return d / jnp.maximum(jnp.sum(jnp.abs(d)), 1.0)


def random_in_ball(key: jax.Array, x0: jnp.ndarray, eps, p, box=(0.0, 1.0)) -> jnp.ndarray:
    """A random point of ``{x : ||x - x0||_p <= eps} ∩ [box]``.

    linf: uniform in the cube then clipped to the box.  l2: uniform in the
    ball (Gaussian direction, radius ``eps * u^(1/d)``) then clipped.  l1: a
    Laplace direction scaled to l1 radius ``eps * u^(1/d)`` then clipped.  l0:
    ``floor(eps)`` random elements set uniformly in the box.  Clipping to the
    box moves every element towards ``x0``'s box, never away from ``x0`` in
    norm, so the result stays in the ball.

    Args:
      key: PRNG key.
      x0: ``[*S]`` centre, inside the box.
      eps: scalar radius >= 0.
      p: ``0, 1, 2, inf``.
      box: element bounds.

    Returns:
      ``[*S]``.
    """
    p = canonical_norm(p)
    eps = jnp.asarray(eps, x0.dtype)
    d = x0.size
    k1, k2 = jax.random.split(key)
    if p == math.inf:
        delta = jax.random.uniform(k1, x0.shape, x0.dtype, -1.0, 1.0) * eps
        return project(x0 + delta, x0, eps, p, box)
    if p == 0.0:
        u = jax.random.uniform(k1, (d,))
        k = jnp.floor(eps + 1e-6).astype(jnp.int32)
        chosen = (jnp.argsort(jnp.argsort(u)) < k).reshape(x0.shape)
        vals = jax.random.uniform(k2, x0.shape, x0.dtype, box[0], box[1])
        return jnp.where(chosen, vals, x0)
    r = eps * jax.random.uniform(k2, (), x0.dtype) ** (1.0 / d)
    if p == 2.0:
        v = jax.random.normal(k1, x0.shape, x0.dtype)
    else:
        v = jax.random.laplace(k1, x0.shape, x0.dtype)
    v = v / jnp.maximum(norm(v, p), _TINY)
    return project(x0 + r * v, x0, eps, p, box)
