"""Exact minimum partial set cover over discovered candidate sets.

Problem (4) of the SAR paper is unit-cost partial set cover on the universe
``[M]``: pick the fewest sets whose union has at least ``tau`` members. The
greedy only sees the sets its attacks revealed; this module solves the problem
exactly over those sets (integer programming with HiGHS through
``scipy.optimize.milp``), and by enumeration for tiny instances (a reference
for tests).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from sarjax.cover.metrics import theorem1_factor
from sarjax.cover.result import SARResult


@dataclass(frozen=True)
class ExactCover:
    """Result of an exact partial cover.

    Attributes:
        k: minimum number of sets, or None if no choice reaches ``tau``.
        chosen: ``[N]`` bool, one optimal choice (all False when infeasible).
        optimal: True when the solver proved optimality (False after a time
            limit with a feasible but unproven incumbent).
    """

    k: int | None
    chosen: np.ndarray
    optimal: bool

    @property
    def feasible(self) -> bool:
        return self.k is not None


def _prepare(sets: Any, tau: int, precovered: Any) -> tuple[np.ndarray, np.ndarray, int]:
    s = np.asarray(sets)
    if s.dtype != np.bool_:
        raise TypeError(f"sets must be a bool array, got dtype {s.dtype}")
    if s.ndim != 2:
        raise ValueError(f"sets must have shape [N, M], got {s.shape}")
    m = s.shape[1]
    if m < 1:
        raise ValueError("sets must have at least one member column")
    if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)):
        raise TypeError(f"tau must be an int, got {type(tau).__name__}")
    if not 1 <= tau <= m:
        raise ValueError(f"tau must be in [1, {m}], got {tau}")
    if precovered is None:
        pre = np.zeros(m, dtype=bool)
    else:
        pre = np.asarray(precovered)
        if pre.dtype != np.bool_ or pre.shape != (m,):
            raise ValueError(f"precovered must be a bool array of shape [{m}], got {pre.dtype} {pre.shape}")
    return s, pre, int(tau) - int(pre.sum())


def brute_force_partial_cover(sets: Any, tau: int, precovered: Any = None) -> ExactCover:
    """Exact partial cover by enumerating subsets in increasing size.

    Exponential in the number of sets: for tests and tiny instances only.

    Args:
        sets: ``[N, M]`` bool, candidate coverage sets.
        tau: members to cover, ``1 <= tau <= M``.
        precovered: optional ``[M]`` bool, members covered for free.

    Returns:
        ExactCover (``optimal`` is always True).
    """
    s, pre, need = _prepare(sets, tau, precovered)
    n = s.shape[0]
    chosen = np.zeros(n, dtype=bool)
    if need <= 0:
        return ExactCover(0, chosen, True)
    live = s & ~pre
    if (live.any(axis=0)).sum() < need:
        return ExactCover(None, chosen, True)
    for k in range(1, n + 1):
        for combo in itertools.combinations(range(n), k):
            if live[list(combo)].any(axis=0).sum() >= need:
                chosen[list(combo)] = True
                return ExactCover(k, chosen, True)
    return ExactCover(None, chosen, True)  # unreachable: union check above


def exact_partial_cover(
    sets: Any,
    tau: int,
    precovered: Any = None,
    time_limit: float | None = None,
) -> ExactCover:
    """Minimum unit-cost partial set cover by integer programming (HiGHS).

    Variables ``x_s`` (set chosen) and ``y_m`` (member counted covered), all
    binary: minimize ``sum_s x_s`` subject to ``y_m <= sum_{s ∋ m} x_s`` and
    ``sum_m y_m >= tau - |precovered|``. Duplicate and empty sets are dropped
    before solving. Tested exact up to ``M = 64``.

    Args:
        sets: ``[N, M]`` bool, candidate coverage sets (e.g. every coverage set
            the greedy's attacks revealed for one sample).
        tau: members to cover, ``1 <= tau <= M``.
        precovered: optional ``[M]`` bool, members covered at no cost (members
            already broken on the clean input).
        time_limit: optional solver time limit in seconds.

    Returns:
        ExactCover with ``chosen`` indexing the rows of ``sets``.

    Raises:
        TypeError, ValueError: malformed ``sets``, ``tau`` or ``precovered``.
        RuntimeError: the solver failed without a feasible solution although
            the instance is feasible.
    """
    s, pre, need = _prepare(sets, tau, precovered)
    n, m = s.shape
    chosen = np.zeros(n, dtype=bool)
    if need <= 0:
        return ExactCover(0, chosen, True)
    live = s & ~pre
    if live.any(axis=0).sum() < need:
        return ExactCover(None, chosen, True)
    # Unique non-empty sets, remembering one original row for each.
    nonempty = np.flatnonzero(live.any(axis=1))
    uniq, first = np.unique(live[nonempty], axis=0, return_index=True)
    rows = nonempty[first]
    cols = np.flatnonzero(uniq.any(axis=0))
    a = uniq[:, cols].astype(np.float64)  # [U, C]
    u, c = a.shape
    # z = [x (U), y (C)]
    cost = np.concatenate([np.ones(u), np.zeros(c)])
    link = np.concatenate([-a.T, np.eye(c)], axis=1)  # y_m - sum_s a_sm x_s <= 0
    total = np.concatenate([np.zeros(u), np.ones(c)])[None, :]
    constraints = [
        LinearConstraint(link, -np.inf, 0.0),
        LinearConstraint(total, float(need), np.inf),
    ]
    options = {} if time_limit is None else {"time_limit": float(time_limit)}
    res = milp(
        cost,
        constraints=constraints,
        integrality=np.ones(u + c),
        bounds=Bounds(0.0, 1.0),
        options=options,
    )
    if res.x is None:
        raise RuntimeError(f"milp found no solution for a feasible cover: {res.message}")
    pick = res.x[:u] > 0.5
    chosen[rows[pick]] = True
    k = int(pick.sum())
    # Audit the solver's answer on the original sets.
    if live[chosen].any(axis=0).sum() < need:
        raise RuntimeError("milp returned a choice that does not reach tau")
    return ExactCover(k, chosen, bool(res.status == 0))


@dataclass(frozen=True)
class CoverCheck:
    """Greedy ``k_hat`` against the exact optimum over the discovered sets.

    Attributes:
        taus: ``[D]`` coverage targets.
        factor: ``[D]`` Theorem 1's factor ``1 + ln(tau) / alpha``.
        k_hat: ``[B, D]`` greedy inputs, -1 when the greedy missed ``tau``.
        k_star: ``[B, D]`` exact minimum over the discovered sets, -1 when
            those sets cannot reach ``tau``.
        optimal: ``[B, D]`` the solver proved optimality.
        within_bound: ``[B, D]`` ``k_star <= k_hat <= factor * k_star`` where
            both exist (True where either is missing).

    The exact optimum is over the sets the attacks revealed, so it bounds the
    greedy's selection error given those attacks, not the true ``k*`` of
    Theorem 1 (the attack error is not observable, the SAR paper).
    """

    taus: np.ndarray
    factor: np.ndarray
    k_hat: np.ndarray
    k_star: np.ndarray
    optimal: np.ndarray
    within_bound: np.ndarray


def exact_check(
    result: SARResult,
    alpha: float = 1.0,
    extra_sets: Any = None,
    time_limit: float | None = None,
) -> CoverCheck:
    """Solve the exact partial cover over each sample's discovered sets.

    Args:
        result: a :class:`sarjax.cover.SARResult`.
        alpha: the joint attack's assumed approximation ratio for Theorem 1's
            factor (``0 < alpha <= 1``).
        extra_sets: optional ``[B, N, M]`` bool, more candidate sets per sample
            (e.g. tASC coverage of per-member attacks).
        time_limit: optional solver time limit per instance, seconds.

    Returns:
        CoverCheck.
    """

    b, m = result.clean_broken.shape
    if extra_sets is not None:
        extra = np.asarray(extra_sets)
        if extra.dtype != np.bool_ or extra.ndim != 3 or extra.shape[0] != b or extra.shape[2] != m:
            raise ValueError(f"extra_sets must be bool [{b}, N, {m}], got {extra.dtype} {extra.shape}")
    taus = np.asarray(result.taus, dtype=np.int64)
    factor = np.asarray([theorem1_factor(int(t), alpha) for t in taus])
    d = len(taus)
    k_star = np.full((b, d), -1, dtype=np.int64)
    optimal = np.ones((b, d), dtype=bool)
    for i in range(b):
        if not result.valid[i]:
            continue
        sets = result.candidate_sets(i)
        if extra_sets is not None:
            sets = np.concatenate([sets, extra[i]], axis=0)
        clean = result.clean_broken[i]
        pre = None
        if result.count_clean_input:
            if clean.any():
                sets = np.concatenate([sets, clean[None]], axis=0)
        else:
            pre = clean
        for j, tau in enumerate(taus):
            sol = exact_partial_cover(sets, int(tau), precovered=pre, time_limit=time_limit)
            if sol.k is not None:
                k_star[i, j] = sol.k
            optimal[i, j] = sol.optimal
    k_hat = result.k_hat
    both = (k_hat >= 0) & (k_star >= 0)
    ok = (k_star <= k_hat) & (k_hat <= factor[None, :] * k_star + 1e-9)
    return CoverCheck(taus, factor, k_hat, k_star, optimal, np.where(both, ok, True))
