"""Pool metrics from plain arrays: ASR, tASC, jASC, coverage target, Theorem 1.

Definitions follow the SAR paper (SAR paper): ASR is its Equation (1), the share
of samples on which an attack breaks one model; tASC(j) (its Equation (2)) is
the share of the pool covered by an input crafted on member ``j`` alone;
jASC(I) is the share of the pool covered by one input crafted jointly on the
members ``I``, so ``tASC(j) = jASC({j})``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _bool_array(name: str, value: Any, ndim: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool array, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {arr.shape}")
    return arr


def _valid_mask(valid: Any, batch: int) -> np.ndarray:
    if valid is None:
        return np.ones(batch, dtype=bool)
    mask = _bool_array("valid", valid, 1)
    if mask.shape[0] != batch:
        raise ValueError(f"valid must have shape [{batch}], got {mask.shape}")
    if not mask.any():
        raise ValueError("valid selects no sample; need at least one")
    return mask


def coverage_target(delta: float, num_members: int) -> int:
    """Coverage target ``tau = ceil((1 - delta) M)`` of Algorithm 1.

    A tolerance of 1e-9 absorbs float error, so ``delta=0.15, M=20`` gives 17
    and ``delta=1/6, M=6`` gives 5.

    Args:
        delta: allowed uncovered share, ``0 <= delta < 1``.
        num_members: pool size ``M >= 1``.

    Returns:
        ``tau`` in ``[1, M]``.

    Raises:
        ValueError: ``delta`` outside ``[0, 1)`` or ``num_members < 1``.
    """
    if isinstance(num_members, bool) or not isinstance(num_members, (int, np.integer)):
        raise TypeError(f"num_members must be an int, got {type(num_members).__name__}")
    if num_members < 1:
        raise ValueError(f"num_members must be >= 1, got {num_members}")
    delta = float(delta)
    if not (0.0 <= delta < 1.0) or math.isnan(delta):
        raise ValueError(f"delta must satisfy 0 <= delta < 1, got {delta}")
    tau = math.ceil((1.0 - delta) * num_members - 1e-9)
    return int(min(max(tau, 1), num_members))


def theorem1_factor(tau: int, alpha: float = 1.0) -> float:
    """Theorem 1's approximation factor ``1 + ln(tau) / alpha`` (the SAR paper).

    With a feasible instance and an alpha-approximate joint attack,
    ``k* <= k_hat <= theorem1_factor(tau, alpha) * k*``.

    Args:
        tau: coverage target, ``>= 1``.
        alpha: approximation ratio of the joint attack, ``0 < alpha <= 1``
            (``alpha = 1`` is an exact greedy oracle).

    Returns:
        The factor, ``>= 1``.

    Raises:
        ValueError: ``tau < 1`` or ``alpha`` outside ``(0, 1]``.
    """
    if int(tau) < 1:
        raise ValueError(f"tau must be >= 1, got {tau}")
    alpha = float(alpha)
    if not (0.0 < alpha <= 1.0):
        raise ValueError(f"alpha must satisfy 0 < alpha <= 1, got {alpha}")
    return 1.0 + math.log(int(tau)) / alpha


def asr(success: Any, valid: Any = None) -> np.ndarray:
    """Per-member attack success rate (the SAR paper, Equation (1)).

    Args:
        success: ``[B, M]`` bool, ``success[b, m]``: the attack on member ``m``
            broke it on sample ``b``.
        valid: optional ``[B]`` bool, samples to average over (padding mask).

    Returns:
        ``[M]`` float64, the share of valid samples on which each member broke.
    """
    s = _bool_array("success", success, 2)
    mask = _valid_mask(valid, s.shape[0])
    return s[mask].mean(axis=0, dtype=np.float64)


def tasc(covered: Any, valid: Any = None, exclude_source: bool = False) -> np.ndarray:
    """Transfer attack success coverage tASC(j) (the SAR paper, Equation (2)).

    Args:
        covered: ``[B, M_source, M_target]`` bool, ``covered[b, j, m]``: the
            input crafted on source ``j`` for sample ``b`` breaks target ``m``.
        valid: optional ``[B]`` bool, samples to average over.
        exclude_source: if True (requires ``M_source == M_target``, sources
            being the pool members in order), measure coverage of the other
            ``M - 1`` members only (pure transfer). Default False: the paper's
            coverage of the whole pool, source included.

    Returns:
        ``[M_source]`` float64, mean share of targets covered per source.
    """
    c = _bool_array("covered", covered, 3)
    mask = _valid_mask(valid, c.shape[0])
    c = c[mask]
    _, ms, mt = c.shape
    if exclude_source:
        if ms != mt:
            raise ValueError(f"exclude_source needs M_source == M_target, got {ms} and {mt}")
        if mt < 2:
            raise ValueError("exclude_source needs at least 2 targets")
        off = ~np.eye(ms, dtype=bool)
        return (c & off).sum(axis=2).mean(axis=0) / (mt - 1)
    return c.sum(axis=2).mean(axis=0) / mt


def jasc(covered: Any, valid: Any = None) -> float:
    """Joint attack success coverage jASC(I) (the SAR paper).

    Args:
        covered: ``[B, M]`` bool, coverage of the pool by the input crafted
            jointly on the member set ``I`` for each sample.
        valid: optional ``[B]`` bool, samples to average over.

    Returns:
        Mean share of the pool covered per sample.
    """
    c = _bool_array("covered", covered, 2)
    mask = _valid_mask(valid, c.shape[0])
    return float(c[mask].mean(dtype=np.float64))
