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
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from sarjax.attacks import _engine as E
from sarjax.attacks import geometry as G
from sarjax.attacks import queries as Q
from sarjax.attacks.losses import cross_entropy, dlr, dlr_targeted, fooled
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import canonical_norm


L1_TOPK = 0.2          # initial top-k share (AutoAttack autopgd_base.py, l1)
L1_CHECK_EVERY = 0.04  # checkpoint period as a share of n_iter (idem)
L1_SPARSER = 0.95      # "sparser" threshold on sp / sp_last (idem)
L1_SHRINK = 1.5        # topk = sp / d / 1.5 and step / 1.5 (idem, adasp_redstep)
L1_MIN_STEP = 10.0     # step >= initial step / 10 (idem, adasp_minstep)


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


class ApgdConfig(NamedTuple):
    """Static APGD description (hashable; keys the jit cache)."""

    apply: Callable
    p: float
    n_iter: int
    restarts: int
    loss: str            # "ce" | "dlr" | "dlr-targeted" | "ce-targeted"
    n_targets: int       # 0 = fixed ref; k = APGD-T over the top-k other classes
    hit_target: bool     # success = prediction == ref (user targets) instead of != ref
    rho: float
    alpha: float
    step0: float         # initial step as a multiple of eps
    box: tuple
    l1_topk: float       # l1: initial top-k share of the sparse steps
    eot: int = 1         # EOT draws of a stochastic apply(params, x, key) (1: deterministic)


def _losses(cfg, z, leave, target):
    """Per-member loss [M] to maximise: leave ``leave`` / reach ``target``."""
    if cfg.loss == "ce":
        return cross_entropy(z, leave)
    if cfg.loss == "dlr":
        return dlr(z, leave)
    if cfg.loss == "ce-targeted":
        return -cross_entropy(z, target)
    return dlr_targeted(z, leave, target)


@partial(jax.jit, static_argnums=0)
def apgd_kernel(cfg: ApgdConfig, params, x0, ref, mask, eps, cap, key, x_init, has_init,
                sample_ids=None) -> AttackResult:
    """Batch APGD / APGD-T kernel; arguments as :func:`sarjax.attacks._engine.gradient_kernel`.

    The model runs once per iteration on the whole batch; the step, the
    checkpoint logic and the bookkeeping are written per example and vmapped.
    """
    p, box = cfg.p, cfg.box
    B, M = ref.shape
    n_feat = math.prod(x0.shape[1:])
    k0 = max(int(math.ceil(0.22 * cfg.n_iter)), 1)
    if p == 1.0:
        k0 = max(int(L1_CHECK_EVERY * cfg.n_iter), 1)
    size_decr = max(int(math.ceil(0.03 * cfg.n_iter)), 1)
    k_min = max(int(math.ceil(0.06 * cfg.n_iter)), 1)

    def score(z, ref, mask, leave, target):
        ev = E.evaluation(_losses(cfg, z, leave, target), fooled(z, ref, cfg.hit_target), mask)
        return ev.obj, ev

    eot = cfg.eot
    ekey = jax.random.fold_in(key, E.EOT_SALT)   # draws of run r, iteration i: fold_in(fold_in(ekey, r + 1), i + 1)
    clean_key = jax.random.fold_in(ekey, 0)
    apply, params, evaluate, vg = E.kernel_evaluators(cfg.apply, params, score, eot)
    # EOT: the clean logits that rank the targets / give the clean prediction are one draw
    clean_apply = E.at_key(apply, eot, jax.random.fold_in(clean_key, 0))

    def direction(g, x, topk):
        if p == 1.0:
            return sparse_sign_direction(g, x, topk, box)
        return G.steepest(g, p)

    n_sel = jnp.sum(mask > 0, axis=1).astype(jnp.int32)
    live = n_sel > 0
    cost = eot * (M + n_sel)
    reserve = 0 if eot == 1 else eot * M   # EOT: each run's final re-evaluation of xmax
    z0 = E.batch_logits(clean_apply, params, x0)               # [B, M, C], same forward as ev0
    order = jnp.argsort(-z0, axis=-1)
    # user targets: ref is the target, leave the clean prediction; else leave ref
    leave = order[..., 0].astype(jnp.int32) if cfg.hit_target else ref
    _, ev0 = evaluate(params, x0, ref, mask, leave, ref, clean_key)
    count = jnp.full((B,), eot * M, jnp.int32)
    keys = E.sample_keys(key, sample_ids, B)   # run r's random start: fold_in(keys[b], r)
    warm = jax.vmap(lambda x, c, e: G.project(x, c, e, p, box))(x_init, x0, eps)
    zo = jnp.where(jax.nn.one_hot(ref, z0.shape[-1], dtype=bool), -jnp.inf, z0)
    ranked = jnp.argsort(-zo, axis=-1).astype(jnp.int32)     # other classes by clean logit

    def pre(st, i, x0, eps):
        x, x_old = st["x"], st["x_old"]
        z1 = G.project(x + st["eta"] * direction(st["g"], x, st["topk"]), x0, eps, p, box)
        if p == 1.0:  # l1-APGD takes no momentum step
            return z1
        a = jnp.where(i > 0, cfg.alpha, 1.0)
        return G.project(x + a * (z1 - x) + (1.0 - a) * (x - x_old), x0, eps, p, box)

    def post(st, x1, f1, g1, ev1, ok, cost, x0, eps):
        new = dict(st)
        new["best"] = E.update_best(st["best"], x1, ev1, ok)
        new["x_old"], new["x"], new["g"], new["f"] = st["x"], x1, g1, f1
        new["inc"] = st["inc"] + (f1 > st["f"]).astype(jnp.int32)
        improved = f1 > st["fmax"]
        new["fmax"] = jnp.where(improved, f1, st["fmax"])
        new["xmax"] = jnp.where(improved, x1, st["xmax"])
        new["gmax"] = jnp.where(improved, g1, st["gmax"])
        ctr = st["ctr"] + 1
        at_ckpt = ctr == st["k"]
        if p == 1.0:
            sp = G.norm(new["xmax"] - x0, 0)
            topk, eta, sp_last, back = l1_sparsity_update(sp, st["sp_last"], st["eta"],
                                                          cfg.step0 * eps, n_feat)
            halve = at_ckpt & back
            new["eta"] = jnp.where(at_ckpt, eta, st["eta"])
            new["topk"] = jnp.where(at_ckpt, topk, st["topk"])
            new["sp_last"] = jnp.where(at_ckpt, sp_last, st["sp_last"])
        else:
            osc = new["inc"] <= cfg.rho * st["k"]
            no_impr = (~st["reduced"]) & (st["f_last"] >= new["fmax"])
            halve = at_ckpt & (osc | no_impr)
            new["eta"] = jnp.where(halve, st["eta"] / 2, st["eta"])
            new["reduced"] = jnp.where(at_ckpt, halve, st["reduced"])
            new["f_last"] = jnp.where(at_ckpt, new["fmax"], st["f_last"])
            new["k"] = jnp.where(at_ckpt, jnp.maximum(st["k"] - size_decr, k_min), st["k"])
        new["x"] = jnp.where(halve, new["xmax"], new["x"])
        new["g"] = jnp.where(halve, new["gmax"], new["g"])
        new["inc"] = jnp.where(at_ckpt, 0, new["inc"])
        new["ctr"] = jnp.where(at_ckpt, 0, ctr)
        new["count"] = Q.charge(st["count"], cost, ok)
        return E.select(ok, new, st)

    vpre = jax.vmap(pre, in_axes=(0, None, 0, 0))
    vpost = jax.vmap(post)
    upd = jax.vmap(E.update_best)

    def run(carry, r):
        count, best, final = carry
        # APGD-T: run r targets the (r % n_targets + 1)-th most likely other class, per member
        target = ranked[..., r % cfg.n_targets] if cfg.n_targets else ref
        ok0 = live & Q.allowed(count, cost + reserve, cap)
        kr = jax.vmap(lambda k: jax.random.fold_in(k, r))(keys)
        x = jax.vmap(lambda k, c, e: G.random_in_ball(k, c, e, p, box))(kr, x0, eps)
        x = jnp.where(has_init & (r == 0), warm, x)
        rkey = jax.random.fold_in(ekey, r + 1)
        (_, ev), g = vg(params, x, ref, mask, leave, target, jax.random.fold_in(rkey, 0))
        f = ev.obj
        count = Q.charge(count, cost, ok0)
        best = upd(best, x, ev, ok0)
        zeros = jnp.zeros((B,), jnp.int32)
        # l1: AutoAttack starts from topk = 0.2 (sp_last = d), or from a warm start's sparsity
        warm_run = has_init & (r == 0)
        sp0 = jax.vmap(lambda a, b: G.norm(a - b, 0))(x, x0)
        topk0 = jnp.where(warm_run, sp0 / n_feat / L1_SHRINK, cfg.l1_topk)
        sp_last0 = jnp.where(warm_run, sp0, float(n_feat))
        st = dict(x=x, x_old=x, g=g, f=f, fmax=f, xmax=x, gmax=g, eta=cfg.step0 * eps, ctr=zeros,
                  k=zeros + k0, inc=zeros, f_last=f, reduced=jnp.zeros((B,), bool), count=count,
                  best=best, topk=topk0.astype(jnp.float32), sp_last=sp_last0.astype(jnp.float32))

        def body(st, i):
            ok = ok0 & Q.allowed(st["count"], cost + reserve, cap)
            x1 = vpre(st, i, x0, eps)
            (_, ev1), g1 = vg(params, x1, ref, mask, leave, target, jax.random.fold_in(rkey, i + 1))
            return vpost(st, x1, ev1.obj, g1, ev1, ok, cost, x0, eps), None

        st, _ = jax.lax.scan(body, st, jnp.arange(cfg.n_iter))
        xm = st["xmax"]
        if eot == 1:
            _, evm = evaluate(params, xm, ref, mask, leave, target, None)  # re-derived (seen before: no query)
            count_r = st["count"]
        else:  # EOT: re-evaluated on the clean evaluation's draws (paired with x0, independent of the
            # draws that selected xm), charged and reserved like a final evaluation
            _, evm = evaluate(params, xm, ref, mask, leave, target, clean_key)
            count_r = Q.charge(st["count"], reserve, ok0)
        final = jax.vmap(E.select)(ok0 & (evm.obj > final[1].obj), (xm, evm), final)
        return (count_r, st["best"], final), None

    n_runs = cfg.restarts * max(cfg.n_targets, 1)
    carry = (count, E.Best(x0, ev0), (x0, ev0))
    (count, best, (xf, evf)), _ = jax.lax.scan(run, carry, jnp.arange(n_runs))
    return AttackResult(x_adv=xf, success=evf.success, objective=evf.obj, member_loss=evf.losses,
                        queries=count, best_x=best.x, best_success=best.ev.success,
                        best_objective=best.ev.obj)


def make_apgd(apply: Callable, *, norm="linf", eps=None, n_iter: int = 100, restarts: int = 1,
              loss: str = "ce", targeted: bool = False, rho: float = 0.75, momentum: float = 0.75,
              step0: float | None = None, l1_topk: float = L1_TOPK, box=(0.0, 1.0),
              audit: bool = True, eot: int = 1) -> Callable:
    """APGD-CE / APGD-DLR (untargeted) or targeted APGD with user-given targets.

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm: ``"linf"``, ``"l2"`` or ``"l1"``.
      eps: default radius (scalar or ``[B]``).
      n_iter: iterations per restart (AutoAttack: 100).
      restarts: restarts from random points of the eps-ball of x0 (AutoAttack: 1).
      loss: ``"ce"`` or ``"dlr"`` (DLR needs >= 3 classes; targeted DLR >= 4).
      targeted: if True, ``ref`` holds targets (loss: CE toward the target, or
        targeted DLR leaving the clean prediction) and success = prediction ==
        target.  For AutoAttack's APGD-T use :func:`make_apgd_t`.
      rho: checkpoint condition threshold (0.75; linf and l2).
      momentum: alpha (0.75; linf and l2, l1-APGD takes no momentum step).
      step0: initial step / eps (2 for linf and l2, 1 for l1).
      l1_topk: l1 only, initial share of coordinates in a sparse step (0.2,
        AutoAttack), adapted at the checkpoints (see the module docstring).
      box, audit: as in :func:`sarjax.attacks.pgd.make_pgd`.
      eot: EOT draws of a stochastic ``apply(params, x, key)`` (AutoAttack's ``eot_iter``; its
        randomized-defense version uses 20), as in :func:`sarjax.attacks.pgd.make_pgd`; the
        clean logits that give the clean prediction are one draw, and each run's
        highest-objective point is re-evaluated (``eot * M`` queries) on the clean evaluation's
        draws before runs are compared.

    Returns:
      ``fn(params, x0, ref, mask=None, key=None, *, eps=None, max_queries=None)
      -> AttackResult``; ``x_adv`` is the highest-objective point of the best
      restart; queries per iteration are M forwards + one backward per
      selected member.
    """
    p = canonical_norm(norm)
    if p == 0.0:
        raise ValueError("APGD supports l1, l2, linf; got l0")
    E.check_loss(loss, targeted)
    if loss not in ("ce", "dlr"):
        raise ValueError(f"APGD loss must be 'ce' or 'dlr', got {loss!r}")
    n_iter = E.check_positive_int("n_iter", n_iter)
    restarts = E.check_positive_int("restarts", restarts)
    if step0 is None:
        step0 = 1.0 if p == 1.0 else 2.0
    kind = (loss + "-targeted") if targeted else loss
    cfg = ApgdConfig(apply, p, n_iter, restarts, kind, 0, targeted, float(rho), float(momentum),
                     float(step0), tuple(float(b) for b in box), _check_topk(l1_topk), E.check_eot(eot))
    return E.public(partial(apgd_kernel, cfg), name=f"apgd-{kind}", p=p, default_eps=eps, box=box,
                    audit_output=audit, apply=apply, eot=cfg.eot,
                    ref_name="targets" if targeted else "labels")


def make_apgd_t(apply: Callable, *, norm="linf", eps=None, n_iter: int = 100, n_targets: int = 9,
                restarts: int = 1, rho: float = 0.75, momentum: float = 0.75,
                step0: float | None = None, l1_topk: float = L1_TOPK, box=(0.0, 1.0),
                audit: bool = True, eot: int = 1) -> Callable:
    """APGD-T (AutoAttack): targeted DLR toward each of the top ``n_targets`` other classes.

    For every target (the classes with the highest clean logits other than
    ``ref``, per member) one APGD run of ``n_iter`` iterations (x ``restarts``)
    maximises the targeted DLR loss; success is misclassification
    (prediction != ref), as in AutoAttack.  Defaults: 9 targets, 100
    iterations, 1 restart each (AutoAttack's standard version).  Needs >= 4
    classes; ``n_targets`` is capped at C - 1.

    Args:
      apply: ``apply(params, x [B, *S]) -> logits [M, B, C]`` (or ``[B, C]``).
      norm, eps, n_iter, rho, momentum, step0, l1_topk, box, audit, eot: see :func:`make_apgd`
        (with EOT the targets are ranked on one draw of the clean logits).
      n_targets: number of target classes.
      restarts: runs per target.

    Returns:
      ``fn(params, x0, labels, mask=None, key=None, *, eps=None, max_queries=None) -> AttackResult``.
    """
    p = canonical_norm(norm)
    if p == 0.0:
        raise ValueError("APGD-T supports l1, l2, linf; got l0")
    n_targets = E.check_positive_int("n_targets", n_targets)
    n_iter = E.check_positive_int("n_iter", n_iter)
    restarts = E.check_positive_int("restarts", restarts)
    if step0 is None:
        step0 = 1.0 if p == 1.0 else 2.0
    cfg = ApgdConfig(apply, p, n_iter, restarts, "dlr-targeted", n_targets, False, float(rho),
                     float(momentum), float(step0), tuple(float(b) for b in box), _check_topk(l1_topk),
                     E.check_eot(eot))
    return E.public(partial(_apgd_t_kernel, cfg), name="apgd-t", p=p, default_eps=eps, box=box,
                    audit_output=audit, apply=apply, eot=cfg.eot)


def _check_topk(topk):
    if isinstance(topk, bool) or not isinstance(topk, (int, float)) or not 0.0 < topk <= 1.0:
        raise ValueError(f"l1_topk must be a float in (0, 1], got {topk!r}")
    return float(topk)


def _apgd_t_kernel(cfg, params, x0, ref, mask, eps, cap, key, x_init, has_init, sample_ids=None):
    # n_targets is capped at C - 1 once C is known (trace time).
    apply = E.at_key(cfg.apply, cfg.eot, jax.random.PRNGKey(0))
    C = jax.eval_shape(lambda x: E.batch_logits(apply, params, x), x0[:1]).shape[-1]
    return apgd_kernel(cfg._replace(n_targets=min(cfg.n_targets, C - 1)), params, x0, ref, mask, eps,
                       cap, key, x_init, has_init, sample_ids)


