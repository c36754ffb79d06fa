"""A fixed-eps attack (AutoAttack) as a robustness curve (the frontier paper Section 5.1).

AutoAttack reports robust accuracy at one eps and no per-sample distance, so it cannot be scored
by the AOI directly.  the frontier paper "approximate[s] its curve by evaluating AA over a per-model grid
of eps values, derived from our attack frontiers as distance percentiles plus the reference
budget eps_ref.  We then linearly interpolate these points to reconstruct AA's
robustness-perturbation curve and compute its AOI."  Its query cost is variable (AutoAttack stops
attacking a sample once it is broken): Table 6's ``Q_AA`` is the cost at ``eps_ref``.

These functions work on plain arrays (robust accuracies and query counts measured by any
fixed-eps attack), so they do not depend on how the attack was run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sarjax.frontier.curves import LinearCurve, StepCurve
from sarjax.frontier.optimality import aoi

DEFAULT_PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)  # "distance percentiles": 9 (our reading)


def eps_grid(frontier_distances, eps_ref: float | None = None, percentiles=DEFAULT_PERCENTILES) -> np.ndarray:
    """The per-model eps grid at which to run the fixed-eps attack (the frontier paper Section 5.1).

    Percentiles of the frontier's distances over the samples it breaks (finite, ``> 0``), plus
    ``eps_ref``; sorted, duplicates removed.  The paper does not list its percentiles; the
    default takes the 9 deciles 10, ..., 90.

    Args:
      frontier_distances: ``[B]`` the attack frontier's distances on the model.
      eps_ref: the benchmark's reference eps (e.g. 8/255 linf on CIFAR-10), or None.
      percentiles: which percentiles (in ``(0, 100]``).

    Returns:
      ``[E]`` strictly increasing positive eps.
    """
    d = np.asarray(frontier_distances, np.float64).reshape(-1)
    d = d[np.isfinite(d) & (d > 0)]
    pts = [] if d.size == 0 else list(np.percentile(d, np.asarray(percentiles, np.float64)))
    if eps_ref is not None:
        if not (eps_ref > 0 and np.isfinite(eps_ref)):
            raise ValueError(f"eps_ref must be a finite number > 0, got {eps_ref!r}")
        pts.append(float(eps_ref))
    g = np.unique(np.asarray(pts, np.float64))
    return g[g > 0]


def interpolated_curve(eps, accuracy, clean: float) -> LinearCurve:
    """The piecewise-linear curve through ``(0, clean)`` and ``(eps_k, accuracy_k)``.

    the frontier paper Section 5.1's linear interpolation of AutoAttack's point evaluations.  A
    robust accuracy above an earlier one (a randomized attack's noise) is lowered to the
    running minimum so the curve is non-increasing (robust accuracy cannot grow with eps);
    after the last grid point the curve stays constant.

    Args:
      eps: ``[E]`` increasing eps ``> 0``.
      accuracy: ``[E]`` robust accuracy at each eps, in ``[0, 1]``.
      clean: the clean accuracy ``rho(0)``.
    """
    e = np.asarray(eps, np.float64).reshape(-1)
    a = np.asarray(accuracy, np.float64).reshape(-1)
    if e.shape != a.shape or e.size == 0:
        raise ValueError(f"eps and accuracy must be 1-D of one length >= 1, got {e.shape} and {a.shape}")
    if (e <= 0).any() or (np.diff(e) <= 0).any() or not np.isfinite(e).all():
        raise ValueError(f"eps must be finite, > 0 and strictly increasing, got {e.tolist()}")
    if not (0 <= clean <= 1) or (a < 0).any() or (a > 1).any():
        raise ValueError("clean and accuracy must lie in [0, 1]")
    vals = np.minimum.accumulate(np.minimum(np.concatenate([[clean], a]), clean))
    return LinearCurve(np.concatenate([[0.0], e]), vals)


@dataclass
class FixedEpsCurve:
    """A fixed-eps attack turned into a curve, scored against a model's attack frontier.

    Attributes:
      eps: ``[E]`` the grid.
      accuracy: ``[E]`` robust accuracy measured at each eps.
      curve: the interpolated :class:`LinearCurve`.
      aoi: its AOI against the frontier (the frontier paper Eq. 5; may exceed 1 where the interpolated
        curve passes below the frontier).
      queries: ``[E]`` mean queries per sample at each eps (NaN where not given).
      eps_ref: the reference eps (or None).
    """

    eps: np.ndarray
    accuracy: np.ndarray
    curve: LinearCurve
    aoi: float
    queries: np.ndarray
    eps_ref: float | None = None

    @property
    def cost_ref(self) -> float:
        """Mean queries per sample at ``eps_ref`` (Table 6's ``Q_AA``; NaN when unknown)."""
        if self.eps_ref is None:
            return float("nan")
        hit = np.flatnonzero(np.isclose(self.eps, self.eps_ref))
        return float(self.queries[hit[0]]) if hit.size else float("nan")

    @property
    def cost_total(self) -> float:
        """Mean queries per sample summed over the whole grid (the cost of the curve)."""
        return float(np.nansum(self.queries))


def fixed_eps_curve(eps, accuracy, frontier_distances, *, queries=None, eps_ref=None) -> FixedEpsCurve:
    """Score a fixed-eps attack's robust accuracies as a curve (the frontier paper Section 5.1).

    Args:
      eps: ``[E]`` increasing eps at which the attack ran.
      accuracy: ``[E]`` its robust accuracy at each.
      frontier_distances: ``[B]`` the model's attack-frontier distances on the same samples
        (0 for misclassified samples: the clean accuracy is read from them).
      queries: optional ``[E]`` mean queries per sample or ``[E, B]`` per-sample queries.
      eps_ref: the reference eps (must be on the grid for :attr:`FixedEpsCurve.cost_ref`).
    """
    front = StepCurve.from_distances(frontier_distances)
    curve = interpolated_curve(eps, accuracy, front.clean)
    e = np.asarray(eps, np.float64).reshape(-1)
    if queries is None:
        qs = np.full(e.size, np.nan)
    else:
        qa = np.asarray(queries, np.float64)
        if qa.shape[:1] != e.shape:
            raise ValueError(f"queries must be [E={e.size}] or [E, B], got shape {qa.shape}")
        qs = qa.reshape(e.size, -1).mean(axis=1)
    return FixedEpsCurve(e, np.asarray(accuracy, np.float64).reshape(-1), curve, aoi(curve, front), qs, eps_ref)


__all__ = ["DEFAULT_PERCENTILES", "FixedEpsCurve", "eps_grid", "fixed_eps_curve", "interpolated_curve"]
