"""Auto-PGD (APGD) with CE / DLR losses and APGD-T (Croce & Hein 2020, AutoAttack).

Defaults follow AutoAttack (Croce & Hein, ICML 2020, Sec. 3 and the public
reference implementation's defaults): ``n_iter = 100``, ``rho = 0.75``,
momentum ``alpha = 0.75``, initial step ``2 * eps`` for linf/l2 and ``eps`` for
l1, checkpoints ``w_j = ceil(p_j * n_iter)`` with ``p_0 = 0, p_1 = 0.22,
p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``; APGD-T targets the top-9
other classes with the targeted DLR loss, 100 iterations each.

At every checkpoint the step is halved and the iterate restarts from the
best point if (1) the loss increased in at most ``rho`` of the steps since
the last checkpoint, or (2) the step was not reduced at the last checkpoint
and the best loss has not improved since.

l1 follows l1-APGD (Croce & Hein, "Mind the box: l1-APGD for sparse
adversarial attacks on image classifiers", ICML 2021) as implemented in
AutoAttack's ``autopgd_base.py``: no momentum; the step direction is the sparse
sign direction of the top-``k`` coordinates of ``|grad|``
(:func:`sparse_sign_direction`, box-aware as
:func:`sarjax.attacks.geometry.sparse_l1_direction`), with ``k = max(floor(topk
* d), 1)`` adapted per sample; the projection is the exact l1-ball ∩ box
projection.  ``topk`` starts at 0.2 (or, for a warm start, at the warm
start's sparsity / d / 1.5) and checkpoints come every ``max(floor(0.04 *
n_iter), 1)`` iterations; at each one (:func:`l1_sparsity_update`), with
``sp`` the number of non-zero elements of the current highest-loss point:

* ``topk <- sp / d / 1.5``;
* if ``sp < 0.95 * sp_last`` (the best point became sparser by more than 5%)
  the step is reset to its initial ``eps`` and the iterate restarts from the
  highest-loss point; otherwise the step is divided by 1.5;
* the step is kept within ``[eps / 10, eps]`` (times ``step0``) and
  ``sp_last <- sp``.

Deviation (documented): ``k`` rounds ``topk * d`` down; AutoAttack's index
arithmetic keeps ``ceil(topk * d)`` coordinates, with which ``k`` can never
fall below 2 once the best point has 2 non-zero elements (``ceil(2 / 1.5) =
2``), so on small inputs the iterate stalls between two coordinates and
misses the l1 vertex (measured: 0/8 samples fooled at 1.01 x the optimum on the
8-element affine known-answer problem, 8/8 with rounding down).  For image
sizes the difference is one coordinate of ``topk * d``.

l2 projection (``projection="reference"``, the default): AutoAttack's reference
(``autopgd_base.py``, ``APGDAttack.attack_single_run``, norm ``'L2'``; torchattacks 3.5.1's
``APGD`` / ``APGDT`` copy it) does not project onto the l2 ball ∩ box: it rescales ``x - x0``
onto the ball when it is outside, ``x0 + (x - x0) / ||x - x0|| * min(eps, ||x - x0||)``, and then
clips to the box, both for the gradient step and for the momentum step; its random start is
``x0 + eps * v / ||v||`` (``v`` Gaussian, on the sphere) clipped to the box.  Clipping after the
rescale drops the part of the move that leaves the box, so on images with many pixels at 0 or 1
the iterate sits well inside the ball.  ``projection="exact"`` uses the Euclidean projection onto
the ball ∩ box (:func:`sarjax.attacks.geometry.project`; sarjax's only rule before), which keeps
the whole budget and is the stronger attack: on the zoo's PGD-AT l2 1.5 CNN (MNIST, l2 eps 2.0,
193 correctly classified of 200 test images, 10 iterations) APGD-CE leaves 86-88 robust with it
against 92 with the reference's rule, and with the reference's rule and the reference's starting
points sarjax leaves robust exactly the images the reference leaves robust.  linf (clip) and l1
(the reference's ``L1_projection`` is the exact l1 ball ∩ box projection) are the same under both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sarjax.attacks import geometry as G
from sarjax.attacks import queries as Q
from sarjax.attacks.core import AttackFn
from sarjax.attacks.core import evaluate as E
from sarjax.attacks.core import validate as V
from sarjax.attacks.core.protocol import Attack, Problem, sample_keys
from sarjax.attacks.losses import cross_entropy, dlr, dlr_targeted, fooled
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import canonical_norm

L1_TOPK = 0.2  # initial top-k share (AutoAttack autopgd_base.py, l1)
L1_CHECK_EVERY = 0.04  # checkpoint period as a share of n_iter (idem)
L1_SPARSER = 0.95  # "sparser" threshold on sp / sp_last (idem)
L1_SHRINK = 1.5  # topk = sp / d / 1.5 and step / 1.5 (idem, adasp_redstep)
L1_MIN_STEP = 10.0  # step >= initial step / 10 (idem, adasp_minstep)
PROJECTIONS = ("reference", "exact")  # l2: AutoAttack's rescale-then-clip, or the exact ball ∩ box


def project_rescale_clip(x, x0, eps, box=(0.0, 1.0)):
    """AutoAttack's l2 step projection for one example (``autopgd_base.py``, norm ``'L2'``).

    ``x0 + d * min(1, eps / ||d||)`` with ``d = x - x0``, then clipped to the box.  The result
    lies in the l2 ball (clipping moves every element toward ``x0``'s box, never away from
    ``x0``) and the box, but it is not the nearest point of their intersection
    (:func:`sarjax.attacks.geometry.project`): where the rescaled move leaves the box, its norm
    ends below ``eps``.

    Args:
      x: ``[*S]`` point.
      x0: ``[*S]`` centre, inside the box.
      eps: scalar radius >= 0.
      box: element bounds.

    Returns:
      ``[*S]``.
    """
    d = x - x0
    n = jnp.sqrt(jnp.sum(d * d))
    # a few ulps inside the ball, as geometry.project: the sum x0 + d must not round outside
    scale = jnp.where(n > eps, eps / jnp.maximum(n, G._TINY) * (1.0 - G._SHRINK), 1.0)
    return jnp.clip(G.add_within(x0, d * scale), box[0], box[1])


def random_on_sphere(key, x0, eps, box=(0.0, 1.0)):
    """AutoAttack's l2 random start for one example: ``x0 + eps * v / ||v||`` (``v`` standard
    Gaussian), clipped to the box (``autopgd_base.py``, ``attack_single_run``, norm ``'L2'``).

    The radius is ``eps * (1 - 2**-22)``, a few ulps inside the sphere, as the projections land:
    a point put exactly on the sphere measured up to 1 ulp above ``eps`` when XLA rounded the
    in-kernel norm otherwise than numpy (seen at XLA's lowest optimisation level)."""
    v = jax.random.normal(jax.random.split(key)[0], x0.shape, x0.dtype)
    v = v / jnp.maximum(jnp.sqrt(jnp.sum(v * v)), G._TINY)
    return project_rescale_clip(x0 + eps * (1.0 - G._SHRINK) * v, x0, eps, box)


def l1_sparsity_update(sp_best, sp_last, eta, eta0, n_features):
    """l1-APGD's checkpoint rule for one sample (Croce & Hein 2021; AutoAttack defaults).

    Args:
      sp_best: scalar, number of non-zero elements of ``x_best - x0`` (the
        highest-loss point so far).
      sp_last: scalar, the same count at the previous checkpoint (``d`` before
        the first one).
      eta: scalar, current step size.
      eta0: scalar, initial step size (``step0 * eps``; AutoAttack: ``eps``).
      n_features: ``d``, number of input elements.

    Returns:
      ``(topk, eta, sp_last, restart)``: the new top-k share ``sp_best / d /
      1.5``; the step (reset to ``eta0`` if ``restart`` else divided by 1.5,
      clipped to ``[eta0 / 10, eta0]``); ``sp_best`` as the next ``sp_last``;
      ``restart = sp_best < 0.95 * sp_last`` (the iterate goes back to the best
      point).
    """
    sp_best = jnp.asarray(sp_best, jnp.float32)
    restart = sp_best < L1_SPARSER * sp_last
    topk = sp_best / n_features / L1_SHRINK
    eta = jnp.where(restart, eta0, eta / L1_SHRINK)
    eta = jnp.clip(eta, eta0 / L1_MIN_STEP, eta0)
    return topk, eta, sp_best, restart


def sparse_sign_direction(g, x, topk, box=(0.0, 1.0)):
    """l1-APGD's sparse step direction for one example.

    The signs of the ``k = max(floor(topk * d), 1)`` largest ``|g|`` among the
    coordinates not stuck on the box face the gradient pushes into (ties at
    the threshold are all kept), scaled to unit l1 norm.

    Args:
      g: ``[*S]`` gradient.
      x: ``[*S]`` current point.
      topk: scalar share of coordinates (traced allowed).
      box: element bounds.

    Returns:
      ``[*S]`` direction with unit l1 norm (zeros if no coordinate can move).
    """
    n = math.prod(jnp.shape(g))
    return G.sparse_sign_top_k(g, x, jnp.floor(topk * n + 1e-4).astype(jnp.int32), box)


def checkpoints(n_iter: int) -> list[int]:
    """AutoAttack's checkpoint iterations ``ceil(p_j * n_iter)`` (AutoAttack, Sec. 3.2)."""
    ps = [0.0, 0.22]
    while ps[-1] < 1.0:
        ps.append(ps[-1] + max(ps[-1] - ps[-2] - 0.03, 0.06))
    return [math.ceil(p * n_iter - 1e-9) for p in ps if p <= 1.0]


class APGDSchedule(NamedTuple):
    """How :func:`make_apgd` / :func:`make_apgd_t` step and restart: APGD's step-size schedule constants.

    The threat model (``norm``, ``eps``, ``box``), the objective (``loss``, ``targeted``,
    ``n_targets``), the budget (``n_iter``), the model's randomness (``eot``) and the output check
    (``audit``) stay arguments of the factories. Every default is AutoAttack's (Croce & Hein, ICML
    2020, Sec. 3, and the reference code ``autoattack/autopgd_base.py``, ``APGDAttack``).

    Attributes:
      restarts: runs from random points of the eps-ball of x0, an int >= 1 (AutoAttack's standard
        version: 1, ``n_restarts=1``); the highest-objective run is returned.
      rho: the checkpoint condition's threshold, a float (0.75: Croce & Hein 2020, Sec. 3.2,
        ``rho = 0.75``; ``autopgd_base.py`` ``thr_decr=.75``); linf and l2.
      momentum: the momentum ``alpha`` (0.75: Croce & Hein 2020, Sec. 3.2, ``alpha = 0.75``;
        ``autopgd_base.py`` ``alpha = 0.75``); linf and l2 (l1-APGD takes no momentum step).
      step0: the initial step as a multiple of eps, a float > 0, or None (default): 2 for linf and
        l2 (Croce & Hein 2020, Sec. 3.2, ``eta^(0) = 2 eps``; ``autopgd_base.py``
        ``step_size = 2. * eps``) and 1 for l1 (Croce & Hein 2021, "Mind the box", Sec. 3;
        ``autopgd_base.py`` ``step_size = 1. * eps`` for ``'L1'``).
      l1_topk: l1 only, the initial share of coordinates in a sparse step, in (0, 1] (0.2:
        ``autopgd_base.py`` ``topk = .2``, Croce & Hein 2021), adapted at the checkpoints (module
        docstring).
      projection: l2 only: ``"reference"`` (default: AutoAttack's ``autopgd_base.py`` rule: rescale
        onto the ball, then clip to the box, and a random start on the sphere;
        :func:`project_rescale_clip`) or ``"exact"`` (the Euclidean projection onto the ball ∩ box
        and a start uniform in the ball: the stronger attack, sarjax's; module docstring). linf
        and l1 are the same under both.

    The factories check the fields (``ValueError`` / ``TypeError`` naming the field and the value).
    """

    restarts: int = 1
    rho: float = 0.75
    momentum: float = 0.75
    step0: float | None = None
    l1_topk: float = L1_TOPK
    projection: str = "reference"


DEFAULT_SCHEDULE = APGDSchedule()  # AutoAttack's (the factories' default schedule)


class ApgdConfig(NamedTuple):
    """Static APGD description (hashable; keys the jit cache)."""

    apply: Callable
    p: float
    n_iter: int
    restarts: int
    loss: str  # "ce" | "dlr" | "dlr-targeted" | "ce-targeted"
    n_targets: int  # 0 = fixed ref; k = APGD-T over the top-k other classes
    hit_target: bool  # success = prediction == ref (user targets) instead of != ref
    rho: float
    alpha: float
    step0: float  # initial step as a multiple of eps
    box: tuple
    l1_topk: float  # l1: initial top-k share of the sparse steps
    eot: int = 1  # EOT draws of a stochastic apply(params, x, key) (1: deterministic)
    projection: str = "reference"  # l2: "reference" (AutoAttack's rescale-then-clip) | "exact"


def _losses(cfg, z, leave, target):
    """Per-member loss [M] to maximise: leave ``leave`` / reach ``target``."""
    if cfg.loss == "ce":
        return cross_entropy(z, leave)
    if cfg.loss == "dlr":
        return dlr(z, leave)
    if cfg.loss == "ce-targeted":
        return -cross_entropy(z, target)
    return dlr_targeted(z, leave, target)


class RunState(NamedTuple):
    """One APGD run's per-sample state (batch axis first), AutoAttack's variables.

    ``x``/``x_old``: current and previous iterate; ``g``/``f``: gradient and objective at ``x``;
    ``fmax``/``xmax``/``gmax``: the run's highest-objective point; ``eta``: step; ``ctr``/``k``:
    iterations since the last checkpoint and the current checkpoint period; ``inc``: objective
    increases since it; ``f_last``/``reduced``: checkpoint condition (2); ``count``: queries;
    ``best``: the best-so-far point over every run; ``topk``/``sp_last``: l1-APGD's sparsity.
    """

    x: jax.Array
    x_old: jax.Array
    g: jax.Array
    f: jax.Array
    fmax: jax.Array
    xmax: jax.Array
    gmax: jax.Array
    eta: jax.Array
    ctr: jax.Array
    k: jax.Array
    inc: jax.Array
    f_last: jax.Array
    reduced: jax.Array
    count: jax.Array
    grads: jax.Array  # [B] backward passes charged to each selected member (queries.per_member)
    best: E.Best
    topk: jax.Array
    sp_last: jax.Array


class ApgdState(NamedTuple):
    """APGD / APGD-T state: the problem, the scalar step counter ``i`` (run ``i // (n_iter + 1)``,
    its iteration ``i % (n_iter + 1)``), the current run, ``ok0 [B]`` (samples the run is
    for), the best run's highest-objective point so far (``final_x``, ``final_ev``), the
    classes to leave ``leave [B, M]`` and the other classes ranked by clean logit ``ranked [B, M, C]``."""

    problem: Problem
    i: jax.Array
    run: RunState
    ok0: jax.Array
    final_x: jax.Array
    final_ev: E.Evaluation
    leave: jax.Array
    ranked: jax.Array


def _periods(cfg: ApgdConfig) -> tuple[int, int, int]:
    """``(k0, size_decr, k_min)``: first checkpoint period, its decrement and its minimum.

    As AutoAttack's reference (``autopgd_base.py``, ``init_hyperparam``): ``max(int(0.22 n), 1)``,
    ``max(int(0.03 n), 1)``, ``max(int(0.06 n), 1)``, rounded DOWN (sarjax rounded up before
    0.3, which differed from the reference whenever ``0.22 n`` etc. is not an integer, e.g.
    ``n = 10``: periods 3 / 1 / 1 instead of 2 / 1 / 1).
    """
    k0 = max(int(0.22 * cfg.n_iter), 1)
    if cfg.p == 1.0:
        k0 = max(int(L1_CHECK_EVERY * cfg.n_iter), 1)
    return k0, max(int(0.03 * cfg.n_iter), 1), max(int(0.06 * cfg.n_iter), 1)


def _evaluators(cfg: ApgdConfig):
    def score(z, ref, mask, leave, target):
        ev = E.evaluation(_losses(cfg, z, leave, target), fooled(z, ref, cfg.hit_target), mask)
        return ev.obj, ev

    return E.evaluators(cfg.apply, score, cfg.eot)


def _keys(problem: Problem):
    ekey = jax.random.fold_in(problem.key, E.EOT_SALT)  # run r, iteration i: fold_in(fold_in(ekey, r + 1), i + 1)
    return ekey, jax.random.fold_in(ekey, 0)


def init(cfg: ApgdConfig, params, problem: Problem) -> ApgdState:
    """Clean logits (targets ranked, the clean prediction for user targets) and the clean
    evaluation (``eot * M`` queries)."""
    x0, ref, mask = problem.x0, problem.ref, problem.mask
    B, M = ref.shape
    evaluate, _ = _evaluators(cfg)
    _, clean_key = _keys(problem)
    # EOT: the clean logits that rank the targets / give the clean prediction are one draw
    clean_apply = E.at_key(cfg.apply, cfg.eot, jax.random.fold_in(clean_key, 0))
    z0 = E.batch_logits(clean_apply, params, x0)  # [B, M, C], same forward as ev0
    order = jnp.argsort(-z0, axis=-1)
    # user targets: ref is the target, leave the clean prediction; else leave ref
    leave = order[..., 0].astype(jnp.int32) if cfg.hit_target else ref
    _, ev0 = evaluate(params, x0, ref, mask, leave, ref, clean_key)
    count = jnp.full((B,), cfg.eot * M, jnp.int32)
    zo = jnp.where(jax.nn.one_hot(ref, z0.shape[-1], dtype=bool), -jnp.inf, z0)
    ranked = jnp.argsort(-zo, axis=-1).astype(jnp.int32)  # other classes by clean logit
    zi, zf = jnp.zeros((B,), jnp.int32), jnp.zeros((B,), jnp.float32)
    run = RunState(
        x0,
        x0,
        jnp.zeros_like(x0),
        zf,
        zf,
        x0,
        jnp.zeros_like(x0),
        zf,
        zi,
        zi,
        zi,
        zf,
        jnp.zeros((B,), bool),
        count,
        zi,
        E.Best(x0, ev0),
        zf,
        zf,
    )
    return ApgdState(problem, jnp.zeros((), jnp.int32), run, jnp.zeros((B,), bool), x0, ev0, leave, ranked)


def _iterate(cfg: ApgdConfig, s: ApgdState, params, r, t, target) -> ApgdState:
    """Iteration ``t`` of run ``r``: the random start and its gradient (``t == 0``) or one
    APGD step, then the run's end (``t == n_iter``): its highest-objective point is compared
    with the best run's."""
    pr = s.problem
    x0, ref, mask, eps, cap = pr.x0, pr.ref, pr.mask, pr.eps, pr.cap
    p, box, eot = cfg.p, cfg.box, cfg.eot
    B, M = ref.shape
    n_feat = math.prod(x0.shape[1:])
    k0, size_decr, k_min = _periods(cfg)
    evaluate, vg = _evaluators(cfg)
    ekey, clean_key = _keys(pr)
    n_sel = jnp.sum(mask > 0, axis=1).astype(jnp.int32)
    cost = eot * (M + n_sel)
    reserve = 0 if eot == 1 else eot * M  # EOT: each run's final re-evaluation of xmax
    rkey = jax.random.fold_in(ekey, r + 1)
    warm_run = pr.has_init & (r == 0)
    ok0 = jnp.where(t == 0, (n_sel > 0) & Q.allowed(s.run.count, cost + reserve, cap), s.ok0)

    def direction(g, x, topk):
        if p == 1.0:
            return sparse_sign_direction(g, x, topk, box)
        return G.steepest(g, p)

    ref_l2 = p == 2.0 and cfg.projection == "reference"

    def proj(x, x0, eps):
        return project_rescale_clip(x, x0, eps, box) if ref_l2 else G.project(x, x0, eps, p, box)

    def pre(st, i, x0, eps):
        x, x_old = st.x, st.x_old
        z1 = proj(x + st.eta * direction(st.g, x, st.topk), x0, eps)
        if p == 1.0:  # l1-APGD takes no momentum step
            return z1
        a = jnp.where(i > 0, cfg.alpha, 1.0)
        return proj(x + a * (z1 - x) + (1.0 - a) * (x - x_old), x0, eps)

    def post(st, x1, f1, g1, ev1, ok, cost, x0, eps):
        new = st._asdict()
        new["best"] = E.update_best(st.best, x1, ev1, ok)
        new["x_old"], new["x"], new["g"], new["f"] = st.x, x1, g1, f1
        new["inc"] = st.inc + (f1 > st.f).astype(jnp.int32)
        improved = f1 > st.fmax
        new["fmax"] = jnp.where(improved, f1, st.fmax)
        new["xmax"] = jnp.where(improved, x1, st.xmax)
        new["gmax"] = jnp.where(improved, g1, st.gmax)
        ctr = st.ctr + 1
        at_ckpt = ctr == st.k
        if p == 1.0:
            sp = G.norm(new["xmax"] - x0, 0)
            topk, eta, sp_last, back = l1_sparsity_update(sp, st.sp_last, st.eta, cfg.step0 * eps, n_feat)
            halve = at_ckpt & back
            new["eta"] = jnp.where(at_ckpt, eta, st.eta)
            new["topk"] = jnp.where(at_ckpt, topk, st.topk)
            new["sp_last"] = jnp.where(at_ckpt, sp_last, st.sp_last)
        else:
            osc = new["inc"] <= cfg.rho * st.k
            no_impr = (~st.reduced) & (st.f_last >= new["fmax"])
            halve = at_ckpt & (osc | no_impr)
            new["eta"] = jnp.where(halve, st.eta / 2, st.eta)
            new["reduced"] = jnp.where(at_ckpt, halve, st.reduced)
            new["f_last"] = jnp.where(at_ckpt, new["fmax"], st.f_last)
            new["k"] = jnp.where(at_ckpt, jnp.maximum(st.k - size_decr, k_min), st.k)
        new["x"] = jnp.where(halve, new["xmax"], new["x"])
        new["g"] = jnp.where(halve, new["gmax"], new["g"])
        new["inc"] = jnp.where(at_ckpt, 0, new["inc"])
        new["ctr"] = jnp.where(at_ckpt, 0, ctr)
        new["count"] = Q.charge(st.count, cost, ok)
        new["grads"] = Q.charge(st.grads, eot, ok)
        return E.select(ok, RunState(**new), st)

    def start_x(st):
        kr = jax.vmap(lambda k: jax.random.fold_in(k, r))(sample_keys(pr))  # run r's start: fold_in(keys[b], r)
        if ref_l2:  # AutoAttack: on the sphere, clipped
            x = jax.vmap(lambda k, c, e: random_on_sphere(k, c, e, box))(kr, x0, eps)
        else:
            x = jax.vmap(lambda k, c, e: G.random_in_ball(k, c, e, p, box))(kr, x0, eps)
        warm = jax.vmap(lambda x, c, e: G.project(x, c, e, p, box))(pr.x_init, x0, eps)
        return jnp.where(warm_run, warm, x)

    def step_x(st):
        return jax.vmap(pre, in_axes=(0, None, 0, 0))(st, t - 1, x0, eps)

    x1 = jax.lax.cond(t == 0, start_x, step_x, s.run)
    (_, ev1), g1 = vg(params, x1, ref, mask, s.leave, target, jax.random.fold_in(rkey, t))
    assert g1 is not None  # value_and_grad always returns the gradient

    def first(st):
        f = ev1.obj
        zeros = jnp.zeros((B,), jnp.int32)
        # l1: AutoAttack starts from topk = 0.2 (sp_last = d), or from a warm start's sparsity
        sp0 = jax.vmap(lambda a, b: G.norm(a - b, 0))(x1, x0)
        topk0 = jnp.where(warm_run, sp0 / n_feat / L1_SHRINK, cfg.l1_topk)
        sp_last0 = jnp.where(warm_run, sp0, float(n_feat))
        return RunState(
            x1,
            x1,
            g1,
            f,
            f,
            x1,
            g1,
            cfg.step0 * eps,
            zeros,
            zeros + k0,
            zeros,
            f,
            jnp.zeros((B,), bool),
            Q.charge(st.count, cost, ok0),
            Q.charge(st.grads, eot, ok0),
            jax.vmap(E.update_best)(st.best, x1, ev1, ok0),
            topk0.astype(jnp.float32),
            sp_last0.astype(jnp.float32),
        )

    def later(st):
        ok = ok0 & Q.allowed(st.count, cost + reserve, cap)
        return jax.vmap(post)(st, x1, ev1.obj, g1, ev1, ok, cost, x0, eps)

    st = jax.lax.cond(t == 0, first, later, s.run)

    def finish(c):
        st, fx, fev = c
        xm = st.xmax
        if eot == 1:
            _, evm = evaluate(params, xm, ref, mask, s.leave, target, None)  # re-derived (seen before: no query)
            count_r = st.count
        else:  # EOT: re-evaluated on the clean evaluation's draws (paired with x0, independent of the
            # draws that selected xm), charged and reserved like a final evaluation
            _, evm = evaluate(params, xm, ref, mask, s.leave, target, clean_key)
            count_r = Q.charge(st.count, reserve, ok0)
        fx, fev = jax.vmap(E.select)(ok0 & (evm.obj > fev.obj), (xm, evm), (fx, fev))
        return st._replace(count=count_r), fx, fev

    st, fx, fev = jax.lax.cond(t == cfg.n_iter, finish, lambda c: c, (st, s.final_x, s.final_ev))
    return s._replace(run=st, ok0=ok0, final_x=fx, final_ev=fev)


def step(cfg: ApgdConfig, s: ApgdState, params) -> ApgdState:
    """One APGD iteration (see :func:`_iterate`). APGD-T: run ``q`` targets the ``(q % n_targets
    + 1)``-th most likely other class per member; with fewer than ``n_targets + 1`` classes the
    runs for missing targets are skipped (``lax.cond``: no model call)."""
    L = cfg.n_iter + 1
    q, t = s.i // L, s.i % L
    if cfg.n_targets:
        n_eff = min(cfg.n_targets, s.ranked.shape[-1] - 1)  # n_targets capped at C - 1
        j = q % cfg.n_targets
        r = (q // cfg.n_targets) * n_eff + j  # the run index of the capped schedule
        target = s.ranked[..., jnp.minimum(j, n_eff - 1)]
        s = jax.lax.cond(j < n_eff, lambda s: _iterate(cfg, s, params, r, t, target), lambda s: s, s)
    else:
        s = _iterate(cfg, s, params, q, t, s.problem.ref)
    return s._replace(i=s.i + 1)


def result(cfg: ApgdConfig, s: ApgdState, params) -> AttackResult:
    """``x_adv``: the best run's highest-objective point; ``best_x``: the best-so-far point."""
    del cfg, params
    ev, best = s.final_ev, s.run.best
    return AttackResult(
        x_adv=s.final_x,
        success=ev.success,
        objective=ev.obj,
        member_loss=ev.losses,
        queries=Q.per_member(s.run.count, s.run.grads, s.problem.mask),
        best_x=best.x,
        best_success=best.ev.success,
        best_objective=best.ev.obj,
    )


def apgd_attack(cfg: ApgdConfig) -> Attack:
    """The state machine: ``restarts * max(n_targets, 1)`` runs of ``n_iter + 1`` steps each
    (the start's gradient, then ``n_iter`` iterations)."""
    return Attack(init, step, result, cfg.restarts * max(cfg.n_targets, 1) * (cfg.n_iter + 1), cfg, E.prepare_cfg)


def make_apgd(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    n_iter: int = 100,
    loss: str = "ce",
    targeted: bool = False,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
    schedule: APGDSchedule = DEFAULT_SCHEDULE,
) -> AttackFn:
    """APGD-CE / APGD-DLR (untargeted) or targeted APGD with user-given targets.

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"``, ``"l2"`` or ``"l1"``.
      eps: default radius (scalar or ``[B]``).
      n_iter: iterations per restart (AutoAttack: 100).
      loss: ``"ce"`` or ``"dlr"`` (DLR needs >= 3 classes; targeted DLR >= 4).
      targeted: if True, ``ref`` holds targets (loss: CE toward the target, or
        targeted DLR leaving the clean prediction) and success = prediction ==
        target.  For AutoAttack's APGD-T use :func:`make_apgd_t`.
      box, audit: as in :func:`sarjax.attacks.pgd.make_pgd`.
      eot: EOT draws of a stochastic ``apply(params, x, key)`` (AutoAttack's ``eot_iter``; its
        randomized-defense version uses 20), as in :func:`sarjax.attacks.pgd.make_pgd`; the
        clean logits that give the clean prediction are one draw, and each run's
        highest-objective point is re-evaluated (``eot * M`` queries) on the clean evaluation's
        draws before runs are compared.
      schedule: the step-size schedule constants and restarts, an :class:`APGDSchedule`
        (default ``DEFAULT_SCHEDULE = APGDSchedule()``: AutoAttack's ``restarts=1, rho=0.75, momentum=0.75``,
        initial step ``2 eps`` (linf, l2) or ``eps`` (l1), ``l1_topk=0.2``,
        ``projection="reference"``; each default's source in :class:`APGDSchedule`).

    Returns:
      An AttackFn (as :func:`sarjax.attacks.pgd.make_pgd`):
      ``fn(params, x0, ref, *, key, mask=None, eps=None, max_queries=None)
      -> AttackResult``; ``x_adv`` is the highest-objective point of the best
      restart; queries per iteration are M forwards + one backward per
      selected member.
    """
    p = canonical_norm(norm)
    if p == 0.0:
        raise ValueError("APGD supports l1, l2, linf; got l0")
    V.check_loss(loss, targeted)
    if loss not in ("ce", "dlr"):
        raise ValueError(f"APGD loss must be 'ce' or 'dlr', got {loss!r}")
    n_iter = V.check_positive_int("n_iter", n_iter)
    kind = (loss + "-targeted") if targeted else loss
    cfg = _config(apply, p, n_iter, kind, 0, targeted, box, eot, schedule)
    return _public(cfg, f"apgd-{kind}", eps, audit, "targets" if targeted else "labels")


def make_apgd_t(
    apply: Callable,
    *,
    norm="linf",
    eps=None,
    n_iter: int = 100,
    n_targets: int = 9,
    box=(0.0, 1.0),
    audit: bool = True,
    eot: int = 1,
    schedule: APGDSchedule = DEFAULT_SCHEDULE,
) -> AttackFn:
    """APGD-T (AutoAttack): targeted DLR toward each of the top ``n_targets`` other classes.

    For every target (the classes with the highest clean logits other than
    ``ref``, per member) one APGD run of ``n_iter`` iterations (x ``restarts``)
    maximises the targeted DLR loss; success is misclassification
    (prediction != ref), as in AutoAttack.  Defaults: 9 targets, 100
    iterations, 1 restart each (AutoAttack's standard version).  Needs >= 4
    classes; ``n_targets`` is capped at C - 1.

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm, eps, n_iter, box, audit, eot: see :func:`make_apgd` (with EOT the targets are ranked
        on one draw of the clean logits).
      n_targets: number of target classes.
      schedule: as :func:`make_apgd` (an :class:`APGDSchedule`); its ``restarts`` are runs per
        target.

    Returns:
      An AttackFn (as :func:`sarjax.attacks.pgd.make_pgd`):
      ``fn(params, x0, labels, *, key, mask=None, eps=None, max_queries=None) -> AttackResult``.
    """
    p = canonical_norm(norm)
    if p == 0.0:
        raise ValueError("APGD-T supports l1, l2, linf; got l0")
    n_targets = V.check_positive_int("n_targets", n_targets)
    n_iter = V.check_positive_int("n_iter", n_iter)
    cfg = _config(apply, p, n_iter, "dlr-targeted", n_targets, False, box, eot, schedule)
    return _public(cfg, "apgd-t", eps, audit, "labels")


def _config(apply, p, n_iter, kind, n_targets, targeted, box, eot, schedule) -> ApgdConfig:
    """The checked :class:`ApgdConfig` (``schedule.step0`` None: 1 for l1, 2 for linf / l2, AutoAttack)."""
    if not isinstance(schedule, APGDSchedule):
        raise TypeError(f"schedule must be an APGDSchedule, got {type(schedule).__name__} {schedule!r}")
    restarts = V.check_positive_int("APGDSchedule.restarts", schedule.restarts)
    rho = _sched_float("rho", schedule.rho)
    momentum = _sched_float("momentum", schedule.momentum)
    step0 = schedule.step0
    step0 = (1.0 if p == 1.0 else 2.0) if step0 is None else _sched_float("step0", step0, positive=True)
    return ApgdConfig(
        apply,
        p,
        n_iter,
        restarts,
        kind,
        n_targets,
        targeted,
        rho,
        momentum,
        step0,
        tuple(float(b) for b in box),
        _check_topk(schedule.l1_topk),
        V.check_eot(eot),
        _check_projection(schedule.projection),
    )


def _sched_float(field: str, v, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        want = "a finite float > 0" if positive else "a finite float"
        raise ValueError(f"APGDSchedule.{field} must be {want}, got {v!r}")
    return float(v)


def _public(cfg: ApgdConfig, name: str, eps, audit: bool, ref_name: str) -> AttackFn:
    return V.public(
        apgd_attack(cfg),
        name=name,
        p=cfg.p,
        default_eps=eps,
        box=cfg.box,
        audit=audit,
        apply=cfg.apply,
        eot=cfg.eot,
        ref_name=ref_name,
    )


def _check_topk(topk):
    if isinstance(topk, bool) or not isinstance(topk, (int, float)) or not 0.0 < topk <= 1.0:
        raise ValueError(f"APGDSchedule.l1_topk must be a float in (0, 1], got {topk!r}")
    return float(topk)


def _check_projection(projection):
    if projection not in PROJECTIONS:
        raise ValueError(f"APGDSchedule.projection must be one of {PROJECTIONS}, got {projection!r}")
    return projection
