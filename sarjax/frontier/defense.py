"""The defense frontier, the Defense Optimality Index and single-eps rank instability
(the frontier paper Sections 4 and 5.2).

Defense frontier (Eq. 11): with ``d_E(x; f)`` the distance the ensemble ``E`` finds on model
``f``, ``d*_def(x) = max_{f in M} d_E(x; f)``: an oracle that needs the largest minimal
perturbation on every sample.  Its curve follows from Eq. 3, its area from Eq. 4 up to
``eps_def = min{eps >= 0 : rho*_def(eps) = 0}``, the same limit for every model.

Defense Optimality Index (Eq. 12): ``DOI(f) = AUREC_E(f) / AUREC*_def``, in ``[0, 1]``, 1 only
when the model's curve equals the defense frontier on ``[0, eps_def]``.

Rank instability (Section 5.2, Figure 5): rank the models by robust accuracy at each eps of a
grid; the ranks move with eps, while the DOI gives one eps-free ranking.  We measure the
movement by each model's largest rank change and by Kendall's tau
(``scipy.stats.kendalltau``) between every two grid points, and the DOI ranking's stability by
Kendall's tau between budget tiers (Table 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def _distances(d) -> np.ndarray:
    a = np.asarray(d, np.float64)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"distances must be [M, B] (models by shared samples), got shape {a.shape}")
    if np.isnan(a).any() or (a < 0).any():
        raise ValueError("distances must be >= 0 and not NaN (0: misclassified, inf: never broken)")
    return a


def defense_frontier(distances) -> np.ndarray:
    """``[B]`` per-sample maximum over the models of their ensemble distances (the frontier paper Eq. 11).

    Args:
      distances: ``[M, B]`` ensemble distances of ``M`` models on the same ``B`` samples.
    """
    return _distances(distances).max(axis=0)


def eps_def(distances) -> float:
    """``eps_def``: where the defense frontier reaches zero robust accuracy (Section 4).

    The defense frontier's largest finite distance (where some sample is never broken on some
    model, the frontier's floor is above 0 and we integrate to its last finite drop).
    """
    f = defense_frontier(distances)
    fin = f[np.isfinite(f)]
    return float(fin.max()) if fin.size else 0.0


def doi(distances) -> np.ndarray:
    """``[M]`` Defense Optimality Index of every model (the frontier paper Eq. 12).

    ``DOI(f) = AUREC_E(f) / AUREC*_def``, both integrated to ``eps_def``.  A model set whose
    defense frontier has zero area (every model misclassifies every sample) gives DOI 1.

    Args:
      distances: ``[M, B]`` ensemble distances (the same samples for every model).
    """
    d = _distances(distances)
    e = eps_def(d)
    area = np.mean(np.minimum(d, e), axis=1)
    ref = float(np.mean(np.minimum(d.max(axis=0), e)))
    if ref <= 0:
        return np.ones(d.shape[0])
    return area / ref


def robust_accuracy(distances, eps) -> np.ndarray:
    """``[E, M]`` robust accuracy ``rho(eps)`` of every model at every eps (the frontier paper Eq. 3).

    Args:
      distances: ``[M, B]``.
      eps: ``[E]`` perturbation sizes.
    """
    d = _distances(distances)
    e = np.asarray(eps, np.float64).reshape(-1)
    return np.mean(d[None] > e[:, None, None], axis=2)


def ranks(scores, higher_is_better: bool = True) -> np.ndarray:
    """Rank positions (1 = best) of scores along the last axis; ties share the best rank.

    Args:
      scores: ``[..., M]``.
      higher_is_better: a higher score ranks first (robust accuracy, DOI).
    """
    from scipy.stats import rankdata  # heavy (about 1 s): keeps sarjax.frontier's import light

    s = np.asarray(scores, np.float64)
    return rankdata(-s if higher_is_better else s, method="min", axis=-1).astype(np.int64)


def kendall_tau(a, b) -> float:
    """Kendall's tau-b between two score vectors (``scipy.stats.kendalltau``; NaN when one is
    constant)."""
    from scipy.stats import kendalltau  # heavy (about 1 s): keeps sarjax.frontier's import light

    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    res: Any = kendalltau(a, b)
    return float(res.statistic)


@dataclass
class RankInstability:
    """Rankings by robust accuracy along an eps grid (the frontier paper Figure 5).

    Attributes:
      eps: ``[E]`` the grid.
      accuracy: ``[E, M]`` robust accuracy per grid point and model.
      ranks: ``[E, M]`` rank of each model at each grid point (1 = most robust).
      tau: ``[E, E]`` Kendall's tau between the rankings at every two grid points.
      shift: ``[M]`` each model's largest rank change over the grid (max rank - min rank).
    """

    eps: np.ndarray
    accuracy: np.ndarray
    ranks: np.ndarray
    tau: np.ndarray
    shift: np.ndarray

    def moved(self, positions: int) -> int:
        """How many models move by at least ``positions`` ranks (the frontier paper Section 5.2: "17
        defenses move by at least five ranks")."""
        return int(np.sum(self.shift >= positions))


def rank_instability(accuracy, eps) -> RankInstability:
    """Rank instability of single-eps rankings (the frontier paper Section 5.2, Figure 5).

    Args:
      accuracy: ``[E, M]`` robust accuracy of ``M`` models at ``E`` eps (from
        :func:`robust_accuracy` of ensemble distances, or AutoAttack's robust accuracies).
      eps: ``[E]`` the grid.
    """
    acc = np.asarray(accuracy, np.float64)
    e = np.asarray(eps, np.float64).reshape(-1)
    if acc.ndim != 2 or acc.shape[0] != e.size:
        raise ValueError(f"accuracy must be [E={e.size}, M], got shape {acc.shape}")
    r = ranks(acc)
    n = e.size
    tau = np.ones((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            tau[i, j] = tau[j, i] = kendall_tau(acc[i], acc[j])
    return RankInstability(e, acc, r, tau, r.max(axis=0) - r.min(axis=0))


def tier_tau(scores) -> np.ndarray:
    """``[K, K]`` Kendall's tau between the rankings given by ``K`` score vectors (e.g. the DOI
    at each budget tier, the frontier paper Table 7: "the rankings are stable across the evaluated
    tiers").

    Args:
      scores: ``[K, M]``.
    """
    s = np.asarray(scores, np.float64)
    if s.ndim != 2:
        raise ValueError(f"scores must be [K, M], got shape {s.shape}")
    k = s.shape[0]
    tau = np.ones((k, k))
    for i in range(k):
        for j in range(i + 1, k):
            tau[i, j] = tau[j, i] = kendall_tau(s[i], s[j])
    return tau


__all__ = [
    "RankInstability",
    "defense_frontier",
    "doi",
    "eps_def",
    "kendall_tau",
    "rank_instability",
    "ranks",
    "robust_accuracy",
    "tier_tau",
]
