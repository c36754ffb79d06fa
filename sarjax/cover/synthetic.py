"""Set-system oracles: known-answer stand-ins for joint and single attacks.

Each sample has a finite family of "valid inputs", each given by its coverage
set. The exact joint oracle returns, for the current uncovered set, the input
with the largest marginal coverage (an alpha = 1 oracle in the sense of
the SAR paper, Theorem 1), so the greedy's ``k_hat`` can be checked against brute
force and integer programming.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sarjax.cover.types import Candidates


class SetSystemOracle:
    """Joint and single attack oracles over per-sample set systems.

    Args:
        sets: ``[B, N, M]`` bool, ``sets[b, n]`` is the coverage set of input
            ``n`` of sample ``b``.
        joint_visible: optional ``[B, N]`` bool, the inputs the joint attack can
            find (default all). Hiding inputs makes the joint attack fail so the
            fallback fires; the single attack always sees every input.
        queries_per_call: queries charged per attacked sample and call.
        alpha: ``0 < alpha <= 1``. 1 (default): the joint attack returns the
            input with the largest marginal coverage. Below 1: an adversarial
            alpha-approximate attack (the SAR paper, Theorem 1) that returns the
            input with the *smallest* marginal coverage that is still at least
            ``alpha`` times the largest (ties: lowest index).

    Candidate ``x_adv`` is ``[B, 1]`` int64: the chosen input's index (-1 for
    none). ``joint`` objective per member: the number of visible inputs that
    break it (plus 0.5 if it is uncovered), so the fallback goes to the member
    with most visible ways to break it.
    """

    def __init__(self, sets: Any, joint_visible: Any = None, queries_per_call: int = 1, alpha: float = 1.0):
        s = np.asarray(sets)
        if s.dtype != np.bool_ or s.ndim != 3:
            raise TypeError(f"sets must be a bool array [B, N, M], got {s.dtype} {s.shape}")
        self.sets = s
        b, n, _ = s.shape
        if joint_visible is None:
            vis = np.ones((b, n), dtype=bool)
        else:
            vis = np.asarray(joint_visible)
            if vis.dtype != np.bool_ or vis.shape != (b, n):
                raise ValueError(f"joint_visible must be bool [{b}, {n}], got {vis.dtype} {vis.shape}")
        self.joint_visible = vis
        self.queries_per_call = int(queries_per_call)
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"alpha must satisfy 0 < alpha <= 1, got {alpha}")
        self.alpha = float(alpha)
        self.joint_calls: list[int] = []
        self.single_calls: list[int] = []

    def _pick(self, score: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # score [B, N]; choose the highest positive score, ties to lowest index.
        score = np.where(ok, score, -1)
        idx = np.argmax(score, axis=1)
        found = np.take_along_axis(score, idx[:, None], axis=1)[:, 0] > 0
        return np.where(found, idx, -1), found

    def _candidates(
        self, idx: np.ndarray, found: np.ndarray, attacked: np.ndarray, objective: np.ndarray
    ) -> Candidates:
        b, _, m = self.sets.shape
        covered = np.zeros((b, m), dtype=bool)
        rows = np.flatnonzero(found)
        covered[rows] = self.sets[rows, idx[rows]]
        queries = np.where(attacked, self.queries_per_call, 0).astype(np.int64)
        return Candidates(idx[:, None].astype(np.int64), covered, queries, objective)

    def joint(self, uncovered: np.ndarray, round_index: int) -> Candidates:
        """Exact greedy oracle: the visible input with the largest marginal coverage."""
        self.joint_calls.append(int(round_index))
        unc = np.asarray(uncovered)
        marginal = (self.sets & unc[:, None, :]).sum(axis=2)  # [B, N]
        idx, found = self._pick(marginal, self.joint_visible)
        if self.alpha < 1.0:
            best = np.where(self.joint_visible, marginal, 0).max(axis=1, keepdims=True)
            ok = self.joint_visible & (marginal > 0) & (marginal >= self.alpha * best)
            worst = np.argmin(np.where(ok, marginal, np.iinfo(np.int64).max), axis=1)
            idx = np.where(found, worst, -1)
        objective = (self.sets & self.joint_visible[:, :, None]).sum(axis=1) + 0.5 * unc
        return self._candidates(idx, found, np.asarray(unc.any(axis=1)), objective.astype(np.float64))

    def single(self, target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        """Single-member attack: the largest input that breaks ``target``, if any."""
        self.single_calls.append(int(round_index))
        b, _, m = self.sets.shape
        hits = self.sets[np.arange(b), :, np.asarray(target)]  # [B, N]
        size = self.sets.sum(axis=2)
        idx, found = self._pick(np.where(hits, size, 0), np.asarray(active)[:, None] & hits)
        return self._candidates(idx, found, np.asarray(active), np.zeros((b, m)))
