"""Host-side validation and the bound audit of the fixed-budget attacks' public entry.

Everything here runs OUTSIDE jit, at the public boundary (DESIGN.md "Conventions"): the audited
entry (``fn(...)`` of :class:`~sarjax.attacks.core.entry.AttackFn`) calls the validator that
:func:`make_validate` builds (shapes, box, finite inputs, labels in ``[0, C)``, eps, query caps,
sample ids, warm starts -> a :class:`~sarjax.attacks.core.protocol.Problem`), runs the jitted
state machine, then the audit :func:`make_audit` builds (ball, box and NaN of ``x_adv`` and
``best_x`` measured against the ORIGINAL ``x0``). The jit-safe entry (``fn.jit``) skips both.

Factories validate their hyperparameters with :func:`check_loss`, :func:`check_positive_int`,
:func:`check_step` and :func:`check_eot`. Errors are ``ValueError`` / ``TypeError`` naming what
was expected and what came.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.audit import check
from sarjax.attacks.core.entry import AttackFn, host
from sarjax.attacks.core.evaluate import SAMPLE_ID_LIMIT, at_key
from sarjax.attacks.core.protocol import Attack, Problem
from sarjax.attacks.losses import LOSSES
from sarjax.attacks.threat import Threat, check_labels


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
        raise ValueError(f"sample_ids must lie in [0, 2**31): samples {bad[:10].tolist()} have {a[bad[:10]].tolist()}")
    return jnp.asarray(a, jnp.int32)


def check_eot(eot) -> int:
    """Validates the number of EOT draws (an int >= 1)."""
    if isinstance(eot, bool) or not isinstance(eot, int) or eot < 1:
        raise ValueError(f"eot must be an int >= 1, got {eot!r}")
    return eot


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
        raise ValueError(
            f"the model cannot take x0 of shape {list(np.shape(x0))} (expected {expected}): {type(e).__name__}: {first}"
        ) from e
    return (int(shape[0]) if len(shape) == 3 else 1), int(shape[-1])


def members_of(apply: Callable, params, x0: jax.Array) -> int:
    """The member count ``M`` of ``apply`` on ``x0`` (1 for ``[B, C]`` logits), found by tracing only."""
    return logits_shape(apply, params, x0)[0]


def make_validate(*, name: str, p: float, box, apply: Callable, eot: int = 1, ref_name: str = "labels") -> Callable:
    """The host-side validator of a fixed-budget attack's public entry.

    Returns ``validate(params, x0, ref, mask, key, eps, max_queries, x_init, sample_ids) ->
    Problem``: :func:`normalize_inputs`, sample ids (:func:`check_sample_ids`), labels / targets
    in ``[0, C)`` of ``apply``'s logits (``ref_name`` names them in the error; ``ref [B]`` and no
    mask are shared by every member ``apply`` returns), the per-sample query cap (at least the
    clean evaluation, ``eot * M``) and the warm start's shape. With ``eot > 1`` ``apply`` is the
    stochastic ``apply(params, x, key)``.
    """

    def validate(params, x0, ref, mask, key, eps, max_queries, x_init, sample_ids) -> Problem:
        x0n, refn, maskn, eps_arr = normalize_inputs(x0, ref, mask, eps, None, box, p)
        b = x0n.shape[0]
        sid = check_sample_ids(sample_ids, b)
        m_apply, n_classes = logits_shape(at_key(apply, eot, jax.random.PRNGKey(0)), params, x0n)
        check_labels(refn, n_classes, name=ref_name)
        if refn.shape[1] == 1 and m_apply > 1:
            refn = jnp.broadcast_to(refn, (b, m_apply))
            maskn = jnp.broadcast_to(maskn, refn.shape)
        cap = Q.normalize_cap(max_queries, b)
        m = int(refn.shape[-1])
        if max_queries is not None and int(np.min(np.asarray(cap))) < eot * m:
            what = f"M = {m}" if eot == 1 else f"eot * M = {eot} * {m}"
            raise ValueError(
                f"max_queries must be >= {what} per sample: the clean evaluation of every "
                f"member is charged before any step; got {max_queries!r}"
            )
        if x_init is None:
            xi, has = x0n, jnp.asarray(False)
        else:
            xi = jnp.asarray(x_init, jnp.float32)
            if xi.shape != x0n.shape:
                raise ValueError(f"x_init must have the shape of x0 {x0n.shape}, got {xi.shape}")
            has = jnp.asarray(True)
        return Problem(x0n, refn, maskn, eps_arr, cap, key, sid, xi, has)

    return validate


def make_audit(*, name: str, p: float, box) -> Callable:
    """``audit(problem, result)``: :func:`sarjax.attacks.audit.check` of ``result.x_adv`` and
    ``result.best_x`` against the ORIGINAL ``problem.x0`` with per-sample ``problem.eps``;
    raises ``ValueError`` naming the offending samples."""

    def audit(problem: Problem, res) -> None:
        threat = Threat(p, host(problem.eps), box)
        check(problem.x0, res.x_adv, threat, what=f"{name} (x_adv)")
        check(problem.x0, res.best_x, threat, what=f"{name} (best_x)")

    return audit


def public(
    attack: Attack,
    *,
    name: str,
    p: float,
    default_eps,
    box,
    audit: bool = True,
    apply: Callable,
    eot: int = 1,
    ref_name: str = "labels",
) -> AttackFn:
    """The :class:`~sarjax.attacks.core.entry.AttackFn` of a fixed-budget attack: the validator
    of :func:`make_validate`, the audit of :func:`make_audit` (None with ``audit=False``)."""
    box = tuple(float(b) for b in box)
    # the jit entry reads M from apply's logits by tracing: a stochastic apply at a fixed key
    shape_apply = at_key(apply, eot, jax.random.PRNGKey(0))
    return AttackFn(
        attack,
        name=name,
        apply=shape_apply,
        default_eps=default_eps,
        validate=make_validate(name=name, p=p, box=box, apply=apply, eot=eot, ref_name=ref_name),
        audit=make_audit(name=name, p=p, box=box) if audit else None,
    )
