"""Shared machinery of the fixed-budget attacks (internal).

The model runs once per step on the whole batch (``apply(params, x [B, *S])``);
the per-sample logic (losses, steps, projections, best-so-far, query
accounting) is written for ONE example and vmapped over the batch; steps run
in ``lax.scan``; restarts run in an outer ``lax.scan`` and every restart
starts from ``x0`` (random start inside the ball of ``x0``), never from a
previous restart's output.  Restarts are combined by final objective; the
best-so-far point over every evaluated iterate is kept separately.

Query accounting (one forward or backward pass of one member on one sample =
1 query): the clean evaluation costs M; a gradient step costs M forwards
(every member is evaluated to track per-member success) plus one backward per
selected member; a restart's final evaluation costs M.  A step or restart
only runs if it fits under the per-sample cap, with the restart's final
evaluation reserved; samples with no selected member take no steps.  With
``eot`` draws (Expectation over Transformation) every evaluation and every
step runs ``eot`` times and costs ``eot`` times as much.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import geometry as G
from sarjax.attacks import queries as Q
from sarjax.attacks.audit import check
from sarjax.attacks.losses import LOSSES, fooled, member_loss
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import Threat, check_labels


class Evaluation(NamedTuple):
    """One example evaluated at one point."""

    obj: jax.Array      # []
    losses: jax.Array   # [M]
    success: jax.Array  # [M] bool
    n_fooled: jax.Array  # [] int32, selected members fooled


def batch_logits(apply: Callable, params, x: jax.Array) -> jax.Array:
    """Logits ``[B, M, C]`` of every member on a batch ``x: [B, *S]``.

    ``apply`` is evaluated ONCE on the whole batch (the model is naturally
    batched; XLA runs it faster than a per-example vmap of ``apply(x[None])``).
    """
    z = apply(params, x)
    if z.ndim == 2:
        z = z[None]
    if z.ndim != 3 or z.shape[1] != x.shape[0]:
        raise ValueError(f"apply must return logits [M, B, C] or [B, C] with B={x.shape[0]}, got {z.shape}")
    return jnp.swapaxes(z, 0, 1)


def prepare(apply: Callable, params):
    """``(apply, params)`` to use inside an attack kernel's loops.

    When ``apply`` is a bound method of an object with ``prepare_apply`` (e.g. ``pool.apply``),
    its x-independent weight layouts are computed once, here, instead of on every step (XLA does
    not hoist them out of ``lax.scan``); any other ``apply`` is returned as is.
    """
    owner = getattr(apply, "__self__", None)
    prep = getattr(owner, "prepare_apply", None)
    if callable(prep) and getattr(apply, "__name__", "") == "apply":
        return prep(params)
    return apply, params


def make_batch_evaluate(apply: Callable, per_example: Callable):
    """Batched evaluation built from a per-example scorer.

    ``per_example(z [M, C], ref [M], mask [M], *extra) -> (obj, Evaluation)``
    is vmapped over the batch; the returned ``evaluate(params, x [B, *S], ref
    [B, M], mask [B, M], *extra) -> (sum of obj, Evaluation with batch axis)``
    has the per-sample gradients as its gradient in ``x`` (samples are
    independent).
    """

    def evaluate(params, x, ref, mask, *extra):
        z = batch_logits(apply, params, x)
        if z.shape[1] != ref.shape[1]:
            raise ValueError(f"apply returned {z.shape[1]} members but ref/mask have {ref.shape[1]}")
        obj, ev = jax.vmap(per_example)(z, ref, mask, *extra)
        return jnp.sum(obj), ev

    return evaluate


def evaluation(losses: jax.Array, succ: jax.Array, mask: jax.Array) -> Evaluation:
    """One example's :class:`Evaluation` from its member losses ``[M]`` and success ``[M]``:
    the objective is the mask-weighted mean loss, ``n_fooled`` counts the selected members fooled."""
    w = mask.astype(losses.dtype)
    obj = jnp.sum(w * losses) / jnp.maximum(jnp.sum(w), 1.0)
    n = jnp.sum(succ & (mask > 0)).astype(jnp.int32)
    return Evaluation(obj, losses, succ, n)


def scorer(loss: str, targeted: bool) -> Callable:
    """Per-example ``(z [M, C], ref [M], mask [M], source [M]) -> (obj, Evaluation)``."""

    def score(z, ref, mask, source):
        ev = evaluation(member_loss(z, ref, loss, targeted, source), fooled(z, ref, targeted), mask)
        return ev.obj, ev

    return score


class Best(NamedTuple):
    """Best-so-far point of one example, ranked by (n_fooled, obj)."""

    x: jax.Array
    ev: Evaluation


def better(new: Evaluation, old: Evaluation) -> jax.Array:
    """Whether ``new`` beats ``old``: more selected members fooled, then higher objective."""
    return (new.n_fooled > old.n_fooled) | ((new.n_fooled == old.n_fooled) & (new.obj > old.obj))


def select(pred, a, b):
    """``a`` if ``pred`` else ``b`` for pytrees (scalar predicate)."""
    return jax.tree.map(lambda u, v: jnp.where(pred, u, v), a, b)


def update_best(best: Best, x: jax.Array, ev: Evaluation, valid) -> Best:
    """Replaces ``best`` by ``(x, ev)`` where valid and better."""
    return select(valid & better(ev, best.ev), Best(x, ev), best)


# Per-sample streams are ``fold_in(key, sample_id)`` with sample ids in [0, 2**31); the other
# streams of an attack key are folded in with constants above that range, so no sample's stream
# can coincide with them (0x0E07, the old EOT salt, was sample 3591's stream).
SAMPLE_ID_LIMIT = 2 ** 31
EOT_SALT = 0xE07E_0E07  # folded into the attack key for the EOT draws (independent of the random starts)


def sample_keys(key, sample_ids, batch: int):
    """Per-sample keys ``[B]``: ``fold_in(key, sample_id)``, so a sample's random stream depends on
    its index in the data set, never on its position in the batch (chunking, padding, sharding
    and resume give the same draws).  ``sample_ids=None``: ``arange(B)`` (with JAX's partitionable
    threefry, the default, this equals the former ``split(key, B)``)."""
    sid = jnp.arange(batch, dtype=jnp.int32) if sample_ids is None else jnp.asarray(sample_ids)
    return jax.vmap(lambda s: jax.random.fold_in(key, s))(sid.astype(jnp.uint32))


def check_sample_ids(sample_ids, batch: int):
    """Validates ``sample_ids`` (``None`` or int ``[B]`` in ``[0, 2**31)``); returns int32 ``[B]``.

    Duplicates are allowed (padding rows repeat a real sample's id and draw its stream)."""
    if sample_ids is None:
        return jnp.arange(batch, dtype=jnp.int32)
    a = np.asarray(sample_ids)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"sample_ids must be int [B] (each sample's index in the data set), got dtype {a.dtype}")
    if a.shape != (batch,):
        raise ValueError(f"sample_ids must have shape [{batch}] (one per sample), got {a.shape}")
    bad = np.flatnonzero((a < 0) | (a >= SAMPLE_ID_LIMIT))
    if bad.size:
        raise ValueError(f"sample_ids must lie in [0, 2**31): samples {bad[:10].tolist()} have "
                         f"{a[bad[:10]].tolist()}")
    return jnp.asarray(a, jnp.int32)


def check_eot(eot) -> int:
    """Validates the number of EOT draws (an int >= 1)."""
    if isinstance(eot, bool) or not isinstance(eot, int) or eot < 1:
        raise ValueError(f"eot must be an int >= 1, got {eot!r}")
    return eot


def at_key(apply: Callable, eot: int, key) -> Callable:
    """A deterministic ``apply(params, x)``: ``apply`` itself when ``eot == 1``, else the
    stochastic ``apply(params, x, key)`` at the fixed ``key`` (one draw)."""
    if eot == 1:
        return apply
    return lambda params, x: apply(params, x, key)


def kernel_evaluators(apply: Callable, params, per_example: Callable, eot: int):
    """``(apply, params, evaluate, value_and_grad)`` for an attack kernel's loops.

    ``evaluate(params, x, ref, mask, *extra, key)`` and ``value_and_grad(...)`` (same arguments)
    take the EOT draws' key last.  With ``eot == 1`` the key is ignored, ``apply`` is deterministic
    and its weight layouts are prepared once (:func:`prepare`); otherwise they average over
    ``eot`` draws (:func:`make_eot_evaluators`) and ``apply`` is returned as is (stochastic).
    """
    if eot > 1:
        return (apply, params) + make_eot_evaluators(apply, per_example, eot)
    apply, params = prepare(apply, params)
    evaluate_1 = make_batch_evaluate(apply, per_example)
    vg_1 = jax.value_and_grad(evaluate_1, argnums=1, has_aux=True)

    def evaluate(params, x, ref, mask, *extra_and_key):
        return evaluate_1(params, x, ref, mask, *extra_and_key[:-1])

    def value_and_grad(params, x, ref, mask, *extra_and_key):
        return vg_1(params, x, ref, mask, *extra_and_key[:-1])

    return apply, params, evaluate, value_and_grad


def make_eot_evaluators(apply: Callable, per_example: Callable, eot: int):
    """Evaluation and gradient averaged over ``eot`` draws of a stochastic ``apply(params, x, key)``.

    Draw ``d`` of a call with key ``k`` runs ``apply(params, x, fold_in(k, d))`` on the whole batch.
    Per example and member: the loss is the mean over the draws, a member counts as fooled only if
    it is fooled on EVERY draw (success is never claimed on a lucky draw), and the objective is the
    mask-weighted mean of the averaged losses (= the mean of the per-draw objectives).  The
    gradient is the mean of the per-draw gradients (EOT, Athalye et al. 2018; AutoAttack's
    ``eot_iter`` averages gradients the same way).  Draws run in a ``lax.scan`` (memory of one).

    ``per_example`` must build its Evaluation with :func:`evaluation` (as :func:`scorer` does).  Returns ``(evaluate, value_and_grad)`` with the signatures of
    :func:`make_batch_evaluate`'s ``evaluate`` and its ``jax.value_and_grad(..., argnums=1,
    has_aux=True)``, with the draws' key as the last argument.
    """

    def draw(k):
        return make_batch_evaluate(lambda params, x: apply(params, x, k), per_example)

    def run(params, x, ref, mask, extra, key, with_grad):
        def one(carry, d):
            k = jax.random.fold_in(key, d)
            if with_grad:
                (_, ev), g = jax.value_and_grad(draw(k), argnums=1, has_aux=True)(params, x, ref, mask, *extra)
            else:
                _, ev = draw(k)(params, x, ref, mask, *extra)
                g = None
            gs, ls, ss = carry
            return (None if g is None else gs + g.astype(gs.dtype), ls + ev.losses.astype(ls.dtype),
                    ss & ev.success), None

        B, M = ref.shape
        init = (jnp.zeros_like(x) if with_grad else None, jnp.zeros((B, M), jnp.float32),
                jnp.ones((B, M), bool))
        (gs, ls, ss), _ = jax.lax.scan(one, init, jnp.arange(eot))
        ev = jax.vmap(evaluation)(ls / eot, ss, mask)
        return ev, (None if gs is None else gs / eot)

    def evaluate(params, x, ref, mask, *extra_and_key):
        *extra, key = extra_and_key
        ev, _ = run(params, x, ref, mask, extra, key, False)
        return jnp.sum(ev.obj), ev

    def value_and_grad(params, x, ref, mask, *extra_and_key):
        *extra, key = extra_and_key
        ev, g = run(params, x, ref, mask, extra, key, True)
        return (jnp.sum(ev.obj), ev), g

    return evaluate, value_and_grad


# ---------------------------------------------------------------- step rules

class Config(NamedTuple):
    """Static description of a gradient attack (hashable: it keys the jit cache).

    Two factories called with equal configs share one compiled kernel.
    """

    apply: Callable
    p: float
    steps: int
    restarts: int
    random_start: bool
    loss: str
    targeted: bool
    box: tuple
    rel_step: float | None = None    # alpha = rel_step * eps
    abs_step: float | None = None    # or a fixed alpha
    l1_sparsity: float = 0.99
    momentum: float | None = None    # MI-FGSM decay
    eot: int = 1                     # EOT draws per evaluation (apply(params, x, key) when > 1)


def alpha(cfg: Config, eps):
    """Step size of ``cfg`` for radius ``eps``."""
    if cfg.abs_step is not None:
        return jnp.asarray(cfg.abs_step, jnp.float32)
    return cfg.rel_step * eps


def pgd_step(cfg: Config, state, x, g, x0, eps):
    """Projected steepest ascent (PGD; Madry et al. 2018), optionally with MI-FGSM momentum.

    ``state`` is the momentum buffer (unused without momentum).  Returns
    ``(state, x_new)`` with ``x_new`` projected onto the ball of x0 and the box.
    """
    if cfg.momentum is not None:
        state = cfg.momentum * state + g / jnp.maximum(jnp.sum(jnp.abs(g)), 1e-12)
        g = state
    if cfg.p == 1.0:
        d = G.sparse_l1_direction(g, x, cfg.l1_sparsity, cfg.box)
    else:
        d = G.steepest(g, cfg.p)
    return state, G.project(x + alpha(cfg, eps) * d, x0, eps, cfg.p, cfg.box)


# ---------------------------------------------------------------- validation

def normalize_inputs(x0, ref, mask, eps, default_eps, box, p):
    """Validates and normalizes the public-call arguments.

    Returns ``(x0 [B,*S] f32, ref [B,M] i32, mask [B,M] f32, eps [B] f32)``.
    """
    if x0 is None:
        raise ValueError("x0 is required: expected [B, *S] float inputs")
    x0 = jnp.asarray(x0)
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        raise TypeError(f"x0 must be a float array [B, *S], got dtype {x0.dtype}")
    x0 = x0.astype(jnp.float32)
    if x0.ndim < 2:
        raise ValueError(f"x0 must be a batch [B, *S], got shape {x0.shape}")
    B = x0.shape[0]
    x0h = np.asarray(x0)
    if not np.all(np.isfinite(x0h)):
        raise ValueError("x0 contains non-finite values")
    if x0h.size and (x0h.min() < box[0] or x0h.max() > box[1]):
        raise ValueError(f"x0 must lie in the box {box}, got range [{x0h.min()}, {x0h.max()}]")
    ref = jnp.asarray(ref)
    if not jnp.issubdtype(ref.dtype, jnp.integer):
        raise TypeError(f"ref/labels must be int [B] or [B, M], got dtype {ref.dtype}")
    if ref.ndim == 1:
        ref = ref[:, None]
    if ref.ndim != 2 or ref.shape[0] != B:
        raise ValueError(f"ref/labels must have shape [B] or [B, M] with B={B}, got {ref.shape}")
    ref = ref.astype(jnp.int32)
    if mask is None:
        mask = jnp.ones(ref.shape, jnp.float32)
    mask = jnp.asarray(mask)
    if mask.ndim == 1:
        mask = jnp.broadcast_to(mask[None], (B, mask.shape[0]))
    if mask.ndim != 2 or mask.shape[0] != B:
        raise ValueError(f"mask must have shape [M] or [B, M] with B={B}, got {mask.shape}")
    M = max(ref.shape[1], mask.shape[1])
    if ref.shape[1] not in (1, M) or mask.shape[1] not in (1, M):
        raise ValueError(f"ref {ref.shape} and mask {mask.shape} disagree on the member count")
    ref = jnp.broadcast_to(ref, (B, M))
    mask = jnp.broadcast_to(mask.astype(jnp.float32), (B, M))
    e = default_eps if eps is None else eps
    if e is None:
        raise ValueError("eps is required (scalar or [B]) either at construction or call time")
    e_np = np.asarray(e, np.float64)
    if e_np.ndim > 1 or (e_np.ndim == 1 and e_np.shape[0] != B):
        raise ValueError(f"eps must be a scalar or shape [{B}], got shape {e_np.shape}")
    if not np.all(np.isfinite(e_np)) or np.any(e_np < 0):
        raise ValueError(f"eps must be finite and >= 0, got {e!r}")
    eps_arr = jnp.broadcast_to(jnp.asarray(e_np, jnp.float32), (B,))
    return x0, ref, mask, eps_arr


def check_loss(loss, targeted):
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if not isinstance(targeted, bool):
        raise TypeError(f"targeted must be a bool, got {type(targeted).__name__}")


def check_positive_int(name, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
    return int(v)


def check_step(step_size):
    """Validates an absolute step size (``None`` = relative default)."""
    if step_size is None:
        return None
    if isinstance(step_size, bool) or not isinstance(step_size, (int, float)) or not step_size > 0:
        raise ValueError(f"step_size must be a float > 0, got {step_size!r}")
    return float(step_size)


# ---------------------------------------------------------------- the kernel

@partial(jax.jit, static_argnums=0)
def gradient_kernel(cfg: Config, params, x0, ref, mask, eps, cap, key, x_init, has_init,
                    sample_ids=None) -> AttackResult:
    """Batch kernel of the step-rule attacks (FGSM, PGD, MI-FGSM, joint PGD).

    The model runs once per step on the whole batch; the update, projection,
    best-so-far bookkeeping and query accounting are written per example and
    vmapped.

    Args:
      cfg: static :class:`Config`.
      params: model parameters (pytree), passed to ``cfg.apply``.
      x0: ``[B, *S]``; ref: ``[B, M]`` int32; mask: ``[B, M]`` float32;
      eps: ``[B]``; cap: ``[B]`` int32; key: PRNG key (sample b's random start of restart r
      uses ``fold_in(fold_in(key, sample_ids[b]), r)``);
      x_init: ``[B, *S]`` warm start for the first restart, used where the
      scalar bool ``has_init`` is set, after projection onto the ball of x0.
      sample_ids: ``[B]`` int32, each sample's index in the data set (default ``arange(B)``).
    """
    p, box = cfg.p, cfg.box
    B, M = ref.shape
    eot = cfg.eot
    apply, params, evaluate, vg = kernel_evaluators(cfg.apply, params, scorer(cfg.loss, cfg.targeted), eot)
    ekey = jax.random.fold_in(key, EOT_SALT)   # draws of restart r, step t: fold_in(fold_in(ekey, r + 1), t)
    step = jax.vmap(partial(pgd_step, cfg))
    upd = jax.vmap(update_best)
    pick = jax.vmap(select)

    n_sel = jnp.sum(mask > 0, axis=1).astype(jnp.int32)
    live = n_sel > 0
    cost = eot * (M + n_sel)
    # EOT: the clean evaluation and every restart's final evaluation use the SAME draws (common random
    # numbers), so x_adv is chosen among x0 and the restarts by a paired comparison
    clean_key = jax.random.fold_in(ekey, 0)
    if cfg.loss == "dlr" and cfg.targeted:  # targeted DLR leaves the clean prediction
        clean_apply = at_key(apply, eot, jax.random.fold_in(clean_key, 0))
        src = jnp.argmax(batch_logits(clean_apply, params, x0), axis=-1).astype(jnp.int32)
    else:
        src = jnp.zeros_like(ref)
    _, ev0 = evaluate(params, x0, ref, mask, src, clean_key)
    count = jnp.full((B,), eot * M, jnp.int32)
    keys = sample_keys(key, sample_ids, B)
    proj = jax.vmap(lambda x, c, e: G.project(x, c, e, p, box))
    warm = proj(x_init, x0, eps)  # always inside the ball of x0

    def restart(carry, r):
        count, best, final = carry
        run = live & Q.allowed(count, eot * M, cap)
        rkey = jax.random.fold_in(ekey, r + 1)
        if cfg.random_start:
            kr = jax.vmap(lambda k: jax.random.fold_in(k, r))(keys)
            x_start = jax.vmap(lambda k, c, e: G.random_in_ball(k, c, e, p, box))(kr, x0, eps)
        else:
            x_start = x0
        x_start = jnp.where(has_init & (r == 0), warm, x_start)

        def body(c, t):
            x, state, count, best = c
            ok = run & Q.allowed(count, cost + eot * M, cap)
            (_, ev), g = vg(params, x, ref, mask, src, jax.random.fold_in(rkey, t))
            best = upd(best, x, ev, ok)
            state2, x2 = step(state, x, g, x0, eps)
            x = Q.freeze(ok, x2, x)
            state = Q.freeze(ok, state2, state)
            return (x, state, Q.charge(count, cost, ok), best), None

        init = (x_start, jnp.zeros_like(x0), count, best)
        (x, _, count, best), _ = jax.lax.scan(body, init, jnp.arange(cfg.steps))
        _, ev = evaluate(params, x, ref, mask, src, clean_key)   # EOT: the clean evaluation's draws (paired)
        count = Q.charge(count, eot * M, run)
        best = upd(best, x, ev, run)
        final = pick(run & (ev.obj > final[1].obj), (x, ev), final)
        return (count, best, final), None

    carry = (count, Best(x0, ev0), (x0, ev0))
    (count, best, (x_fin, ev_fin)), _ = jax.lax.scan(restart, carry, jnp.arange(cfg.restarts))
    return AttackResult(x_adv=x_fin, success=ev_fin.success, objective=ev_fin.obj,
                        member_loss=ev_fin.losses, queries=count, best_x=best.x,
                        best_success=best.ev.success, best_objective=best.ev.obj)


def logits_shape(apply: Callable, params, x0: jax.Array) -> tuple[int, int]:
    """``(M, C)``: the member count of ``apply`` on ``x0`` (1 for ``[B, C]`` logits) and its number
    of classes (the logits' last axis), found by tracing only (``jax.eval_shape``, no compute).

    Raises ValueError naming the expected and the given input shape when ``apply`` is bound to a
    model with an ``input_shape`` (``Pool.apply``, ``Arch.apply``) that ``x0`` does not match, or
    when ``apply`` cannot trace ``x0`` at all."""
    want = getattr(getattr(apply, "__self__", None), "input_shape", None)
    expected = f"[B, {', '.join(map(str, want))}]" if want is not None else "the shape the model takes"
    if want is not None and tuple(np.shape(x0)[1:]) != tuple(want):
        raise ValueError(f"x0 must have shape {expected}, got {list(np.shape(x0))}")
    try:
        shape = jax.eval_shape(apply, params, x0).shape
    except (TypeError, ValueError) as e:
        first = (str(e).splitlines() or [""])[0]
        raise ValueError(f"the model cannot take x0 of shape {list(np.shape(x0))} (expected {expected}): "
                         f"{type(e).__name__}: {first}") from e
    return (int(shape[0]) if len(shape) == 3 else 1), int(shape[-1])


def members_of(apply: Callable, params, x0: jax.Array) -> int:
    """The member count ``M`` of ``apply`` on ``x0`` (1 for ``[B, C]`` logits), found by tracing only."""
    return logits_shape(apply, params, x0)[0]


def public(kernel, *, name, p, default_eps, box, audit_output=True, apply=None, eot=1, ref_name="labels"):
    """Wraps ``kernel(params, x0, ref, mask, eps, cap, key, x_init, has_init, sample_ids)`` into the
    validated, audited public entry point (see :func:`sarjax.attacks.pgd.make_pgd`).

    With ``apply`` given, labels ``[B]`` and no mask are shared by every member ``apply`` returns
    (``ref`` is broadcast to ``[B, M]``), and every label must be a class of ``apply``'s logits
    (:func:`sarjax.attacks.threat.check_labels`; ``ref_name`` names them in the error).  With
    ``eot > 1``, ``apply`` is stochastic, ``apply(params, x, key)``.
    """

    def fn(params, x0, ref, mask=None, key=None, *, eps=None, max_queries=None,
           x_init=None, sample_ids=None) -> AttackResult:
        x0n, refn, maskn, eps_arr = normalize_inputs(x0, ref, mask, eps, default_eps, box, p)
        sid = check_sample_ids(sample_ids, x0n.shape[0])
        if apply is not None:
            m_apply, n_classes = logits_shape(at_key(apply, eot, jax.random.PRNGKey(0)), params, x0n)
            check_labels(refn, n_classes, name=ref_name)
            if refn.shape[1] == 1 and m_apply > 1:
                refn = jnp.broadcast_to(refn, (refn.shape[0], m_apply))
                maskn = jnp.broadcast_to(maskn, refn.shape)
        if key is None:
            key = jax.random.PRNGKey(0)
        cap = Q.normalize_cap(max_queries, x0n.shape[0])
        m = int(refn.shape[-1]) if refn.ndim == 2 else 1
        if max_queries is not None and int(np.min(np.asarray(cap))) < eot * m:
            what = f"M = {m}" if eot == 1 else f"eot * M = {eot} * {m}"
            raise ValueError(f"max_queries must be >= {what} per sample: the clean evaluation of every "
                             f"member is charged before any step; got {max_queries!r}")
        if x_init is None:
            xi, has = x0n, jnp.asarray(False)
        else:
            xi = jnp.asarray(x_init, jnp.float32)
            if xi.shape != x0n.shape:
                raise ValueError(f"x_init must have the shape of x0 {x0n.shape}, got {xi.shape}")
            has = jnp.asarray(True)
        res = kernel(params, x0n, refn, maskn, eps_arr, cap, key, xi, has, sid)
        if audit_output:
            threat = Threat(p, np.asarray(eps_arr), box)
            check(x0n, res.x_adv, threat, what=f"{name} (x_adv)")
            check(x0n, res.best_x, threat, what=f"{name} (best_x)")
        return res

    fn.kernel = kernel
    fn.__name__ = name
    return fn
