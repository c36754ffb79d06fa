"""The empirical attack frontier and the Attack Optimality Index (the frontier paper Section 2.2).

Given a pool ``A`` of attacks run on a model at the per-attack cap ``T``, the attack frontier is
the per-sample minimum distance ``d_{a*}(x) = min_{a in A} d_a(x)``; its curve ``rho_{a*}`` is
the tightest estimate the pool gives.  The per-model AOI of an attack ``a`` (Eq. 5) is

    AOI(a, f) = (rho(0) eps_min - AUREC_a) / (rho(0) eps_min - AUREC_{a*})

with ``rho(0)`` the clean accuracy, ``eps_min`` the frontier's (Section 2.2) and both AURECs
integrated to ``eps_min`` (Eq. 4): the area between the clean-accuracy line and the attack's
curve, relative to the frontier's.  It lies in ``[0, 1]`` for any member of the pool (or any
min-combination of members) and is 1 exactly when the attack's curve equals the frontier on
``[0, eps_min]``.  The global AOI (Eq. 6) is the mean over a set of models.

Because ``AUREC = mean(min(d, eps_min))`` (:meth:`StepCurve.area`), the AOI of a distance
vector is computed in closed form: :func:`aoi_from_distances` works on arrays of any leading
shape (the allocation search evaluates thousands of candidates this way).
"""

from __future__ import annotations

import numpy as np

from sarjax.frontier.curves import LinearCurve, StepCurve


def attack_frontier(distances) -> np.ndarray:
    """Per-sample minimum over the attack pool (the frontier paper Section 2.2, ``d_{a*}``).

    Args:
      distances: ``[A, ..., B]`` per-attack distances (``inf`` where an attack failed) at the
        per-attack cap ``T``.

    Returns:
      ``[..., B]`` the frontier's distances.
    """
    d = np.asarray(distances, np.float64)
    if d.ndim < 2 or d.shape[0] < 1:
        raise ValueError(f"distances must be [A, ..., B] with at least one attack, got shape {d.shape}")
    if np.isnan(d).any() or (d < 0).any():
        raise ValueError("distances must be >= 0 and not NaN (inf where an attack failed)")
    return d.min(axis=0)


def curve_stats(frontier: np.ndarray):
    """Per-model ``(eps_min, rho(0), AUREC*, den)`` of frontier distances ``[..., B]``."""
    fin = np.where(np.isfinite(frontier), frontier, -np.inf)
    e = np.maximum(fin.max(axis=-1), 0.0)
    r0 = np.mean(frontier > 0, axis=-1)
    area = np.mean(np.minimum(frontier, e[..., None]), axis=-1)
    return e, r0, area, r0 * e - area


def aoi_from_distances(distances, frontier) -> np.ndarray:
    """Per-model AOI (the frontier paper Eq. 5) of attack distances against frontier distances.

    Args:
      distances: ``[..., B]`` the attack's (or ensemble's) per-sample distances.
      frontier: ``[..., B]`` the frontier's distances on the same samples (broadcastable
        leading axes; e.g. ``[M, B]`` models by samples).

    Returns:
      ``[...]`` float64 AOI per leading index.  Where the frontier leaves no area to gain
      (``rho(0) eps_min = AUREC*``: every model's broken samples sit exactly at ``eps_min``, or
      none is broken) every pool attack ties with the frontier and the AOI is 1.
    """
    d = np.asarray(distances, np.float64)
    f = np.asarray(frontier, np.float64)
    if d.shape[-1:] != f.shape[-1:]:
        raise ValueError(f"distances {d.shape} and frontier {f.shape} must share the sample axis")
    e, r0, _, den = curve_stats(f)
    num = r0 * e - np.mean(np.minimum(d, np.asarray(e)[..., None]), axis=-1)
    safe = np.where(den > 0, den, 1.0)
    return np.where(den > 0, num / safe, 1.0)


def aoi(curve: StepCurve | LinearCurve, frontier: StepCurve) -> float:
    """The per-model AOI of a curve against the frontier's curve (the frontier paper Eq. 5).

    ``curve`` may be a :class:`StepCurve` (a minimum-norm attack or ensemble) or a
    :class:`LinearCurve` (AutoAttack interpolated on an eps grid, Section 5.1; its AOI may
    exceed 1 where the interpolation passes below the frontier).

    Args:
      curve: the attack's curve on the frontier's samples.
      frontier: the attack frontier's :class:`StepCurve`.
    """
    e = frontier.eps_zero
    r0 = frontier.clean
    den = r0 * e - frontier.area(e)
    if den <= 0:
        return 1.0
    return float((r0 * e - curve.area(e)) / den)


def per_model_aoi(distances) -> np.ndarray:
    """AOI of every attack on every model against the pool's frontier (Eq. 5).

    Args:
      distances: ``[A, M, B]`` distances of ``A`` attacks on ``M`` models (the same ``B``
        samples per model), at the per-attack cap.

    Returns:
      ``[A, M]`` per-model AOI.
    """
    d = np.asarray(distances, np.float64)
    if d.ndim != 3:
        raise ValueError(f"distances must be [A, M, B], got shape {d.shape}")
    return aoi_from_distances(d, attack_frontier(d)[None])


def global_aoi(distances) -> np.ndarray:
    """Global AOI of every attack: the mean of the per-model AOIs (the frontier paper Eq. 6).

    Args:
      distances: ``[A, M, B]``.

    Returns:
      ``[A]``.
    """
    return per_model_aoi(distances).mean(axis=1)


__all__ = ["aoi", "aoi_from_distances", "attack_frontier", "curve_stats", "global_aoi", "per_model_aoi"]
