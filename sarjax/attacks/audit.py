"""The bound audit: is every adversarial point inside the threat model?

the Note (a note on implementation errors in adaptive attacks) documents a
published result whose multi-round attack restarted each round from the
previous round's output, so the perturbation grew to n * eps.  Every sarjax
attack entry point calls :func:`check` on its output, measured against the
ORIGINAL input ``x0``.

The audit runs on the host in float64 on the float32 arrays it is given:
``x_adv - x0`` is then exact, so the realized norm is the true one.  The
tolerance is ``eps * (1 + rtol) + atol`` where ``atol`` defaults to the
float32 rounding a correct attack can incur when it writes ``x0 + delta``
back in float32 (half an ulp of the box scale per perturbed element, summed
in the norm); it is far below any real violation (a chained k-round attack
realizes about ``k * eps``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sarjax.attacks.threat import Threat


@dataclass(frozen=True)
class AuditReport:
    """Per-sample audit of an attack's output (plain numpy, JSON-friendly).

    Attributes:
      norm: realized ``||x_adv - x0||_p`` per sample ``[B]`` (float64).
      eps: the radius per sample ``[B]``.
      excess: ``norm - eps`` per sample ``[B]`` (positive = outside the ball
        before tolerance).
      box_violation: largest distance outside the box per sample ``[B]``
        (0 when inside).
      nan: ``[B]`` bool, any non-finite element in ``x_adv``.
      within: ``[B]`` bool, inside ball (with tolerance) and box and finite.
      ok: all samples within.
      threat_name: ``"l0"``, ``"l1"``, ``"l2"`` or ``"linf"``.
    """

    norm: np.ndarray
    eps: np.ndarray
    excess: np.ndarray
    box_violation: np.ndarray
    nan: np.ndarray
    within: np.ndarray
    ok: bool
    threat_name: str

    def worst(self, n: int = 5) -> np.ndarray:
        """Indices of up to ``n`` failing samples, worst (largest relative excess) first."""
        bad = np.flatnonzero(~self.within)
        if bad.size == 0:
            return bad
        score = np.where(
            self.nan[bad],
            np.inf,
            np.maximum(self.excess[bad] / np.maximum(self.eps[bad], 1e-30), self.box_violation[bad]),
        )
        return bad[np.argsort(-score, kind="stable")][:n]

    def describe(self, n: int = 5) -> str:
        """One-line summary naming the worst samples and their realized norms."""
        if self.ok:
            return f"all {self.norm.shape[0]} samples within {self.threat_name} eps and box"
        parts = []
        for i in self.worst(n):
            if self.nan[i]:
                parts.append(f"sample {i}: non-finite values")
            else:
                parts.append(
                    f"sample {i}: {self.threat_name} norm {self.norm[i]:.6g} vs eps "
                    f"{self.eps[i]:.6g} (x{self.norm[i] / max(self.eps[i], 1e-30):.3g}), "
                    f"box violation {self.box_violation[i]:.3g}"
                )
        nbad = int((~self.within).sum())
        return f"{nbad}/{self.norm.shape[0]} samples outside the threat model; " + "; ".join(parts)


def _as_float64(a, name):
    arr = np.asarray(a)
    if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def audit(x0, x_adv, threat: Threat, rtol: float = 1e-6, atol: float | None = None) -> AuditReport:
    """Measures every adversarial point against the ORIGINAL input.

    Args:
      x0: ``[B, *S]`` clean inputs.
      x_adv: ``[B, *S]`` attack outputs.
      threat: the :class:`Threat` (norm, eps scalar or ``[B]``, box).
      rtol: relative tolerance on eps (the issue's 1e-6).
      atol: absolute tolerance; ``None`` = float32 write-back rounding
        (``ulp/2`` of the box scale times 1, ``sqrt(n)`` or ``n`` for linf,
        l2, l1 with ``n`` perturbed elements; 0 for l0).

    Returns:
      An :class:`AuditReport`.

    Raises:
      ValueError: if shapes differ or eps does not match the batch.
      TypeError: if ``threat`` is not a Threat.
    """
    if not isinstance(threat, Threat):
        raise TypeError(f"threat must be a sarjax.attacks.Threat, got {type(threat).__name__}")
    a = _as_float64(x0, "x0")
    b = _as_float64(x_adv, "x_adv")
    if a.shape != b.shape:
        raise ValueError(f"x0 and x_adv must have the same shape, got {a.shape} and {b.shape}")
    if a.ndim < 1:
        raise ValueError(f"expected a batch [B, *S], got shape {a.shape}")
    B = a.shape[0]
    eps = (
        np.broadcast_to(np.asarray(threat.eps, np.float64), (B,))
        if np.ndim(threat.eps) == 0
        else np.asarray(threat.eps, np.float64)
    )
    if eps.shape != (B,):
        raise ValueError(f"per-sample eps must have shape [{B}], got {eps.shape}")
    nan = np.asarray(~np.isfinite(b.reshape(B, -1)).all(axis=1))
    d = np.nan_to_num(b - a, nan=0.0, posinf=0.0, neginf=0.0).reshape(B, -1)
    p = threat.norm
    nz = (np.abs(d) > 0).sum(axis=1).astype(np.float64)
    if p == 0.0:
        nrm = nz
    elif p == 1.0:
        nrm = np.abs(d).sum(axis=1)
    elif p == 2.0:
        nrm = np.sqrt((d * d).sum(axis=1))
    else:
        nrm = np.abs(d).max(axis=1) if d.shape[1] else np.zeros(B)
    if atol is None:
        half_ulp = 0.5 * float(np.spacing(np.float32(max(abs(threat.box[0]), abs(threat.box[1]), 1.0))))
        if p == 0.0:
            tol_abs = np.zeros(B)
        elif p == math.inf:
            tol_abs = np.full(B, half_ulp)
        elif p == 2.0:
            tol_abs = half_ulp * np.sqrt(nz)
        else:
            tol_abs = half_ulp * nz
    else:
        tol_abs = np.full(B, float(atol))
    lo, hi = threat.box
    bf = np.nan_to_num(b.reshape(B, -1), nan=lo)
    box_v = np.maximum(np.maximum(lo - bf, bf - hi).max(axis=1, initial=0.0), 0.0)
    in_ball = nrm <= eps * (1.0 + rtol) + tol_abs
    within = in_ball & (box_v == 0.0) & ~nan
    return AuditReport(
        norm=nrm,
        eps=eps,
        excess=nrm - eps,
        box_violation=box_v,
        nan=nan,
        within=within,
        ok=bool(within.all()),
        threat_name=threat.name,
    )


def check(
    x0, x_adv, threat: Threat, what: str = "attack", rtol: float = 1e-6, atol: float | None = None
) -> AuditReport:
    """Audits and raises if any sample leaves the threat model.

    Args:
      x0: ``[B, *S]`` clean inputs.
      x_adv: ``[B, *S]`` attack outputs.
      threat: the :class:`Threat`.
      what: name of the producer, used in the error message.
      rtol, atol: see :func:`audit`.

    Returns:
      The :class:`AuditReport` when every sample is within.

    Raises:
      ValueError: naming the worst samples (indices) and their realized norms
        vs eps, when any sample exceeds eps, leaves the box or is not finite.
    """
    rep = audit(x0, x_adv, threat, rtol=rtol, atol=atol)
    if not rep.ok:
        raise ValueError(f"{what} output failed the bound audit: {rep.describe()}")
    return rep
