"""Host-side validation and the bound audit of the fixed-budget attacks' public entry.

Everything here runs OUTSIDE jit, at the public boundary (docs/design.md "Conventions"): the audited
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
from sarjax.attacks.core.evaluate import at_key
from sarjax.attacks.core.protocol import Attack, Problem
from sarjax.attacks.losses import LOSSES
from sarjax.attacks.threat import Threat, check_labels
from sarjax.data.images import SAMPLE_ID_LIMIT


def _who(name: str | None) -> str:
    return f"{name}: " if name else ""


def check_x0(x0, box, *, name: str | None = None) -> jax.Array:
    """``x0 [B, *S]``: float, at least one sample and one feature, finite, inside ``box``.

    Returns ``x0`` as float32. Raises ``ValueError`` / ``TypeError`` (prefixed by ``name``)."""
    who = _who(name)
    if x0 is None:
        raise ValueError(f"{who}x0 is required: expected [B, *S] float inputs")
    x0 = jnp.asarray(x0)
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        raise TypeError(f"{who}x0 must be a float array [B, *S], got dtype {x0.dtype}")
    x0 = x0.astype(jnp.float32)
    if x0.ndim < 2:
        raise ValueError(f"{who}x0 must be a batch [B, *S] with at least one feature axis, got shape {x0.shape}")
    if x0.shape[0] == 0:
        raise ValueError(f"{who}empty batch: x0 has 0 samples")
    if x0.size == 0:
        raise ValueError(f"{who}x0 must have at least one feature per sample, got shape {x0.shape}")
    xh = np.asarray(x0).reshape(x0.shape[0], -1)
    bad = np.flatnonzero(~np.isfinite(xh).all(axis=1))
    if bad.size:
        raise ValueError(f"{who}x0 must be finite: samples {bad[:10].tolist()} hold NaN or inf")
    if xh.min() < box[0] or xh.max() > box[1]:
        raise ValueError(f"{who}x0 must lie in the box {tuple(box)}, got range [{xh.min()}, {xh.max()}]")
    return x0


def _shapes(b: int, m: int | None, first: str) -> str:
    return f"[{first}] or [B, M] with B={b}" + ("" if m is None else f", M={m}")


def check_ref(ref, b: int, m: int | None, num_classes: int | None, *, what: str = "ref", name=None) -> np.ndarray:
    """``ref``: int ``[B]`` (shared by the members) or ``[B, M]`` (``[B, 1]`` broadcasts), each in
    ``[0, C)`` (:func:`~sarjax.attacks.threat.check_labels`; skipped with ``num_classes=None``).

    ``what`` names the values in messages (``"labels"``, ``"targets"``); ``m=None``: any member
    count. Returns ``ref`` on the host (unchanged)."""
    who = _who(name)
    a = np.asarray(ref)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{who}{what} must be int {_shapes(b, m, 'B')}, got dtype {a.dtype}")
    ok = (a.ndim == 1 and a.shape[0] == b) or (a.ndim == 2 and a.shape[0] == b and (m is None or a.shape[1] in (1, m)))
    if not ok:
        raise ValueError(f"{who}{what} must be {_shapes(b, m, 'B')}, got shape {a.shape}")
    if num_classes is not None:
        check_labels(a, num_classes, name=what)
    return a


def check_mask(mask, b: int, m: int | None, *, name=None) -> np.ndarray | None:
    """``mask``: ``[M]`` (shared by the samples) or ``[B, M]`` (a member axis of 1 broadcasts),
    bool or holding only 0 and 1 (1: the member is attacked). ``m=None``: any member count.

    Returns the mask on the host (None for None). Raises ``ValueError`` naming the bad values
    (a -1 would flip a member's objective, a NaN poison it)."""
    if mask is None:
        return None
    who = _who(name)
    a = np.asarray(mask)
    ok = (a.ndim == 1 and (m is None or a.shape[0] in (1, m))) or (
        a.ndim == 2 and a.shape[0] == b and (m is None or a.shape[1] in (1, m))
    )
    if not ok:
        raise ValueError(f"{who}mask must be {_shapes(b, m, 'M')}, got shape {a.shape}")
    if a.dtype == np.bool_:
        return a
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise TypeError(f"{who}mask must be bool or {{0, 1}} per member, got dtype {a.dtype}")
    bad = ~np.isin(a, (0, 1))
    if bad.any():
        raise ValueError(f"{who}mask must be bool or {{0, 1}} per member, got values {np.unique(a[bad])[:5].tolist()}")
    return a


def check_eps(eps, b: int, *, name=None) -> jax.Array:
    """``eps``: finite, ``>= 0``, a scalar or ``[B]``; returns float32 ``[B]``."""
    who = _who(name)
    if eps is None:
        raise ValueError(f"{who}eps is required (scalar or [B]) either at construction or call time")
    e = np.asarray(eps, np.float64)
    if e.ndim > 1 or (e.ndim == 1 and e.shape[0] != b):
        raise ValueError(f"{who}eps must be a scalar or shape [{b}], got shape {e.shape}")
    if not np.all(np.isfinite(e)) or np.any(e < 0):
        raise ValueError(f"{who}eps must be finite and >= 0, got {eps!r}")
    return jnp.broadcast_to(jnp.asarray(e, jnp.float32), (b,))


def check_x_init(x_init, x0: jax.Array, *, box=None, name=None) -> jax.Array | None:
    """A warm start: the shape of ``x0``, finite (and inside ``box`` when given); float32.

    Checked before anything runs (a NaN start was clipped into the box silently or blamed on the
    output after the run). None: None."""
    if x_init is None:
        return None
    who = _who(name)
    xi = np.asarray(x_init)
    if xi.shape != tuple(x0.shape):
        raise ValueError(f"{who}x_init must have the shape of x0 {tuple(x0.shape)}, got {xi.shape}")
    if not (np.issubdtype(xi.dtype, np.floating) or np.issubdtype(xi.dtype, np.integer)):
        raise TypeError(f"{who}x_init must be a float array, got dtype {xi.dtype}")
    flat = xi.reshape(xi.shape[0], -1)
    bad = np.flatnonzero(~np.isfinite(flat).all(axis=1))
    if bad.size:
        raise ValueError(f"{who}x_init must be finite: samples {bad[:10].tolist()} hold NaN or inf")
    if box is not None and flat.size and (flat.min() < box[0] or flat.max() > box[1]):
        raise ValueError(f"{who}x_init must lie in the box {tuple(box)}, got range [{flat.min()}, {flat.max()}]")
    return jnp.asarray(x_init, jnp.float32)


def normalize_inputs(x0, ref, mask, eps, default_eps, box, p):
    """Validates and normalizes the public-call arguments when the member count is not known
    (``ref`` and ``mask`` agree on it, or one of them has 1).

    Returns ``(x0 [B,*S] f32, ref [B,M] i32, mask [B,M] f32, eps [B] f32)``.
    """
    x0 = check_x0(x0, box)
    b = x0.shape[0]
    refh = check_ref(ref, b, None, None, what="ref/labels")
    refh = refh[:, None] if refh.ndim == 1 else refh
    checked = check_mask(mask, b, None)
    maskh: np.ndarray = np.ones(refh.shape, np.float32) if checked is None else np.asarray(checked)
    if maskh.ndim == 1:
        maskh = np.broadcast_to(maskh[None], (b, maskh.shape[0]))
    m = max(refh.shape[1], maskh.shape[1])
    if refh.shape[1] not in (1, m) or maskh.shape[1] not in (1, m):
        raise ValueError(f"ref {refh.shape} and mask {maskh.shape} disagree on the member count")
    ref = jnp.broadcast_to(jnp.asarray(refh, jnp.int32), (b, m))
    mask = jnp.broadcast_to(jnp.asarray(maskh).astype(jnp.float32), (b, m))
    eps_arr = check_eps(default_eps if eps is None else eps, b)
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


def setting_float(
    owner: str,
    field: str,
    v,
    *,
    lo: float = 0.0,
    lo_closed: bool = False,
    hi: float | None = None,
    optional: bool = False,
):
    """Checks one float field of a settings object on construction: finite, above ``lo`` (or at
    it when ``lo_closed``) and below ``hi`` (when given); None passes when ``optional``.

    Raises:
      ValueError: naming ``owner.field`` and the value (a bool, a non-number, or out of range).
    """
    if v is None and optional:
        return
    rng = f"{'>=' if lo_closed else '>'} {lo:g}" if hi is None else f"in {'[' if lo_closed else '('}{lo:g}, {hi:g})"
    want = f"a finite float {rng}{' or None' if optional else ''}"
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{owner}.{field} must be {want}, got {type(v).__name__} {v!r}")
    f = float(v)
    if not (np.isfinite(f) and (f >= lo if lo_closed else f > lo) and (hi is None or f < hi)):
        raise ValueError(f"{owner}.{field} must be {want}, got {v!r}")


def setting_int(owner: str, field: str, v, minimum: int = 1):
    """Checks one int field of a settings object on construction (``>= minimum``, not a bool).

    Raises:
      ValueError: naming ``owner.field`` and the value.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"{owner}.{field} must be an int >= {minimum}, got {v!r}")


def setting_bool(owner: str, field: str, v):
    """Checks one flag of a settings object on construction.

    Raises:
      ValueError: naming ``owner.field`` and the value.
    """
    if not isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{owner}.{field} must be a bool, got {type(v).__name__} {v!r}")


def check_sample_ids(sample_ids, batch: int, *, name: str | None = None):
    """Validates ``sample_ids`` (``None`` or int ``[B]`` in ``[0, 2**31)``); returns int32 ``[B]``.

    Duplicates are allowed (padding rows repeat a real sample's id and draw its stream)."""
    if sample_ids is None:
        return jnp.arange(batch, dtype=jnp.int32)
    who = _who(name)
    a = np.asarray(sample_ids)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{who}sample_ids must be int [B] (each sample's index in the data set), got dtype {a.dtype}")
    if a.shape != (batch,):
        raise ValueError(f"{who}sample_ids must have shape [{batch}] (one per sample), got {a.shape}")
    bad = np.flatnonzero((a < 0) | (a >= SAMPLE_ID_LIMIT))
    if bad.size:
        raise ValueError(
            f"{who}sample_ids must lie in [0, 2**31): samples {bad[:10].tolist()} have {a[bad[:10]].tolist()}"
        )
    return jnp.asarray(a, jnp.int32)


def check_eot(eot) -> int:
    """Validates the number of EOT draws (an int >= 1)."""
    if isinstance(eot, bool) or not isinstance(eot, int) or eot < 1:
        raise ValueError(f"eot must be an int >= 1, got {eot!r}")
    return eot


def logits_shape(apply: Callable, params, x0: jax.Array, *, name: str | None = None) -> tuple[int, int]:
    """``(M, C)``: the member count of ``apply`` on ``x0`` (1 for ``[B, C]`` logits) and its number
    of classes (the logits' last axis), found by tracing only (``jax.eval_shape``, no compute).

    Raises ValueError naming the expected and the given input shape when ``apply`` is bound to a
    model with an ``input_shape`` (``Pool.apply``, ``Arch.apply``) that ``x0`` does not match,
    when ``apply`` cannot trace ``x0`` at all, or when it returns something other than logits
    ``[M, B, C]`` or ``[B, C]``."""
    who = _who(name)
    want = getattr(getattr(apply, "__self__", None), "input_shape", None)
    expected = f"[B, {', '.join(map(str, want))}]" if want is not None else "the shape the model takes"
    if want is not None and tuple(np.shape(x0)[1:]) != tuple(want):
        raise ValueError(f"{who}x0 must have shape {expected}, got {list(np.shape(x0))}")
    try:
        shape = tuple(jax.eval_shape(apply, params, x0).shape)
    except (TypeError, ValueError) as e:
        first = (str(e).splitlines() or [""])[0]
        raise ValueError(
            f"{who}the model cannot take x0 of shape {list(np.shape(x0))} (expected {expected}): "
            f"{type(e).__name__}: {first}"
        ) from e
    b = int(np.shape(x0)[0])
    if len(shape) not in (2, 3) or shape[-2] != b:
        raise ValueError(f"{who}apply must return logits [M, B, C] or [B, C] with B={b}, got shape {shape}")
    return (int(shape[0]) if len(shape) == 3 else 1), int(shape[-1])


def members_of(apply: Callable, params, x0: jax.Array) -> int:
    """The member count ``M`` of ``apply`` on ``x0`` (1 for ``[B, C]`` logits), found by tracing only."""
    return logits_shape(apply, params, x0)[0]


def make_validate(*, name: str, p: float, box, apply: Callable, eot: int = 1, ref_name: str = "labels") -> Callable:
    """The host-side validator of a fixed-budget attack's public entry.

    Returns ``validate(params, x0, ref, mask, key, eps, max_queries, x_init, sample_ids) ->
    Problem``: :func:`check_x0` (float, non-empty, finite, in the box), the member count ``M``
    and classes ``C`` of ``apply``'s logits (:func:`logits_shape`), :func:`check_ref` (``[B]`` or
    ``[B, M]``, in ``[0, C)``; ``ref_name`` names them in the error; ``ref [B]`` and no mask are
    shared by every member), :func:`check_mask` (bool or {0, 1}), :func:`check_eps`,
    :func:`check_sample_ids`, the per-sample query cap (:func:`~sarjax.attacks.queries.normalize_cap`:
    integers only; at least the clean evaluation, ``eot * M``) and :func:`check_x_init`. With
    ``eot > 1`` ``apply`` is the stochastic ``apply(params, x, key)``. Every message starts with
    ``name``.
    """

    def validate(params, x0, ref, mask, key, eps, max_queries, x_init, sample_ids) -> Problem:
        x0n = check_x0(x0, box, name=name)
        b = x0n.shape[0]
        m, n_classes = logits_shape(at_key(apply, eot, jax.random.PRNGKey(0)), params, x0n, name=name)
        refh = check_ref(ref, b, m, n_classes, what=ref_name, name=name)
        maskh = check_mask(mask, b, m, name=name)
        eps_arr = check_eps(eps, b, name=name)
        sid = check_sample_ids(sample_ids, b, name=name)
        cap = Q.normalize_cap(max_queries, b, name=name)
        if max_queries is not None and int(np.min(np.asarray(cap))) < eot * m:
            what = f"M = {m}" if eot == 1 else f"eot * M = {eot} * {m}"
            raise ValueError(
                f"{name}: max_queries must be >= {what} per sample: the clean evaluation of every "
                f"member is charged before any step; got {max_queries!r}"
            )
        xi = check_x_init(x_init, x0n, name=name)
        refn = jnp.asarray(refh, jnp.int32)
        refn = jnp.broadcast_to(refn[:, None] if refn.ndim == 1 else refn, (b, m))
        if maskh is None:
            maskn = jnp.ones((b, m), jnp.float32)
        else:
            maskn = jnp.asarray(maskh).astype(jnp.float32)
            maskn = jnp.broadcast_to(maskn[None] if maskn.ndim == 1 else maskn, (b, m))
        has = jnp.asarray(xi is not None)
        return Problem(x0n, refn, maskn, eps_arr, cap, key, sid, x0n if xi is None else xi, has)

    return validate


def check_finite_result(name: str, res) -> None:
    """Raises ``ValueError`` when the model's logits were not finite at a returned point.

    ``res.member_loss [B, M]`` (at ``x_adv``) and ``res.best_objective [B]`` (at ``best_x``) are
    NaN or inf exactly when some member's logits are (the losses of finite logits are finite): a
    NaN logit row's argmax is its first NaN, so without this check such a member was reported
    "fooled". Names the members and samples. Fields a result does not have are skipped."""
    loss = getattr(res, "member_loss", None)
    if loss is not None:
        bad = ~np.isfinite(host(loss))
        if bad.ndim == 1:
            bad = bad[:, None]
        if bad.any():
            members = np.flatnonzero(bad.any(axis=0)).tolist()
            samples = np.flatnonzero(bad.any(axis=1))
            raise ValueError(
                f"{name}: the model returned non-finite logits (NaN or inf) at x_adv for members {members} on "
                f"samples {samples[:10].tolist()}{' ...' if samples.size > 10 else ''}: success cannot be judged "
                "on them; fix the model"
            )
    best = getattr(res, "best_objective", None)
    if best is not None:
        bad = np.flatnonzero(~np.isfinite(host(best)))
        if bad.size:
            raise ValueError(
                f"{name}: the model returned non-finite logits (NaN or inf) at best_x on samples "
                f"{bad[:10].tolist()}{' ...' if bad.size > 10 else ''}: success cannot be judged on them; fix the model"
            )


def make_audit(*, name: str, p: float, box, bound: bool = True) -> Callable:
    """``audit(problem, result)``: :func:`check_finite_result` (non-finite logits at the returned
    points), then, with ``bound=True``, :func:`sarjax.attacks.audit.check` of ``result.x_adv`` and
    ``result.best_x`` against the ORIGINAL ``problem.x0`` with per-sample ``problem.eps``; raises
    ``ValueError`` naming the offending members / samples."""

    def audit(problem: Problem, res) -> None:
        check_finite_result(name, res)
        if not bound:
            return
        threat = Threat(p, host(problem.eps), box)
        check(problem.x0, res.x_adv, threat, what=f"{name} (x_adv)")
        check(problem.x0, res.best_x, threat, what=f"{name} (best_x)")

    audit.bound = bound  # type: ignore[attr-defined]  # read by AttackFn.audits_bound
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
    of :func:`make_validate`, the audit of :func:`make_audit` (``audit=False`` skips its bound
    audit; the check of non-finite logits at the returned points always runs: a ``[B, M]``
    transfer)."""
    box = tuple(float(b) for b in box)
    # the jit entry reads M from apply's logits by tracing: a stochastic apply at a fixed key
    shape_apply = at_key(apply, eot, jax.random.PRNGKey(0))
    return AttackFn(
        attack,
        name=name,
        apply=shape_apply,
        default_eps=default_eps,
        validate=make_validate(name=name, p=p, box=box, apply=apply, eot=eot, ref_name=ref_name),
        audit=make_audit(name=name, p=p, box=box, bound=audit),
    )
