"""Minimum-norm attacks: shared result type, trajectory bookkeeping, pool entry point.

Every minimum-norm attack in sarjax (``fmn``, ``ddn``, ``alma``, ``pdgd``,
``pdpgd``, ``sigma_zero``, ``apgd_min``) is a *core* written for ONE example
and ONE model (a logits function ``f(x: [*S]) -> [C]``).  This module turns a
core into a batched, jitted attack (:func:`run`) and into a pool attack that
vmaps it over a stack's members (:func:`run_stack`, :func:`run_pool`), and
fixes what every attack returns (:class:`MinNormResult`, papers/001 Section 5.1:
"recording the perturbation distance every 10 queries" up to the per-attack
cap ``T``).

Query accounting (DESIGN.md "Attacks"): one forward or one backward pass of
one model on one sample is one query; a gradient step (forward + backward at
the iterate) costs 2.  A core reports, for every evaluated point, the
cumulative number of queries spent after it; the driver never lets a core
spend more than the cap ``T``.

Restarts (papers/001 Table 2): run 0 starts from ``x0``; runs ``1..R`` start
from a seeded random point of the ``init_eps`` lp ball around ``x0``.  They
share the cap ``T`` (``T // (R + 1)`` queries each), are accounted as if run
one after the other, and are combined by best norm, never chained.

Targets: ``targets[i] = -1`` runs sample i untargeted; ``targets[i] = c``
drives the loss towards class ``c``.  With ``strict_target=False`` (the
Frontiers pool's setting, papers/001 Section 5.1: "targeted attacks directed
at the top-9 highest-confidence incorrect classes, yet still looking for an
untargeted misclassification") any prediction other than ``y`` counts as a
success; with ``strict_target=True`` only the target does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import geometry
from sarjax.attacks._engine import check_sample_ids
from sarjax.attacks.audit import check as audit_check
from sarjax.attacks.threat import Threat, canonical_norm, check_labels

LogitsFn = Callable[[jax.Array], jax.Array]
TRAJ_EVERY = 10  # papers/001 Section 5.1: distances recorded every 10 queries


class MinNormResult(NamedTuple):
    """Output of a minimum-norm attack (a pytree of arrays).

    Vmapped over a pool (:func:`run_stack`, :func:`run_pool`) every array gains
    a leading member axis ``[M, ...]``.

    Attributes:
      x_adv: ``[B, *S]`` the smallest adversarial point found at any query
        (best-so-far over all steps and restarts); ``x0`` where none was found.
      norm: ``[B]`` float32 realized ``||x_adv - x0||_p`` (measured against the
        ORIGINAL input), ``inf`` where no adversarial point was found.
      trajectory: ``[B, T // 10]`` best norm so far after ``10 (k + 1)``
        queries (``inf`` before the first success); non-increasing.
      queries: ``[B]`` int32 queries spent (never above ``T``).
      success: ``[B]`` bool, ``isfinite(norm)``.
    """

    x_adv: jax.Array
    norm: jax.Array
    trajectory: jax.Array
    queries: jax.Array
    success: jax.Array


class CoreOut(NamedTuple):
    """What a per-example core returns to the driver.

    Attributes:
      x_best: ``[*S]`` best adversarial point (``x0`` if none).
      n_best: scalar best norm (``inf`` if none).
      hist: ``[K]`` best norm after each evaluated point.
      spent: ``[K]`` int32 cumulative queries after each evaluated point
        (non-decreasing, last entry <= budget).
    """

    x_best: jax.Array
    n_best: jax.Array
    hist: jax.Array
    spent: jax.Array


@dataclass(frozen=True)
class Spec:
    """A minimum-norm attack: its per-example core and hyperparameters.

    Attributes:
      name: attack name (for messages).
      core: ``core(f, x0, y, t, x_init, key, *, budget, p, strict, hp) -> CoreOut``
        for one example; ``budget`` is a static int, ``p`` a canonical norm,
        ``hp`` a dict of hyperparameters.
      norms: the norms the attack supports (canonical floats).
      hp: hyperparameters as a sorted tuple of ``(name, value)`` (hashable).
      min_budget: smallest per-run budget the core can work with.
      min_classes: smallest class count the core's loss needs.
    """

    name: str
    core: Callable[..., CoreOut]
    norms: tuple
    hp: tuple = ()
    min_budget: int = 2
    min_classes: int = 2


def make_spec(name, core, norms, hp: dict, min_budget: int = 2, min_classes: int = 2) -> Spec:
    """Builds a hashable :class:`Spec` from a hyperparameter dict."""
    return Spec(name, core, tuple(canonical_norm(p) for p in norms), tuple(sorted(hp.items())),
                min_budget, min_classes)


# ---------------------------------------------------------------------------------------------
# losses and success, for one example (logits: [C])
# ---------------------------------------------------------------------------------------------

def _other_max(logits, c):
    C = logits.shape[-1]
    return jnp.max(jnp.where(jnp.arange(C) == c, -jnp.inf, logits))


def margin(logits: jax.Array, y: jax.Array, t: jax.Array) -> jax.Array:
    """Difference of logits; negative once the attack's goal is reached.

    Untargeted (``t < 0``): ``z_y - max_{j != y} z_j``.  Targeted:
    ``max_{j != t} z_j - z_t``.

    Args:
      logits: ``[C]``.
      y: scalar int true label.
      t: scalar int target (``-1`` = untargeted).
    """
    tc = jnp.maximum(t, 0)
    unt = logits[y] - _other_max(logits, y)
    tar = _other_max(logits, tc) - logits[tc]
    return jnp.where(t >= 0, tar, unt)


def cross_entropy_objective(logits, y, t):
    """Objective to MINIMISE: ``-CE(y)`` untargeted, ``CE(t)`` targeted."""
    lse = jax.nn.logsumexp(logits)
    tc = jnp.maximum(t, 0)
    return jnp.where(t >= 0, lse - logits[tc], logits[y] - lse)


def dlr_objective(logits, y, t):
    """Objective to MINIMISE: the (targeted) DLR loss of Croce & Hein 2020, negated.

    Untargeted: ``(z_y - max_{j!=y} z_j) / (z_pi1 - z_pi3)``; targeted:
    ``(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)`` (AutoAttack's definitions;
    needs 3 resp. 4 classes).
    """
    srt = jnp.sort(logits)[::-1]
    tc = jnp.maximum(t, 0)
    unt = (logits[y] - _other_max(logits, y)) / (srt[0] - srt[2] + 1e-12)
    k4 = srt[3] if logits.shape[-1] >= 4 else srt[-1]
    tar = (logits[y] - logits[tc]) / (srt[0] - 0.5 * (srt[2] + k4) + 1e-12)
    return jnp.where(t >= 0, tar, unt)


def is_success(logits: jax.Array, y, t, strict: bool) -> jax.Array:
    """Whether ``logits`` ([C]) meet the attack's goal (see module doc)."""
    pred = jnp.argmax(logits)
    if strict:
        return jnp.where(t >= 0, pred == t, pred != y)
    return pred != y


def value_grad(f: LogitsFn, objective, x, y, t):
    """Objective, its input gradient and the logits at ``x`` (2 queries)."""

    def obj(z):
        logits = f(z)
        return objective(logits, y, t), logits

    (val, logits), g = jax.value_and_grad(obj, has_aux=True)(x)
    g = jnp.where(jnp.isfinite(g), g, 0.0)
    return val, g, logits


def track(best_x, best_n, x, x0, adv, p):
    """Best-so-far update: keep ``x`` when adversarial and smaller.

    Returns ``(best_x, best_n, n)`` where ``n = ||x - x0||_p``.
    """
    n = geometry.norm(x - x0, p)
    better = adv & (n < best_n)
    return jnp.where(better, x, best_x), jnp.where(better, n, best_n), n


def cosine(i, steps, start, end):
    """Cosine annealing from ``start`` (i = 0) to ``end`` (i = steps)."""
    c = 0.5 * (1.0 + jnp.cos(jnp.pi * i / steps))
    return end + (start - end) * c


def hash_direction(key, i, shape):
    """A cheap pseudo-random unit-l2 direction from ``key`` and step ``i``.

    Used where an attack needs a random direction on a zero gradient; a hash
    of the key data avoids compiling a threefry generator into every step.
    """
    raw = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    kd = jnp.ravel(raw).astype(jnp.float32)
    seed = jnp.sum(kd * jnp.asarray([1e-6, 3e-7])[: kd.shape[-1]]) + 0.618 * i
    n = int(np.prod(shape))
    v = jnp.sin((jnp.arange(n, dtype=jnp.float32) + 1.0) * 12.9898 + seed * 78.233) * 43758.5453
    v = (v - jnp.floor(v)) - 0.5
    v = v / jnp.maximum(jnp.sqrt(jnp.sum(v * v)), 1e-12)
    return v.reshape(shape)


def worst_norm(x0, p, box=(0.0, 1.0)):
    """Norm of the farthest box corner from ``x0``: no minimal perturbation exceeds it."""
    return geometry.norm(jnp.maximum(x0 - box[0], box[1] - x0), p)


def gradient_core_out(best_x, best_n, hist, steps, cost=2):
    """CoreOut for a core whose every step costs ``cost`` queries."""
    spent = jnp.asarray(np.arange(1, steps + 1) * cost, jnp.int32)
    return CoreOut(best_x, best_n, hist, spent)


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------

def _trajectory(hist, spent, T):
    """``[T // 10]`` best norm after 10, 20, ... queries from per-point history."""
    cum = jax.lax.cummin(hist)
    grid = jnp.arange(1, T // TRAJ_EVERY + 1, dtype=jnp.int32) * TRAJ_EVERY
    idx = jnp.searchsorted(spent, grid, side="right") - 1
    return jnp.where(idx >= 0, cum[jnp.maximum(idx, 0)], jnp.inf)


def _run_one(spec: Spec, f: LogitsFn, p: float, T: int, R: int, init_eps: float, strict: bool,
             x0, y, t, key):
    """One example, all restarts. Returns MinNormResult fields for one sample."""
    hp = dict(spec.hp)
    per_run = T // (R + 1)

    def one_restart(r):
        k = jax.random.fold_in(key, r)
        if R > 0:
            rand = geometry.random_in_ball(jax.random.fold_in(k, 0), x0, init_eps, p)
            x_init = jnp.where(r == 0, x0, rand)
        else:
            x_init = x0
        out = spec.core(f, x0, y, t, x_init, jax.random.fold_in(k, 1), budget=per_run, p=p,
                        strict=strict, hp=hp)
        return out._replace(spent=out.spent + r * per_run)

    outs = jax.vmap(one_restart)(jnp.arange(R + 1))
    j = jnp.argmin(outs.n_best)
    x_best, n_best = outs.x_best[j], outs.n_best[j]
    hist, spent = outs.hist.reshape(-1), outs.spent.reshape(-1)
    traj = _trajectory(hist, spent, T)
    # realized norm measured against the ORIGINAL input, recomputed from the returned point
    n_real = jnp.where(jnp.isfinite(n_best), geometry.norm(x_best - x0, p), jnp.inf)
    return MinNormResult(x_best, n_real, traj, spent[-1], jnp.isfinite(n_real))


def _run_batch(spec, f, p, T, R, init_eps, strict, x0, y, t, key, sids):
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(sids)   # per sample: its index in the data set
    return jax.vmap(lambda a, b, c, k: _run_one(spec, f, p, T, R, init_eps, strict, a, b, c, k))(
        x0, y, t, keys)


_run_jit = jax.jit(_run_batch, static_argnums=(0, 1, 2, 3, 4, 5, 6))


def _member_fn(apply, params):
    return lambda x: apply(params, x[None])[0]


def _stack_batch(spec, apply, p, T, R, init_eps, strict, params, x0, y, t, key, sids):
    return jax.vmap(lambda prm: _run_batch(spec, _member_fn(apply, prm), p, T, R, init_eps, strict,
                                           x0, y, t, key, sids))(params)


_stack_jit = jax.jit(_stack_batch, static_argnums=(0, 1, 2, 3, 4, 5, 6))


def _validate(spec: Spec, x0, y, targets, norm, max_queries, restarts, init_eps, num_classes=None):
    if not isinstance(spec, Spec):
        raise TypeError(f"expected a minnorm.Spec, got {type(spec).__name__}")
    p = canonical_norm(norm)
    if p not in spec.norms:
        names = ", ".join("linf" if q == math.inf else f"l{int(q)}" for q in spec.norms)
        raise ValueError(f"{spec.name} supports norms {{{names}}}, got {norm!r}")
    x0 = jnp.asarray(x0)
    if x0.ndim < 2:
        raise ValueError(f"x0 must be a batch [B, *S] with at least one feature axis, got shape {x0.shape}")
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        raise TypeError(f"x0 must be a float array, got dtype {x0.dtype}")
    x0 = x0.astype(jnp.float32)
    xn = np.asarray(x0)
    if not np.isfinite(xn).all():
        raise ValueError("x0 contains NaN or inf")
    if xn.min() < 0.0 or xn.max() > 1.0:
        raise ValueError(f"x0 must lie in the box [0, 1], got range [{xn.min()}, {xn.max()}]")
    B = x0.shape[0]
    y = np.asarray(y)
    if y.shape != (B,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must be int labels of shape [{B}], got {y.dtype} {y.shape}")
    if targets is None:
        t = np.full((B,), -1, np.int32)
    else:
        t = np.asarray(targets)
        if t.shape != (B,) or not np.issubdtype(t.dtype, np.integer):
            raise ValueError(f"targets must be int classes of shape [{B}] (-1 = untargeted), got {t.dtype} {t.shape}")
        if np.any((t >= 0) & (t == y)):
            raise ValueError(f"a target equals the true label for samples {np.flatnonzero((t >= 0) & (t == y))[:5].tolist()}")
    if num_classes is not None:
        if num_classes < spec.min_classes:
            raise ValueError(f"{spec.name} needs at least {spec.min_classes} classes, the model has {num_classes}")
        check_labels(y, num_classes, name="labels")
        check_labels(t, num_classes, name="targets", untargeted=-1)
    if isinstance(max_queries, bool) or not isinstance(max_queries, (int, np.integer)):
        raise TypeError(f"max_queries must be an int, got {type(max_queries).__name__}")
    if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 0:
        raise ValueError(f"restarts must be an int >= 0, got {restarts!r}")
    T, R = int(max_queries), int(restarts)
    if T < TRAJ_EVERY or T // (R + 1) < spec.min_budget:
        raise ValueError(f"max_queries={T} is too small for {spec.name} with {R} restarts: need >= "
                         f"{max(TRAJ_EVERY, spec.min_budget * (R + 1))}")
    if R > 0:
        if init_eps is None or not (float(init_eps) > 0 and math.isfinite(float(init_eps))):
            raise ValueError(f"restarts > 0 needs a finite init_eps > 0 (radius of the random starts), got {init_eps!r}")
        e = float(init_eps)
    else:
        e = 0.0
    return p, T, R, e, x0, jnp.asarray(y, jnp.int32), jnp.asarray(t, jnp.int32)


def _audit(res: MinNormResult, x0, p, what, logits_at=None, y=None, t=None, strict=False):
    """Bound audit of a result (host side): finite-norm samples realize their norm, in box."""
    ok = np.asarray(res.success)
    nrm = np.where(ok, np.asarray(res.norm, np.float64), 0.0)
    xa = np.where(ok.reshape((-1,) + (1,) * (x0.ndim - 1)), np.asarray(res.x_adv), np.asarray(x0))
    audit_check(np.asarray(x0), xa, Threat(p, nrm), what=what, rtol=1e-5)
    if logits_at is not None and ok.any():
        lg = np.asarray(logits_at(jnp.asarray(xa)))
        pred = lg.argmax(-1)
        yy, tt = np.asarray(y), np.asarray(t)
        good = np.where(strict & (tt >= 0), pred == tt, pred != yy)
        # tolerate a float tie at the decision boundary (logit gap below 1e-5)
        srt = np.sort(lg, -1)
        tie = (srt[:, -1] - srt[:, -2]) <= 1e-5 * np.maximum(1.0, np.abs(srt[:, -1]))
        bad = ok & ~good & ~tie
        if bad.any():
            raise ValueError(f"{what}: returned points are not adversarial for samples "
                             f"{np.flatnonzero(bad)[:5].tolist()} although their norm is finite")


@functools.lru_cache(maxsize=64)
def _batched_logits(f):
    return jax.jit(jax.vmap(f))


def run(spec: Spec, f: LogitsFn, x0, y, key, *, norm, max_queries: int = 1000, targets=None,
        strict_target: bool = False, restarts: int = 0, init_eps: float | None = None,
        check: bool = True, sample_ids=None) -> MinNormResult:
    """Runs a minimum-norm attack on one model, jitted, vmapped over the batch.

    Args:
      spec: the attack (e.g. ``fmn.spec()``).
      f: logits of ONE example, ``f(x: [*S]) -> [C]``; a hashable callable
        (the jit cache is keyed on it: reuse the same function object).
      x0: ``[B, *S]`` clean inputs in ``[0, 1]``.
      y: ``[B]`` int true labels.
      key: PRNG key (per sample ``fold_in(key, sample_ids[b])``, per restart ``fold_in(., r)``).
      norm: ``0, 1, 2, inf`` or ``"l0" ... "linf"``.
      max_queries: the hard per-sample query cap ``T`` (>= 10).
      targets: ``[B]`` int target classes, ``-1`` = untargeted; ``None`` = all untargeted.
      strict_target: success only when the target is predicted (default: any
        misclassification, as the Frontiers pool).
      restarts: extra runs from random points of the ``init_eps`` ball (share ``T``).
      init_eps: radius of the random starts (needed when ``restarts > 0``).
      check: audit the result on the host (bound, box, adversarial) and raise.
      sample_ids: ``[B]`` int, each sample's index in the data set (default ``arange(B)``): a
        sample's random stream does not depend on the batch it runs in.

    Returns:
      :class:`MinNormResult`.

    Raises:
      ValueError / TypeError: on invalid inputs (see :func:`_validate`), or
        when the audit fails.
    """
    probe = jax.eval_shape(f, jax.ShapeDtypeStruct(np.shape(x0)[1:], jnp.float32))
    p, T, R, e, x0, y, t = _validate(spec, x0, y, targets, norm, max_queries, restarts, init_eps,
                                      num_classes=probe.shape[-1])
    sids = check_sample_ids(sample_ids, x0.shape[0])
    res = _run_jit(spec, f, p, T, R, e, bool(strict_target), x0, y, t, key, sids)
    if check:
        _audit(res, x0, p, spec.name, _batched_logits(f), y, t, bool(strict_target))
    return res


def run_stack(spec: Spec, apply: Callable, params, x0, y, key, *, norm, max_queries: int = 1000,
              targets=None, strict_target: bool = False, restarts: int = 0,
              init_eps: float | None = None, check: bool = True, sample_ids=None) -> MinNormResult:
    """Runs the attack on every member of a stack: ``jax.vmap`` over stacked params.

    Args:
      spec: the attack.
      apply: ``apply(member_params, x: [B, *S]) -> [B, C]`` for ONE member
        (e.g. ``stack.arch.apply``); hashable.
      params: members' params stacked on a leading axis ``[M, ...]``.
      x0, y, key, norm, max_queries, targets, strict_target, restarts,
      init_eps, check, sample_ids: as :func:`run` (the same inputs attack every member).

    Returns:
      :class:`MinNormResult` whose arrays have a leading member axis ``[M, ...]``.
    """
    leaves = jax.tree.leaves(params)
    if not leaves:
        raise ValueError("params is empty: expected members' params stacked on a leading axis")
    M = np.shape(leaves[0])[0]
    one = jax.tree.map(lambda l: l[0], params)
    probe = jax.eval_shape(lambda z: apply(one, z[None])[0],
                           jax.ShapeDtypeStruct(np.shape(x0)[1:], jnp.float32))
    p, T, R, e, x0, y, t = _validate(spec, x0, y, targets, norm, max_queries, restarts, init_eps,
                                      num_classes=probe.shape[-1])
    sids = check_sample_ids(sample_ids, x0.shape[0])
    res = _stack_jit(spec, apply, p, T, R, e, bool(strict_target), params, x0, y, t, key, sids)
    if check:
        for m in range(M):
            pm = jax.tree.map(lambda l: l[m], params)
            _audit(jax.tree.map(lambda a: a[m], res), x0, p, f"{spec.name} (member {m})",
                   lambda z, pm=pm: apply(pm, z), y, t, bool(strict_target))
    return res


def run_pool(spec: Spec, pool, x0, y, key, **kwargs) -> MinNormResult:
    """Runs the attack on every member of a :class:`sarjax.models.pool.Pool`.

    One compiled kernel per stack (vmapped over its members), concatenated
    in pool member order.

    Args:
      spec: the attack.
      pool: a ``Pool``.
      x0, y, key: as :func:`run`.
      **kwargs: ``norm``, ``max_queries``, ``targets``, ``strict_target``,
        ``restarts``, ``init_eps``, ``check``, ``sample_ids`` as :func:`run`.

    Returns:
      :class:`MinNormResult` with arrays ``[M, ...]`` (M = ``pool.num_members``).
    """
    outs = [run_stack(spec, s.arch.apply, s.params, x0, y, key, **kwargs) for s in pool.stacks]
    if len(outs) == 1:
        return outs[0]
    return MinNormResult(*(jnp.concatenate(parts, axis=0) for parts in zip(*outs)))


def top_k_targets(logits: jax.Array, y: jax.Array, k: int = 9) -> jax.Array:
    """The ``k`` most likely wrong classes per sample (papers/001 Section 5.1: top-9).

    Args:
      logits: ``[B, C]`` clean logits.
      y: ``[B]`` true labels.
      k: how many (``<= C - 1``).

    Returns:
      ``[B, k]`` int32, most likely first; column ``j`` is the ``targets``
      array of the ``j``-th targeted run.
    """
    logits = jnp.asarray(logits)
    C = logits.shape[-1]
    if not 1 <= k <= C - 1:
        raise ValueError(f"k must be in [1, {C - 1}] for {C} classes, got {k}")
    masked = jnp.where(jax.nn.one_hot(y, C, dtype=bool), -jnp.inf, logits)
    return jnp.argsort(-masked, axis=-1)[:, :k].astype(jnp.int32)


def best_of(results: list[MinNormResult]) -> MinNormResult:
    """Per-sample best of several runs on the same inputs (an ensemble's frontier).

    Trajectories are min-combined point-wise (each run's own query axis);
    queries are summed.
    """
    if not results:
        raise ValueError("best_of needs at least one result")
    norms = jnp.stack([r.norm for r in results])
    j = jnp.argmin(norms, axis=0)
    xs = jnp.stack([r.x_adv for r in results])
    x = jnp.take_along_axis(xs, j.reshape((1,) + j.shape + (1,) * (xs.ndim - 2)), 0)[0]
    n = jnp.min(norms, 0)
    traj = jnp.min(jnp.stack([r.trajectory for r in results]), 0)
    q = sum(r.queries for r in results)
    return MinNormResult(x, n, traj, q, jnp.isfinite(n))


__all__ = ["MinNormResult", "CoreOut", "Spec", "make_spec", "run", "run_stack", "run_pool",
           "top_k_targets", "best_of", "margin", "is_success", "TRAJ_EVERY"]
