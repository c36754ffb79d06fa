"""Minimum-norm attacks on the attack protocol: one driver, one result layout, pools and masks.

Every minimum-norm attack in sarjax (``fmn``, ``ddn``, ``alma``, ``pdgd``, ``pdpgd``,
``sigma_zero``, ``apgd_min``, ``fab``) is a :class:`Spec`: a per-example *core* written for
ONE example, ONE member and ONE run (``init`` / ``step`` over a small pytree state) plus its
hyperparameters.  :func:`make` turns a spec into an
:class:`~sarjax.attacks.core.protocol.Attack` state machine (``init`` / ``step`` / ``result``,
run by :func:`sarjax.attacks.core.run` as one ``lax.scan``) and wraps it in a
:class:`MinNormAttackFn` with the fixed-budget family's call shape::

    fn = fmn.make_fmn(pool.apply, norm=2, max_queries=1000)
    res = fn(pool.params, x0, y, key=key)            # audited public entry
    res = fn.jit(pool.params, x0, y, key=key)        # jit-safe entry (inside a user's jax.jit)

Layout (docs/minnorm.md): every member has its own iterate and its own minimal point, so the
state holds ``[B, M, R + 1, ...]`` (samples, members, runs).  The core is vmapped over runs,
samples and members; the model is evaluated once per step for the whole ``[B, M, R + 1]``
batch: with a pool ``apply(params, x) -> [M, B, C]`` every member sees every iterate and the
driver keeps member ``m``'s logits of its own iterates (one call, ``M`` times the work of a
per-member evaluation); with ``stacked=True`` (``apply`` one member's apply, ``params``
stacked on a leading member axis) the member apply is vmapped over the stacked params (each
member evaluates only its own iterates).  No Python loop over members, samples or steps.

Query accounting (docs/design.md "Attacks", :mod:`sarjax.attacks.queries`): one forward or one
backward pass of one member on one sample is one query; a gradient step costs 2.  A spec
declares its costs (``costs(hp, C) -> (cost0, cost)``: the start, then every step); a run
takes a step only while ``queries.allowed`` (spent + cost <= its budget), so the per-sample
cap is hard.  Budgets: ``max_queries`` at the factory is the static maximum ``T`` (the scan
length and the trajectory length ``T // 10``); ``max_queries`` at the call is a traced
per-sample cap ``<= T``: a smaller budget does not recompile.

Restarts (the frontier paper Table 2): run 0 starts from ``x0`` (or ``x_init``); runs ``1..R`` from a
seeded random point of the ``init_eps`` lp ball around ``x0`` (``init_eps`` traced, per
sample).  They share the cap (``cap // (R + 1)`` queries each), are accounted in the
trajectory as if run one after the other, and are combined by best norm, never chained.
``R`` is static (it sizes the state).

Targets (the fixed-budget family's convention): ``targeted=False``: ``ref`` are the labels
each member should leave; ``targeted=True``: ``ref`` are the targets, and ``labels`` (the true
labels, ``[B]`` or ``[B, M]``) are required at the call (the minimum-norm losses DLR-T and
FAB-T and the success test need them).  ``success="targeted"`` (the default when targeted):
only the target counts; ``success="untargeted"``: any prediction other than the label counts
(the Frontiers pool's mode, the frontier paper Section 5.1: "targeted attacks directed at the top-9
highest-confidence incorrect classes, yet still looking for an untargeted misclassification").

The narrative page (docs/minnorm.md) follows.

.. include:: ../../docs/minnorm.md
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import geometry
from sarjax.attacks import losses as L
from sarjax.attacks import queries as Q
from sarjax.attacks.audit import check as audit_check
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.entry import Entry
from sarjax.attacks.core.protocol import Attack, Problem
from sarjax.attacks.threat import Threat, canonical_norm

LogitsFn = Callable[[jax.Array], jax.Array]
TRAJ_EVERY = 10  # the frontier paper Section 5.1: distances recorded every 10 queries


class MinNormResult(NamedTuple):
    """Output of a minimum-norm attack (a pytree of arrays), member axis ``[B, M]``; an
    :class:`~sarjax.attacks.core.output.AttackOutput` in its per-member form (``x_adv [B, M, *S]``).

    Attributes:
      x_adv: ``[B, M, *S]`` member m's smallest adversarial point found at any query
        (best-so-far over all steps and restarts); ``x0`` where none was found or m is masked.
      norm: ``[B, M]`` float32 realized ``||x_adv - x0||_p`` (measured against the ORIGINAL
        input), ``inf`` where no adversarial point was found or the member is masked.
      trajectory: ``[B, M, T // 10]`` best norm so far after ``10 (k + 1)`` queries (``inf``
        before the first success); non-increasing; after a per-sample cap below ``T`` it holds
        its last value.
      queries: ``[B, M]`` int32 queries spent on member m for sample b (never above the cap;
        0 for masked members).
      success: ``[B, M]`` bool, ``isfinite(norm)``.
    """

    x_adv: jax.Array
    norm: jax.Array
    trajectory: jax.Array
    queries: jax.Array
    success: jax.Array


class Ctx(NamedTuple):
    """What a per-example core sees (one example, one member, one run).

    Attributes:
      f: ``f(x: [*S]) -> [C]`` the member's logits of one example.
      x0: ``[*S]`` the ORIGINAL input.
      y: scalar int32 label (the class to leave).
      t: scalar int32 target (``-1``: untargeted).
      key: PRNG key of this run.
      p: canonical norm (static).
      strict: static bool, success only at the target (targeted runs).
      hp: dict of hyperparameters (static).
      steps: scalar float32 (traced): how many steps this run's budget allows.
    """

    f: LogitsFn
    x0: jax.Array
    y: jax.Array
    t: jax.Array
    key: jax.Array
    p: float
    strict: bool
    hp: dict
    steps: jax.Array


def _gradient_costs(hp, num_classes):
    return 0, 2


@dataclass(frozen=True)
class Spec:
    """A minimum-norm attack: its per-example core and hyperparameters.

    Attributes:
      name: attack name (for messages).
      init: ``init(ctx, x_init) -> (state, bn0)``: the run's starting state (a pytree whose
        best point and norm :attr:`best` reads); ``bn0`` the best norm after the start's
        queries (``cost0 > 0``) or None.
      step: ``step(ctx, state, i) -> state``: one step (``i`` float32, 0-based), ``cost``
        queries.
      norms: the norms the attack supports (canonical floats).
      hp: hyperparameters as a sorted tuple of ``(name, value)`` (hashable).
      costs: ``costs(hp: dict, num_classes) -> (cost0, cost)``: queries of the start and of
        every step.
      best: ``best(state) -> (x_best [*S], n_best)``; default: the state's last two entries.
      min_classes: smallest class count the core's loss needs.
    """

    name: str
    init: Callable
    step: Callable
    norms: tuple
    hp: tuple = ()
    costs: Callable = _gradient_costs
    best: Callable | None = None
    min_classes: int = 2

    def cost(self, num_classes: int) -> tuple[int, int]:
        """``(cost0, cost)`` for a model with ``num_classes`` classes."""
        c0, c = self.costs(dict(self.hp), int(num_classes))
        return int(c0), int(c)

    @property
    def class_dependent(self) -> bool:
        """Whether the query costs (hence the scan length) depend on the class count (FAB)."""
        return len({self.cost(c) for c in (2, 3, 10, 1000)}) > 1

    def min_budget(self, num_classes: int) -> int:
        """Smallest per-run budget that takes one step."""
        c0, c = self.cost(num_classes)
        return max(c0 + c, 2)


def make_spec(name, init, step, norms, hp: dict, *, costs=_gradient_costs, best=None, min_classes: int = 2) -> Spec:
    """Builds a hashable :class:`Spec` from a hyperparameter dict."""
    return Spec(
        name, init, step, tuple(canonical_norm(p) for p in norms), tuple(sorted(hp.items())), costs, best, min_classes
    )


# ---------------------------------------------------------------------------------------------
# deprecated loss names (the losses live in sarjax.attacks.losses)
# ---------------------------------------------------------------------------------------------


def margin(logits: jax.Array, y: jax.Array, t: jax.Array) -> jax.Array:
    """Deprecated: ``-losses.goal_margin(logits, y, t)`` (the former minimisation sign,
    negative once the goal is reached); new code reads :func:`sarjax.attacks.losses.goal_margin`."""
    return -L.goal_margin(logits, y, t)


def cross_entropy_objective(logits: jax.Array, y: jax.Array, t: jax.Array) -> jax.Array:
    """Deprecated: ``-losses.goal_cross_entropy(logits, y, t)`` (minimisation sign)."""
    return -L.goal_cross_entropy(logits, y, t)


def dlr_objective(logits: jax.Array, y: jax.Array, t: jax.Array) -> jax.Array:
    """Deprecated: ``-losses.goal_dlr(logits, y, t)`` (minimisation sign)."""
    return -L.goal_dlr(logits, y, t)


is_success = L.goal_reached
"""Deprecated alias of :func:`sarjax.attacks.losses.goal_reached`."""
value_grad = L.value_grad
"""Deprecated alias of :func:`sarjax.attacks.losses.value_grad`."""


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


# ---------------------------------------------------------------------------------------------
# the state machine
# ---------------------------------------------------------------------------------------------


class MinNormProblem(NamedTuple):
    """One minimum-norm call: the protocol's :class:`~sarjax.attacks.core.protocol.Problem`
    plus what minimum-norm attacks add (every field traced).

    Attributes:
      base: the :class:`Problem` (``ref [B, M]``, ``mask [B, M]``, ``cap [B]``, key, sample
        ids, ``x_init``; ``eps`` is unused).
      labels: ``[B, M]`` int32 true labels (targeted calls; equal to ``ref`` otherwise).
      init_eps: ``[B]`` float32 radius of the random restarts (unused without restarts).
    """

    base: Problem
    labels: jax.Array
    init_eps: jax.Array


class Cfg(NamedTuple):
    """Static config of a minimum-norm attack (hashable: keys the compiled kernel)."""

    spec: Spec
    apply: Callable
    stacked: bool
    p: float
    T: int
    R: int
    targeted: bool
    strict: bool
    num_classes: int


class State(NamedTuple):
    """Driver state; per-run leaves are ``[B, M, R + 1, ...]``.

    Attributes:
      core: the cores' states.
      i: steps taken per run; spent: queries spent per run; budget: per-run budget
        (``cap // (R + 1)``, 0 for masked members); ran0: the start fit in the budget.
      hist, spent_log: ``[B, M, R + 1, K + 1]`` best norm and queries after the start and
        after every scan step (the trajectory's raw record).
      k: scalar scan step counter.
      x0, y, t, keys, steps, mask, per_run: the problem as the cores read it.
    """

    core: object
    i: jax.Array
    spent: jax.Array
    budget: jax.Array
    ran0: jax.Array
    hist: jax.Array
    spent_log: jax.Array
    k: jax.Array
    x0: jax.Array
    y: jax.Array
    t: jax.Array
    keys: jax.Array
    steps: jax.Array
    mask: jax.Array
    per_run: jax.Array


def num_steps(cfg: Cfg) -> int:
    """Static scan length: steps of one run at the maximum budget ``T // (R + 1)``."""
    c0, c = cfg.spec.cost(cfg.num_classes)
    return max(0, (cfg.T // (cfg.R + 1) - c0) // c)


def _best(spec, s):
    if spec.best is not None:
        return spec.best(s)
    return s[-2], s[-1]


def _member_fns(cfg: Cfg, params, M: int):
    """``(members, make_f)``: what is vmapped over the member axis and the logits function of
    one example for one member."""
    if cfg.stacked:
        return params, lambda mem: lambda x: cfg.apply(mem, x[None])[0]

    def make_f(m):
        def f(x):
            out = cfg.apply(params, x[None])
            return out[m, 0] if out.ndim == 3 else out[0]

        return f

    return jnp.arange(M), make_f


def _map(cfg: Cfg, params, M: int, fn, bmr, br, bm, b):
    """``fn(f, bmr, br, bm, b)`` for every (sample, member, run), vmapped (members outermost).

    ``bmr`` leaves ``[B, M, R1, ...]``, ``br`` ``[B, R1, ...]``, ``bm`` ``[B, M, ...]``,
    ``b`` ``[B, ...]``; the result has leaves ``[B, M, R1, ...]``."""
    members, make_f = _member_fns(cfg, params, M)

    def per_member(mem, bmr_m, bm_m):
        f = make_f(mem)

        def per_sample(bmr_s, br_s, bm_s, b_s):
            return jax.vmap(lambda a, c: fn(f, a, c, bm_s, b_s))(bmr_s, br_s)

        return jax.vmap(per_sample)(bmr_m, br, bm_m, b)

    return jax.vmap(per_member, in_axes=(0, 1, 1), out_axes=1)(members, bmr, bm)


def _ctx(cfg, f, x0, y, t, key, steps):
    return Ctx(f, x0, y, t, key, cfg.p, cfg.strict, dict(cfg.spec.hp), steps)


def _init(cfg: Cfg, params, prob: MinNormProblem) -> State:
    base = prob.base
    x0 = base.x0
    B, M = base.ref.shape
    R1 = cfg.R + 1
    c0, c = cfg.spec.cost(cfg.num_classes)
    K = num_steps(cfg)
    mask = base.mask > 0
    cap = jnp.minimum(base.cap, cfg.T)
    per_run = cap // R1
    budget = jnp.where(mask[..., None], per_run[:, None, None], 0) * jnp.ones((1, 1, R1), jnp.int32)
    steps = (jnp.maximum(budget - c0, 0) // c).astype(jnp.float32)
    ran0 = budget >= c0
    if cfg.targeted:
        y, t = prob.labels, base.ref
    else:
        y, t = base.ref, jnp.full_like(base.ref, -1)
    skeys = jax.vmap(lambda s: jax.random.fold_in(base.key, s))(base.sample_ids.astype(jnp.uint32))
    rkeys = jax.vmap(lambda k: jax.vmap(lambda r: jax.random.fold_in(k, r))(jnp.arange(R1)))(skeys)
    start = jnp.where(base.has_init, base.x_init, x0)
    if cfg.R > 0:

        def starts(k, xs, x, e):
            rand = jax.vmap(lambda kr: geometry.random_in_ball(jax.random.fold_in(kr, 0), x, e, cfg.p))(k)
            return jnp.where((jnp.arange(R1) == 0).reshape((R1,) + (1,) * x.ndim), xs[None], rand)

        xin = jax.vmap(starts)(rkeys, start, x0, prob.init_eps)
    else:
        xin = start[:, None]
    ckeys = jax.vmap(jax.vmap(lambda k: jax.random.fold_in(k, 1)))(rkeys)

    def one(f, st, br, bm, xb):
        xi, ck = br
        yy, tt = bm
        return cfg.spec.init(_ctx(cfg, f, xb, yy, tt, ck, st), xi)

    core, bn0 = _map(cfg, params, M, one, steps, (xin, ckeys), (y, t), x0)
    hist = jnp.full((B, M, R1, K + 1), jnp.inf, jnp.float32)
    spent = jnp.where(ran0, c0, 0).astype(jnp.int32)
    if bn0 is not None:
        hist = hist.at[..., 0].set(jnp.where(ran0, bn0, jnp.inf))
    spent_log = jnp.zeros((B, M, R1, K + 1), jnp.int32).at[..., 0].set(spent)
    return State(
        core,
        jnp.zeros((B, M, R1), jnp.int32),
        spent,
        budget,
        ran0,
        hist,
        spent_log,
        jnp.zeros((), jnp.int32),
        x0,
        y,
        t,
        ckeys,
        steps,
        mask,
        per_run,
    )


def _step(cfg: Cfg, st: State, params) -> State:
    M = st.y.shape[1]
    _, c = cfg.spec.cost(cfg.num_classes)
    active = Q.allowed(st.spent, c, st.budget) & st.ran0

    def one(f, bmr, ck, bm, xb):
        s, i, steps = bmr
        yy, tt = bm
        return cfg.spec.step(_ctx(cfg, f, xb, yy, tt, ck, steps), s, i.astype(jnp.float32))

    new = _map(cfg, params, M, one, (st.core, st.i, st.steps), st.keys, (st.y, st.t), st.x0)
    core = jax.tree.map(lambda n, o: Q.freeze(active, n, o), new, st.core)
    spent = Q.charge(st.spent, c, active)
    _, bn = _best(cfg.spec, core)
    k = st.k + 1
    return st._replace(
        core=core,
        i=st.i + active.astype(jnp.int32),
        spent=spent,
        hist=st.hist.at[..., k].set(bn),
        spent_log=st.spent_log.at[..., k].set(spent),
        k=k,
    )


def _trajectory(hist, spent, T):
    """``[T // 10]`` best norm after 10, 20, ... queries from per-point history."""
    cum = jax.lax.cummin(hist)
    grid = jnp.arange(1, T // TRAJ_EVERY + 1, dtype=jnp.int32) * TRAJ_EVERY
    idx = jnp.searchsorted(spent, grid, side="right") - 1
    return jnp.where(idx >= 0, cum[jnp.maximum(idx, 0)], jnp.inf)


def _result(cfg: Cfg, st: State, params) -> MinNormResult:
    B, M = st.y.shape
    R1 = cfg.R + 1
    bx, bn = _best(cfg.spec, st.core)
    bn = jnp.where(st.ran0, bn, jnp.inf)
    j = jnp.argmin(bn, axis=2)
    x_best = jnp.take_along_axis(bx, j.reshape((B, M, 1) + (1,) * (bx.ndim - 3)), 2)[:, :, 0]
    n_best = jnp.min(bn, axis=2)
    offs = (jnp.arange(R1, dtype=jnp.int32)[None, :] * st.per_run[:, None])[:, None, :, None]
    spent_log = (st.spent_log + offs).reshape(B, M, -1)
    hist = st.hist.reshape(B, M, -1)
    traj = jax.vmap(jax.vmap(lambda h, s: _trajectory(h, s, cfg.T)))(hist, spent_log)
    x0m = jnp.broadcast_to(st.x0[:, None], x_best.shape)
    real = jax.vmap(jax.vmap(lambda a, b: geometry.norm(a - b, cfg.p)))(x_best, x0m)
    n_real = jnp.where(jnp.isfinite(n_best) & st.mask, real, jnp.inf)
    success = jnp.isfinite(n_real)
    x_adv = jnp.where(success.reshape((B, M) + (1,) * (x_best.ndim - 2)), x_best, x0m)
    traj = jnp.where(st.mask[..., None], traj, jnp.inf)
    queries = jnp.where(st.mask, jnp.sum(st.spent, axis=2), 0).astype(jnp.int32)
    return MinNormResult(x_adv, n_real, traj, queries, success)


def attack_of(cfg: Cfg) -> Attack:
    """The :class:`~sarjax.attacks.core.protocol.Attack` state machine of a config."""
    return Attack(_init, _step, _result, num_steps(cfg), cfg)


def _member_logits(cfg, params, x):
    """``[B, M, C]``: member m's logits at ``x[b, m]`` (``x [B, M, *S]``), one evaluation
    (``cfg``: anything with ``apply`` and ``stacked``)."""
    M = x.shape[1]
    members, make_f = _member_fns(cfg, params, M)
    return jax.vmap(lambda mem, xm: jax.vmap(make_f(mem))(xm), in_axes=(0, 1), out_axes=1)(members, x)


class _Apply(NamedTuple):
    apply: Callable
    stacked: bool


@partial(jax.jit, static_argnums=(0, 1))
def _member_logits_jit(apply, stacked, params, x):
    """:func:`_member_logits` compiled per ``(apply, stacked)`` (the audit's re-evaluation)."""
    return _member_logits(_Apply(apply, stacked), params, x)


# ---------------------------------------------------------------------------------------------
# the two entries
# ---------------------------------------------------------------------------------------------


@cache
def _pool_apply(apply, stacked):
    """``apply`` as a pool's apply (``stacked``: vmapped over the stacked params); one function
    object per ``(apply, stacked)``, so that tracing it for its shape hits JAX's trace cache (a
    fresh lambda per call re-traced the model on every call: 13 ms vs 63 ms for an MLP pool on
    a loaded 2-core machine)."""
    if stacked:
        return lambda p, x: jax.vmap(apply, (0, None))(p, x)
    return apply


def _logits_shape(apply, stacked, params, x0):
    return jax.eval_shape(_pool_apply(apply, stacked), params, x0).shape


def _per_sample(a, B, M, dtype):
    """``[B]`` (shared by the members) or ``[B, M]`` -> ``[B, M]``."""
    a = jnp.asarray(a).astype(dtype)
    return jnp.broadcast_to(a[:, None] if a.ndim == 1 else a, (B, M))


def _per_member(a, B, M, dtype):
    """``[M]`` (shared by the samples) or ``[B, M]`` -> ``[B, M]``."""
    a = jnp.asarray(a).astype(dtype)
    return jnp.broadcast_to(a[None] if a.ndim == 1 else a, (B, M))


class MinNormAttackFn(Entry):
    """A minimum-norm attack's two entries (the fixed-budget family's call shape; an
    :class:`~sarjax.attacks.core.entry.Entry` like :class:`~sarjax.attacks.core.AttackFn`).

    ``fn(params, x0, ref, *, key, mask=None, max_queries=None, sample_ids=None,
    labels=None, init_eps=None, x_init=None) -> MinNormResult``: host validation, the compiled
    state machine, the audit of every returned point against the ORIGINAL ``x0``.
    ``fn.jit(...)``: the same arguments, no host call (for use inside ``jax.jit``).
    ``fn.problem(...)``: the validated :class:`MinNormProblem` of a call. ``fn.attack``: the state
    machine (:func:`attack_of`); FAB's scan length depends on the class count, its state
    machine is ``fn.attack_for(C)``.

    Args of a call:
      params: the pool's params (``stacked=True``: members' params stacked on a leading axis).
      x0: ``[B, *S]`` clean inputs in ``[0, 1]``.
      ref: ``[B]`` or ``[B, M]`` int: labels (untargeted) or targets (``targeted=True``).
      mask: ``[M]`` or ``[B, M]``: members to attack (masked: no queries, norm ``inf``).
      key: PRNG key (required): sample b draws ``fold_in(key, sample_ids[b])``, run r
        ``fold_in(., r)`` (the same draws for every member).
      max_queries: None (the factory's ``T``), an int or ``[B]`` ints ``<= T``: the traced
        per-sample cap (a new value does not recompile).
      sample_ids: ``[B]`` each sample's index in the data set (default ``arange(B)``).
      labels: ``[B]`` or ``[B, M]`` true labels; required when ``targeted=True``, else None.
      init_eps: scalar or ``[B]`` radius of the random restarts (default: the factory's).
      x_init: ``[B, *S]`` start of run 0 (default ``x0``).
    """

    apply: Callable

    def __init__(
        self,
        spec: Spec,
        apply: Callable,
        *,
        p: float,
        T: int,
        R: int,
        targeted: bool,
        strict: bool,
        init_eps,
        stacked: bool,
        audit: bool,
    ):
        self.spec, self.apply, self.p, self.T, self.R = spec, apply, p, T, R
        self.targeted, self.strict, self.init_eps = targeted, strict, init_eps
        self.stacked, self.audit = stacked, audit
        self.name = spec.name
        self.__name__ = spec.name

    def cfg(self, num_classes: int) -> Cfg:
        """The static config for a model with ``num_classes`` classes (stored as 0 when the
        spec's query costs do not depend on it: one compiled kernel for every class count)."""
        C = int(num_classes) if self.spec.class_dependent else 0
        return Cfg(self.spec, self.apply, self.stacked, self.p, self.T, self.R, self.targeted, self.strict, C)

    def attack_for(self, num_classes: int) -> Attack:
        """The state machine for a model with ``num_classes`` classes (FAB's step cost, hence
        the scan length, depends on it)."""
        return attack_of(self.cfg(num_classes))

    @property
    def attack(self) -> Attack:
        """The state machine (:func:`attack_of`).

        Raises:
          TypeError: the spec's step cost depends on the class count (FAB): use
            :meth:`attack_for`.
        """
        if self.spec.class_dependent:
            raise TypeError(
                f"{self.name}: the step cost (hence the scan length) depends on the class count; "
                "use fn.attack_for(num_classes)"
            )
        return attack_of(self.cfg(0))

    def _attack_for(self, params, problem) -> Attack:
        if not self.spec.class_dependent:
            return attack_of(self.cfg(0))
        return attack_of(self.cfg(_logits_shape(self.apply, self.stacked, params, problem.base.x0)[-1]))

    def _make(self, params, x0, ref, mask, key, max_queries, sample_ids, labels, init_eps, x_init, shape=None):
        if max_queries is not None:
            Q.check_integer_cap(max_queries, self.name)  # the dtype only: trace-time in .jit
        x0 = jnp.asarray(x0, jnp.float32)
        B = x0.shape[0]
        if shape is None:
            shape = _logits_shape(self.apply, self.stacked, params, x0)
        M = shape[0] if len(shape) == 3 else 1
        base = Problem(
            x0,
            _per_sample(ref, B, M, jnp.int32),
            jnp.ones((B, M), jnp.float32) if mask is None else _per_member(mask, B, M, jnp.float32),
            jnp.full((B,), jnp.inf, jnp.float32),
            jnp.broadcast_to(jnp.asarray(self.T if max_queries is None else max_queries).astype(jnp.int32), (B,)),
            key,
            jnp.arange(B, dtype=jnp.int32) if sample_ids is None else jnp.asarray(sample_ids).astype(jnp.int32),
            x0 if x_init is None else jnp.asarray(x_init, jnp.float32),
            jnp.asarray(x_init is not None),
        )
        lab = base.ref if labels is None else _per_sample(labels, B, M, jnp.int32)
        e = self.init_eps if init_eps is None else init_eps
        e = jnp.broadcast_to(jnp.asarray(0.0 if e is None else e, jnp.float32), (B,))
        return MinNormProblem(base, lab, e)

    def _validate(self, params, x0, ref, mask, key, max_queries, sample_ids, labels, init_eps, x_init):
        """The host-side checks (the shared ones of :mod:`sarjax.attacks.core.validate`, then the
        family's: class count, targets vs labels, the cap against ``T`` and the restarts' budget,
        ``init_eps``) -> :meth:`_make`."""
        name, box = self.name, (0.0, 1.0)
        x0n = V.check_x0(x0, box, name=name)
        B = x0n.shape[0]
        M, C = V.logits_shape(_pool_apply(self.apply, self.stacked), params, x0n, name=name)
        if C < self.spec.min_classes:
            raise ValueError(f"{name} needs at least {self.spec.min_classes} classes, the model has {C}")
        r = V.check_ref(ref, B, M, C, what="targets" if self.targeted else "labels", name=name)
        if self.targeted:
            if labels is None:
                raise ValueError(
                    f"{name}: targeted=True needs labels= (the true labels [B] or [B, M]): "
                    "the targeted losses and the success test read them"
                )
            lab = V.check_ref(labels, B, M, C, what="labels", name=name)
            same = np.broadcast_to(lab.reshape(B, -1), (B, M)) == np.broadcast_to(r.reshape(B, -1), (B, M))
            if same.any():
                raise ValueError(
                    f"{name}: a target equals the true label for samples {np.flatnonzero(same.any(1))[:10].tolist()}"
                )
        elif labels is not None:
            raise ValueError(f"{name}: labels= is only read by targeted attacks (ref holds the labels)")
        V.check_mask(mask, B, M, name=name)
        if max_queries is not None:
            cap = np.asarray(Q.normalize_cap(max_queries, B, name=name))
            over = np.flatnonzero(cap > self.T)
            if over.size:
                raise ValueError(
                    f"{name}: max_queries above the factory's maximum T={self.T} for samples "
                    f"{over[:10].tolist()} ({cap[over[:10]].tolist()}); build the attack with a larger max_queries"
                )
            need = self.spec.min_budget(C) * (self.R + 1)
            low = np.flatnonzero(cap < need)
            if low.size:
                raise ValueError(
                    f"{name}: max_queries below {need} (the smallest budget of {self.R + 1} run(s)) for "
                    f"samples {low[:10].tolist()} ({cap[low[:10]].tolist()})"
                )
        if self.R > 0:
            e = self.init_eps if init_eps is None else init_eps
            ea = None if e is None else np.asarray(e, np.float64)
            if (
                ea is None
                or ea.ndim > 1
                or (ea.ndim == 1 and ea.shape != (B,))
                or not (np.isfinite(ea).all() and (ea > 0).all())
            ):
                raise ValueError(f"{name}: restarts > 0 needs init_eps, a finite radius > 0 (scalar or [B]), got {e!r}")
        sid = V.check_sample_ids(sample_ids, B, name=name)
        V.check_x_init(x_init, x0n, box=box, name=name)
        shape = (M, B, C)
        return self._make(params, x0n, jnp.asarray(r), mask, key, max_queries, sid, labels, init_eps, x_init, shape)

    def _host_problem(
        self, params, x0, ref, mask, key, *, max_queries=None, sample_ids=None, labels=None, init_eps=None, x_init=None
    ) -> MinNormProblem:
        return self._validate(params, x0, ref, mask, key, max_queries, sample_ids, labels, init_eps, x_init)

    def _traced_problem(
        self, params, x0, ref, mask, key, *, max_queries=None, sample_ids=None, labels=None, init_eps=None, x_init=None
    ) -> MinNormProblem:
        if self.targeted and labels is None:
            raise TypeError(f"{self.name}: targeted=True needs labels= (the true labels [B] or [B, M])")
        return self._make(params, x0, ref, mask, key, max_queries, sample_ids, labels, init_eps, x_init)

    def _audit_result(self, params, problem, result) -> None:
        if self.audit:
            _audit(self, params, problem, result)

    def __repr__(self) -> str:
        return f"MinNormAttackFn({self.name}, T={self.T}, restarts={self.R})"


def _audit(fn: "MinNormAttackFn", params, prob: MinNormProblem, res: MinNormResult):
    """Host audit: each finite-norm (sample, member) realizes its norm against the ORIGINAL
    ``x0``, lies in the box and is adversarial for its member (up to a float tie); every attacked
    member's logits at its returned point (``x0`` where none was found) are finite."""
    x0 = np.asarray(prob.base.x0)
    B, M = np.shape(res.norm)
    ok = np.asarray(res.success)
    nrm = np.where(ok, np.asarray(res.norm, np.float64), 0.0)
    xa = np.asarray(res.x_adv)
    x0m = np.broadcast_to(x0[:, None], xa.shape)
    xa = np.where(ok.reshape((B, M) + (1,) * (x0.ndim - 1)), xa, x0m)
    what = fn.name
    audit_check(
        x0m.reshape((B * M,) + x0.shape[1:]),
        xa.reshape((B * M,) + x0.shape[1:]),
        Threat(fn.p, nrm.reshape(-1)),
        what=what,
        rtol=1e-5,
    )
    lg = np.asarray(_member_logits_jit(fn.apply, fn.stacked, params, jnp.asarray(xa)))
    # [B, M]: a NaN row's argmax is its first NaN, "adversarial"; a masked member claims nothing
    nonfinite = ~np.isfinite(lg).all(-1) & (np.asarray(prob.base.mask) > 0)
    if nonfinite.any():
        samples = np.flatnonzero(nonfinite.any(1))
        raise ValueError(
            f"{what}: the model returned non-finite logits (NaN or inf) at x_adv (x0 where none was found) for "
            f"members {np.flatnonzero(nonfinite.any(0)).tolist()} on samples {samples[:10].tolist()}"
            f"{' ...' if samples.size > 10 else ''}: success cannot be judged on them; fix the model"
        )
    if not ok.any():
        return
    pred = lg.argmax(-1)
    y, t = np.asarray(prob.labels), np.asarray(prob.base.ref)
    good = (pred == t) if (fn.targeted and fn.strict) else (pred != (y if fn.targeted else t))
    srt = np.sort(lg, -1)
    tie = (srt[..., -1] - srt[..., -2]) <= 1e-5 * np.maximum(1.0, np.abs(srt[..., -1]))
    bad = ok & ~good & ~tie
    if bad.any():
        b, m = np.nonzero(bad)
        raise ValueError(
            f"{what}: returned points are not adversarial for (sample, member) "
            f"{list(zip(b[:5].tolist(), m[:5].tolist()))} although their norm is finite"
        )


def make(
    spec: Spec,
    apply: Callable,
    *,
    norm,
    max_queries: int = 1000,
    targeted: bool = False,
    success: str | None = None,
    restarts: int = 0,
    init_eps=None,
    stacked: bool = False,
    audit: bool = True,
) -> MinNormAttackFn:
    """Builds a minimum-norm attack on a pool (the factory behind every ``make_<attack>``).

    Args:
      spec: the attack (e.g. ``fmn.spec()``).
      apply: ``apply(params, x [B, *S]) -> [M, B, C]`` (a pool's apply) or ``[B, C]``; with
        ``stacked=True`` one member's apply ``apply(member_params, x) -> [B, C]``, vmapped over
        params stacked on a leading member axis (each member then evaluates only its own
        iterates).  Hashable: reuse the same object to hit the compile cache.
      norm: ``0, 1, 2, inf`` or ``"l0" ... "linf"``.
      max_queries: the static maximum per-sample budget ``T`` (>= 10); calls may pass a
        smaller traced cap.
      targeted: ``ref`` are targets (``labels=`` required at the call).
      success: ``"targeted"`` (default when targeted: only the target counts) or
        ``"untargeted"`` (any prediction other than the label; the Frontiers pool's mode).
      restarts: ``R`` extra runs from random points of the ``init_eps`` ball (static).
      init_eps: default radius of the random starts (a call may pass its own; traced).
      stacked: see ``apply``.
      audit: audit every result of the public entry on the host (raise on a violation, or on
        non-finite logits at a returned point).

    Returns:
      A :class:`MinNormAttackFn`.
    """
    if not isinstance(spec, Spec):
        raise TypeError(f"expected a minnorm.Spec, got {type(spec).__name__}")
    p = canonical_norm(norm)
    if p not in spec.norms:
        names = ", ".join("linf" if q == math.inf else f"l{int(q)}" for q in spec.norms)
        raise ValueError(f"{spec.name} supports norms {{{names}}}, got {norm!r}")
    if isinstance(max_queries, bool) or not isinstance(max_queries, (int, np.integer)):
        raise TypeError(f"max_queries must be an int (the static maximum budget), got {type(max_queries).__name__}")
    if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 0:
        raise ValueError(f"restarts must be an int >= 0, got {restarts!r}")
    T, R = int(max_queries), int(restarts)
    if T < TRAJ_EVERY or T // (R + 1) < spec.min_budget(2):
        raise ValueError(
            f"max_queries={T} is too small for {spec.name} with {R} restarts: need >= "
            f"{max(TRAJ_EVERY, spec.min_budget(2) * (R + 1))}"
        )
    if success is None:
        success = "targeted" if targeted else "untargeted"
    if success not in ("targeted", "untargeted"):
        raise ValueError(f"success must be 'targeted' or 'untargeted', got {success!r}")
    if success == "targeted" and not targeted:
        raise ValueError("success='targeted' needs targeted=True (ref holds the targets)")
    if init_eps is not None and not (np.ndim(init_eps) == 0 and float(init_eps) > 0 and math.isfinite(float(init_eps))):
        raise ValueError(f"init_eps must be a finite scalar > 0, got {init_eps!r}")
    return MinNormAttackFn(
        spec,
        apply,
        p=p,
        T=T,
        R=R,
        targeted=bool(targeted),
        strict=success == "targeted",
        init_eps=None if init_eps is None else float(init_eps),
        stacked=bool(stacked),
        audit=bool(audit),
    )


_MAKE_OPTIONS = ("targeted", "success", "restarts", "init_eps", "stacked", "audit")


def factory(spec_fn: Callable, default_norm, default_queries: int, *, name: str | None = None, doc: str | None = None):
    """A ``make_<attack>(apply, *, norm, max_queries, targeted=False, success=None, restarts=0,
    init_eps=None, stacked=False, audit=True, **hp)`` over :func:`make` (``**hp`` go to
    ``spec_fn``); ``name`` and ``doc`` set its ``__name__`` and docstring."""

    def make_attack(apply: Callable, *, norm=default_norm, max_queries: int = default_queries, **kw) -> MinNormAttackFn:
        # the options of make (targeted, success, restarts, init_eps, stacked, audit); the rest is hp
        options = {k: kw.pop(k) for k in _MAKE_OPTIONS if k in kw}
        return make(spec_fn(**kw), apply, norm=norm, max_queries=max_queries, **options)

    make_attack.__doc__ = doc or (
        f"Builds the attack of :func:`spec` on a pool: :func:`sarjax.attacks.minnorm.make`"
        f" with ``spec(**hp)`` (default norm {default_norm}, ``max_queries={default_queries}``; the other"
        f" options as :func:`sarjax.attacks.minnorm.make`)."
    )
    if name is not None:
        make_attack.__name__ = name
    return make_attack


# ---------------------------------------------------------------------------------------------
# combining runs
# ---------------------------------------------------------------------------------------------


def top_k_targets(logits: jax.Array, y: jax.Array, k: int = 9) -> jax.Array:
    """The ``k`` most likely wrong classes per sample (the frontier paper Section 5.1: top-9).

    Args:
      logits: ``[B, C]`` clean logits.
      y: ``[B]`` true labels.
      k: how many (``<= C - 1``).

    Returns:
      ``[B, k]`` int32, most likely first; column ``j`` is the ``ref`` of the ``j``-th
      targeted run.
    """
    logits = jnp.asarray(logits)
    C = logits.shape[-1]
    if not 1 <= k <= C - 1:
        raise ValueError(f"k must be in [1, {C - 1}] for {C} classes, got {k}")
    masked = jnp.where(jax.nn.one_hot(y, C, dtype=bool), -jnp.inf, logits)
    return jnp.argsort(-masked, axis=-1)[:, :k].astype(jnp.int32)


def best_of(results: list[MinNormResult]) -> MinNormResult:
    """Per-(sample, member) best of several runs on the same inputs (an ensemble's frontier).

    Runs may have different budgets: trajectories are aligned on one query axis (entry ``k``
    = after ``10 (k + 1)`` queries of each run) and a shorter one is padded with its last
    value up to the longest (a run that has stopped keeps its best norm); then min-combined
    point-wise.  Queries are summed.

    Raises:
      ValueError: no results, or results of different ``[B, M]`` / input shapes.
    """
    if not results:
        raise ValueError("best_of needs at least one result")
    shapes = {tuple(np.shape(r.x_adv)) for r in results}
    if len(shapes) != 1:
        raise ValueError(f"best_of needs results on the same inputs and members, got x_adv shapes {sorted(shapes)}")
    L = max(np.shape(r.trajectory)[-1] for r in results)

    def pad(tr):
        n = L - tr.shape[-1]
        if n == 0:
            return tr
        last = tr[..., -1:] if tr.shape[-1] else jnp.full(tr.shape[:-1] + (1,), jnp.inf, tr.dtype)
        return jnp.concatenate([tr, jnp.repeat(last, n, axis=-1)], axis=-1)

    norms = jnp.stack([r.norm for r in results])
    j = jnp.argmin(norms, axis=0)
    xs = jnp.stack([r.x_adv for r in results])
    x = jnp.take_along_axis(xs, j.reshape((1,) + j.shape + (1,) * (xs.ndim - 1 - j.ndim)), 0)[0]
    n = jnp.min(norms, 0)
    traj = jnp.min(jnp.stack([pad(jnp.asarray(r.trajectory)) for r in results]), 0)
    q = jnp.sum(jnp.stack([jnp.asarray(r.queries) for r in results]), 0)
    return MinNormResult(x, n, traj, q, jnp.isfinite(n))


__all__ = [
    "MinNormResult",
    "MinNormAttackFn",
    "MinNormProblem",
    "Spec",
    "Ctx",
    "Cfg",
    "State",
    "make_spec",
    "make",
    "factory",
    "attack_of",
    "num_steps",
    "top_k_targets",
    "best_of",
    "margin",
    "is_success",
    "TRAJ_EVERY",
]
