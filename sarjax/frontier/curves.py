"""Robustness-perturbation curves, exact (the frontier paper Section 2, Eqs. 1, 3 and 4).

A minimum-norm attack gives, for every sample ``x`` of a data set ``D``, a distance ``d(x)``
that upper-bounds the minimal adversarial perturbation.  The empirical
robustness-perturbation curve (the frontier paper Eq. 3) is the step function

    rho(eps) = 1/|D| * sum_x I[d(x) > eps]

with the conventions: a sample the model already misclassifies has ``d = 0`` (it never counts
as robust), a sample no attack broke has ``d = +inf`` (it counts at every eps).  The curve is
right-continuous and non-increasing, ``rho(0)`` is the clean accuracy.

:class:`StepCurve` holds the sorted distances, so every quantity is exact (no grid): its value
at any eps, its breakpoints, its area ``int_0^U rho = mean(min(d, U))`` (AUREC, Eq. 4) and the
smallest eps at which it reaches its floor (``eps_min``, Section 2.2).  :class:`LinearCurve` is
the piecewise-linear curve interpolated from robust accuracies on an eps grid (how the frontier paper
Section 5.1 turns AutoAttack's point evaluations into a curve).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _as_distances(d, name: str = "distances") -> np.ndarray:
    a = np.asarray(d, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array [B] of per-sample distances, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} must hold at least one sample")
    if np.isnan(a).any():
        raise ValueError(f"{name} contains NaN (use 0 for misclassified samples, +inf for unbroken ones)")
    if (a < 0).any():
        raise ValueError(f"{name} must be >= 0, got min {a.min()}")
    return a


def _check_upper(upper) -> float:
    u = float(upper)
    if not (u >= 0 and np.isfinite(u)):
        raise ValueError(f"the upper integration limit must be a finite number >= 0, got {upper!r}")
    return u


@dataclass(frozen=True, eq=False)
class StepCurve:
    """The exact empirical robustness-perturbation curve of one model (the frontier paper Eq. 3).

    Build it with :meth:`from_distances`.

    Attributes:
      distances: ``[B]`` float64 per-sample minimal distances found, sorted ascending
        (``0``: misclassified clean sample; ``inf``: no adversarial example found).
    """

    distances: np.ndarray

    @classmethod
    def from_distances(cls, distances, correct=None) -> StepCurve:
        """The curve of per-sample distances.

        Args:
          distances: ``[B]`` per-sample distances ``d(x) >= 0`` (``inf`` where the attack failed).
          correct: optional ``[B]`` bool, whether the model classifies the clean sample
            correctly; misclassified samples are set to ``d = 0`` (the frontier paper Eq. 1: they are
            never robust).

        Raises:
          ValueError: not 1-D, empty, NaN or negative distances, or ``correct`` of another shape.
        """
        d = _as_distances(distances)
        if correct is not None:
            c = np.asarray(correct)
            if c.shape != d.shape:
                raise ValueError(f"correct must have the shape of distances {d.shape}, got {c.shape}")
            d = np.where(c.astype(bool), d, 0.0)
        return cls(np.sort(d))

    def __post_init__(self):
        d = _as_distances(self.distances)
        if (d[1:] < d[:-1]).any():
            d = np.sort(d)
        d.setflags(write=False)
        object.__setattr__(self, "distances", d)

    @property
    def n(self) -> int:
        """Number of samples ``|D|``."""
        return int(self.distances.shape[0])

    @property
    def clean(self) -> float:
        """``rho(0)``: the share of samples with ``d > 0`` (the clean accuracy)."""
        return float(np.mean(self.distances > 0))

    @property
    def floor(self) -> float:
        """``rho(inf)``: the share of samples never broken (``d = inf``)."""
        return float(np.mean(np.isinf(self.distances)))

    @property
    def breakpoints(self) -> np.ndarray:
        """``[K]`` the distinct finite positive distances where the curve drops, ascending."""
        d = self.distances
        return np.unique(d[np.isfinite(d) & (d > 0)])

    @property
    def values(self) -> np.ndarray:
        """``[K]`` the curve's value AT each breakpoint (right-continuous: after the drop)."""
        return self(self.breakpoints)

    @property
    def eps_zero(self) -> float:
        """The smallest eps at which the curve reaches its floor ``rho(inf)``.

        With every sample broken this is ``min{eps >= 0 : rho(eps) = 0}``, the frontier paper's
        ``eps_min`` (Section 2.2) when the curve is the attack frontier's.  Samples no attack
        broke stay robust at every eps; the paper's definition would give ``inf`` then, and
        we take the last finite drop instead (0 when there is none).
        """
        d = self.distances[np.isfinite(self.distances)]
        return float(d.max()) if d.size else 0.0

    def __call__(self, eps) -> np.ndarray:
        """``rho(eps)`` at any array of eps (exact; the frontier paper Eq. 3)."""
        e = np.asarray(eps, dtype=np.float64)
        return (self.n - np.searchsorted(self.distances, e, side="right")) / self.n

    def area(self, upper) -> float:
        """``int_0^upper rho(eps) d eps = mean(min(d, upper))`` (exact; the AUREC of Eq. 4).

        Args:
          upper: finite integration limit ``>= 0`` (the frontier paper integrates to the frontier's
            ``eps_min``; the DOI to the defense frontier's ``eps_def``).
        """
        u = _check_upper(upper)
        return float(np.mean(np.minimum(self.distances, u)))

    def __repr__(self) -> str:
        return f"StepCurve(n={self.n}, clean={self.clean:.4g}, eps_zero={self.eps_zero:.4g})"


@dataclass(frozen=True, eq=False)
class LinearCurve:
    """A piecewise-linear robustness curve through points ``(eps_k, rho_k)``.

    the frontier paper Section 5.1 evaluates AutoAttack at a grid of eps and "linearly interpolate[s]
    these points to reconstruct AA's robustness-perturbation curve".  The curve is constant
    after the last knot (the evaluation says nothing beyond it; our choice).

    Attributes:
      knots: ``[K]`` float64 strictly increasing eps, ``knots[0] = 0``.
      values: ``[K]`` float64 robust accuracy at each knot, non-increasing, in ``[0, 1]``.
    """

    knots: np.ndarray
    values: np.ndarray

    def __post_init__(self):
        k = np.asarray(self.knots, np.float64)
        v = np.asarray(self.values, np.float64)
        if k.ndim != 1 or v.shape != k.shape or k.size < 1:
            raise ValueError(f"knots and values must be 1-D of one length >= 1, got {k.shape} and {v.shape}")
        if not (np.isfinite(k).all() and np.isfinite(v).all()):
            raise ValueError("knots and values must be finite")
        if k[0] != 0 or (np.diff(k) <= 0).any():
            raise ValueError(f"knots must start at 0 and increase strictly, got {k.tolist()}")
        if (v < 0).any() or (v > 1).any() or (np.diff(v) > 0).any():
            raise ValueError(f"values must be non-increasing robust accuracies in [0, 1], got {v.tolist()}")
        k.setflags(write=False)
        v.setflags(write=False)
        object.__setattr__(self, "knots", k)
        object.__setattr__(self, "values", v)

    @property
    def clean(self) -> float:
        """``rho(0)``."""
        return float(self.values[0])

    def __call__(self, eps) -> np.ndarray:
        """``rho(eps)`` by linear interpolation (constant after the last knot)."""
        return np.interp(np.asarray(eps, np.float64), self.knots, self.values)

    def area(self, upper) -> float:
        """``int_0^upper rho(eps) d eps`` (exact for the piecewise-linear curve)."""
        u = _check_upper(upper)
        x = np.concatenate([self.knots[self.knots < u], [u]])
        y = self(x)
        return float(np.sum(0.5 * (y[1:] + y[:-1]) * np.diff(x)))

    def __repr__(self) -> str:
        return f"LinearCurve(knots={self.knots.size}, clean={self.clean:.4g})"


def aurec(curve: StepCurve | LinearCurve, eps_max: float) -> float:
    """Area Under the Robustness Evaluation Curve up to ``eps_max`` (the frontier paper Eq. 4).

    ``AUREC_a(f) = int_0^{eps_min(f)} rho_a(eps; f) d eps``, where the frontier paper takes
    ``eps_max = eps_min(f)`` of the attack frontier (:func:`eps_min`).  Smaller is stronger.
    """
    return curve.area(eps_max)


def eps_min(frontier: StepCurve) -> float:
    """``eps_min(f) = min{eps >= 0 : rho_{a*}(eps; f) = 0}`` (the frontier paper Section 2.2).

    The frontier's largest finite distance; where some samples were never broken, the smallest
    eps where the frontier reaches its floor (see :attr:`StepCurve.eps_zero`).
    """
    return frontier.eps_zero


__all__ = ["LinearCurve", "StepCurve", "aurec", "eps_min"]
