"""The result of a batched SAR greedy run: plain arrays, JSON + .npz on disk."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from sarjax.cover.metrics import coverage_target

# Per-round logs, each stacked as [R, B, ...] (R = rounds run).
ROUND_FIELDS = (
    "active",  # [R, B] bool: sample took part in the round
    "recorded",  # [R, B] bool: the round recorded an input for the sample
    "new_covered",  # [R, B, M] bool: uncovered members the recorded input covered
    "joint_covered",  # [R, B, M] bool: full coverage of the joint candidate
    "joint_queries",  # [R, B] int64
    "fallback",  # [R, B] bool: the joint attack covered nothing, fallback ran
    "fallback_target",  # [R, B] int64: member attacked alone, -1 if no fallback
    "fallback_covered",  # [R, B, M] bool: full coverage of the fallback candidate
    "fallback_success",  # [R, B] bool: the fallback covered its target
    "fallback_queries",  # [R, B] int64
)


def derive_sar(
    new_covered: np.ndarray,
    recorded: np.ndarray,
    clean_broken: np.ndarray,
    valid: np.ndarray,
    taus: tuple[int, ...],
    num_members: int,
    count_clean_input: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SAR for several coverage targets from one run's coverage order.

    A separate run for a target ``tau' <= tau`` follows the same rounds and
    stops at the first round where the covered count reaches ``tau'``; its
    ``k_hat`` is the number of inputs recorded up to that round.

    Args:
        new_covered: ``[R, B, M]`` bool, members credited per round.
        recorded: ``[R, B]`` bool, whether the round recorded an input.
        clean_broken: ``[B, M]`` bool, members covered before any attack.
        valid: ``[B]`` bool, real (non-padding) samples.
        taus: coverage targets.
        num_members: ``M``.
        count_clean_input: count the clean input as one input when it breaks
            some member.

    Returns:
        ``(sar [B, D] float64, k_hat [B, D] int64, reached [B, D] bool)``;
        ``k_hat = -1`` and ``sar = 1`` where the target is not reached, and
        ``sar = nan`` for padding samples.
    """
    b = clean_broken.shape[0]
    clean = clean_broken.sum(axis=1)  # [B]
    per_round = new_covered.sum(axis=2).T  # [B, R]
    counts = np.concatenate([clean[:, None], clean[:, None] + np.cumsum(per_round, axis=1)], axis=1)
    offset = (count_clean_input & (clean > 0)).astype(np.int64)
    ks = np.concatenate(
        [offset[:, None], offset[:, None] + np.cumsum(recorded.T.astype(np.int64), axis=1)], axis=1
    )  # [B, R + 1]
    d = len(taus)
    sar = np.ones((b, d), dtype=np.float64)
    k_hat = np.full((b, d), -1, dtype=np.int64)
    reached = np.zeros((b, d), dtype=bool)
    for j, tau in enumerate(taus):
        hit = counts >= tau  # [B, R + 1]
        reached[:, j] = hit.any(axis=1) & valid
        first = np.argmax(hit, axis=1)
        k = np.take_along_axis(ks, first[:, None], axis=1)[:, 0]
        k_hat[:, j] = np.where(reached[:, j], k, -1)
        sar[:, j] = np.where(reached[:, j], k / num_members, 1.0)
    sar[~valid] = np.nan
    return sar, k_hat, reached


def derive_singleton(
    new_covered: np.ndarray,
    recorded: np.ndarray,
    fallback: np.ndarray,
    fallback_success: np.ndarray,
    clean_broken: np.ndarray,
    valid: np.ndarray,
    taus: tuple[int, ...],
    num_members: int,
    count_clean_input: bool,
    stop_when_unreachable: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Singleton-completed ``k_hat`` (the SAR paper, Figures 7 and 8) from one run's logs.

    For each target ``tau`` the state is taken where a separate run for that
    target alone stops: the first state (after ``0..R`` rounds) where the
    covered count ``c`` reaches ``tau``, or ``I`` is empty, or (with
    ``stop_when_unreachable``) ``c + |I| < tau``. With ``k`` inputs recorded
    up to that state, the singleton-completed count is ``k + max(0, tau - c)``:
    every member still missing to reach ``tau`` costs one input of its own.
    Members still in ``I`` are used first; the rest of the completion falls on
    members the single-model fallback failed to break (reported separately).
    No attack is run: everything comes from the round logs.

    Args:
        new_covered: ``[R, B, M]`` bool, members credited per round.
        recorded: ``[R, B]`` bool, whether the round recorded an input.
        fallback: ``[R, B]`` bool, whether the fallback ran.
        fallback_success: ``[R, B]`` bool, whether it broke its target (a
            failed fallback marks one member unbreakable).
        clean_broken: ``[B, M]`` bool, members covered before any attack.
        valid: ``[B]`` bool, real (non-padding) samples.
        taus: coverage targets.
        num_members: ``M``.
        count_clean_input: count the clean input as one input when it breaks
            some member.
        stop_when_unreachable: the stop rule the run used.

    Returns:
        ``(sar_singleton [B, D] float64, k_singleton [B, D] int64,
        singleton_added [B, D] int64, singleton_unbreakable [B, D] int64)``:
        ``k_singleton / M``, the completed count, the inputs added by the
        completion (0 where ``tau`` was reached, so ``k_singleton = k_hat``
        there), and how many of those went to members marked unbreakable.
        Padding samples: nan and -1.
    """
    b = clean_broken.shape[0]
    m = num_members
    clean = clean_broken.sum(axis=1)  # [B]
    zero = np.zeros((b, 1), dtype=np.int64)
    counts = clean[:, None] + np.concatenate([zero, np.cumsum(new_covered.sum(axis=2).T, axis=1)], axis=1)  # [B, R + 1]
    offset = (count_clean_input & (clean > 0)).astype(np.int64)
    ks = offset[:, None] + np.concatenate([zero, np.cumsum(recorded.T.astype(np.int64), axis=1)], axis=1)
    failed = (fallback & ~fallback_success).T.astype(np.int64)  # [B, R]
    unbreakable = np.concatenate([zero, np.cumsum(failed, axis=1)], axis=1)
    left = np.where(valid[:, None], m - counts - unbreakable, 0)  # |I| per state
    d = len(taus)
    k_sc = np.full((b, d), -1, dtype=np.int64)
    added = np.full((b, d), -1, dtype=np.int64)
    unb = np.full((b, d), -1, dtype=np.int64)
    last = counts.shape[1] - 1
    for j, tau in enumerate(taus):
        stop = (counts >= tau) | (left == 0)
        if stop_when_unreachable:
            stop |= counts + left < tau
        first = np.where(stop.any(axis=1), np.argmax(stop, axis=1), last)[:, None]
        c = np.take_along_axis(counts, first, axis=1)[:, 0]
        k = np.take_along_axis(ks, first, axis=1)[:, 0]
        rest = np.take_along_axis(left, first, axis=1)[:, 0]
        gap = np.maximum(0, tau - c)
        k_sc[:, j] = np.where(valid, k + gap, -1)
        added[:, j] = np.where(valid, gap, -1)
        unb[:, j] = np.where(valid, np.maximum(0, gap - rest), -1)
    sar_sc = np.where(valid[:, None], k_sc / m, np.nan)
    return sar_sc, k_sc, added, unb


def mean_and_se(values: Any) -> tuple[float | None, float | None, int]:
    """Mean and standard error of the mean of the finite entries of ``values``.

    ``se = std(ddof=1) / sqrt(n)``; None for ``n = 1`` (one sample gives no
    spread; None rather than nan keeps the JSON strict), and
    ``(None, None, 0)`` for no sample.

    Returns:
        ``(mean, se, n)``.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    n = int(v.size)
    if n == 0:
        return None, None, 0
    se = float(v.std(ddof=1) / np.sqrt(n)) if n > 1 else None
    return float(v.mean()), se, n


_PER_SAMPLE = ("valid", "clean_broken", "unbreakable", "covered", "covered_round", "sar", "k_hat", "reached")
_SINGLETON = ("sar_singleton", "k_singleton", "singleton_added", "singleton_unbreakable")


@dataclass
class SARResult:
    """Per-sample outcome of :func:`sarjax.cover.greedy_sar`.

    Attributes:
        num_members: pool size ``M``.
        deltas: the requested deltas, in the caller's order.
        taus: ``ceil((1 - delta) M)`` per delta.
        count_clean_input: whether the clean input counts as one input when it
            already breaks some member.
        stop_when_unreachable: whether samples stopped once no requested target
            could still be reached (SAR unchanged, fewer queries).
        num_rounds: rounds run (``R``).
        valid: ``[B]`` bool, real (non-padding) samples.
        clean_broken: ``[B, M]`` bool, members broken on the clean input
            (covered without an attack).
        unbreakable: ``[B, M]`` bool, members the fallback failed to break.
        covered: ``[B, M]`` bool, final covered set (clean-broken included).
        covered_round: ``[B, M]`` int64, round that covered each member, -1 if
            never covered by an attack.
        sar: ``[B, D]`` float64, ``k_hat / M`` or 1 when not reached (nan for
            padding samples).
        k_hat: ``[B, D]`` int64, inputs needed, -1 when not reached.
        reached: ``[B, D]`` bool.
        active, recorded, ... : per-round logs ``[R, B, ...]`` (see
            ``ROUND_FIELDS``).
        inputs: ``[R, B, *S]`` recorded adversarial inputs (the joint or the
            fallback candidate; zeros where nothing was recorded), or None when
            not stored.
        sar_singleton: ``[B, D]`` float64, singleton-completed ``k_hat / M``
            (the SAR paper, Figures 7 and 8; :func:`derive_singleton`): equal to
            ``sar`` where the target was reached, else the inputs recorded
            when the run stopped plus one input per member still missing to
            reach ``tau`` (nan for padding samples). Derived from the round
            logs when not given.
        k_singleton: ``[B, D]`` int64, the singleton-completed count (-1 for
            padding).
        singleton_added: ``[B, D]`` int64, inputs the completion added (0
            where the target was reached).
        singleton_unbreakable: ``[B, D]`` int64, of those, members the
            single-model fallback failed to break.
    """

    num_members: int
    deltas: tuple[float, ...]
    taus: tuple[int, ...]
    count_clean_input: bool
    stop_when_unreachable: bool
    num_rounds: int
    valid: np.ndarray
    clean_broken: np.ndarray
    unbreakable: np.ndarray
    covered: np.ndarray
    covered_round: np.ndarray
    sar: np.ndarray
    k_hat: np.ndarray
    reached: np.ndarray
    active: np.ndarray
    recorded: np.ndarray
    new_covered: np.ndarray
    joint_covered: np.ndarray
    joint_queries: np.ndarray
    fallback: np.ndarray
    fallback_target: np.ndarray
    fallback_covered: np.ndarray
    fallback_success: np.ndarray
    fallback_queries: np.ndarray
    inputs: np.ndarray | None = None
    # None at construction means "derive from the round logs" (__post_init__ always fills them)
    sar_singleton: np.ndarray = None  # type: ignore[assignment]
    k_singleton: np.ndarray = None  # type: ignore[assignment]
    singleton_added: np.ndarray = None  # type: ignore[assignment]
    singleton_unbreakable: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        # Results saved before the singleton-completed fields existed (or built
        # by hand) get them from the round logs: no attack is needed.
        if any(getattr(self, name) is None for name in _SINGLETON):
            derived = derive_singleton(
                self.new_covered,
                self.recorded,
                self.fallback,
                self.fallback_success,
                self.clean_broken,
                self.valid,
                tuple(self.taus),
                self.num_members,
                self.count_clean_input,
                self.stop_when_unreachable,
            )
            for name, value in zip(_SINGLETON, derived):
                setattr(self, name, value)

    @property
    def batch_size(self) -> int:
        return int(self.clean_broken.shape[0])

    @property
    def queries(self) -> np.ndarray:
        """``[B]`` int64, total queries per sample (joint + fallback)."""
        return self.joint_queries.sum(axis=0) + self.fallback_queries.sum(axis=0)

    @property
    def fallback_fired(self) -> np.ndarray:
        """``[B]`` bool, whether the fallback ran at least once."""
        return np.asarray(self.fallback.any(axis=0))

    def sar_at(self, delta: float) -> np.ndarray:
        """``[B]`` SAR for another delta, read off this run's coverage order.

        Equal to a separate run for ``delta`` on every sample, or an error:
        delegates to :func:`rederive`, which refuses the
        samples this run does not determine (e.g. a sample the run stopped,
        because a stricter target became unreachable, while the new target was
        still reachable).

        Raises:
            ValueError: the target is stricter than every target of the run, or
                some samples are not determined (named in the message).
        """
        tau = coverage_target(delta, self.num_members)
        if tau > max(self.taus):
            raise ValueError(f"delta={delta} needs tau={tau} > the strictest run tau={max(self.taus)}")
        return rederive(self, [delta]).sar[:, 0]

    def candidate_sets(self, sample: int) -> np.ndarray:
        """``[N, M]`` bool, every coverage set the attacks revealed for a sample.

        Joint candidates of the rounds the sample took part in, then fallback
        candidates. The input to :func:`sarjax.cover.exact_partial_cover`.
        """
        if not 0 <= sample < self.batch_size:
            raise ValueError(f"sample must be in [0, {self.batch_size}), got {sample}")
        joint = self.joint_covered[self.active[:, sample], sample]
        fall = self.fallback_covered[self.fallback[:, sample], sample]
        return np.concatenate([joint, fall], axis=0)

    def coverage_curve(self) -> np.ndarray:
        """``[B, K + 1]`` int64, members covered after ``k`` recorded inputs.

        Column ``k`` counts the covered members (clean-broken included) once
        the sample's first ``k`` inputs are recorded (K = the most inputs any
        sample recorded; a finished sample keeps its final count). With
        ``count_clean_input`` the clean input is not a column: shift by one.
        The SAR for a target ``tau`` is the first ``k`` whose count reaches
        ``tau``, divided by ``M``.
        """
        clean = self.clean_broken.sum(axis=1)
        counts = clean[None, :] + np.cumsum(self.new_covered.sum(axis=2), axis=0)  # [R, B]
        ks = np.cumsum(self.recorded, axis=0)  # [R, B]
        k_max = int(ks[-1].max()) if self.num_rounds else 0
        curve = np.empty((self.batch_size, k_max + 1), dtype=np.int64)
        for k in range(k_max + 1):
            upto = np.where(ks <= k, counts, 0)
            curve[:, k] = np.maximum(clean, upto.max(axis=0) if self.num_rounds else clean)
        return curve

    def select(self, index: Any) -> SARResult:
        """A result with only the samples at ``index`` (``[K]`` int or ``[B]`` bool)."""
        idx = np.arange(self.batch_size)[np.asarray(index)]
        per_sample = {name: getattr(self, name)[idx] for name in _PER_SAMPLE + _SINGLETON}
        per_round = {name: getattr(self, name)[:, idx] for name in ROUND_FIELDS}
        return SARResult(
            num_members=self.num_members,
            deltas=self.deltas,
            taus=self.taus,
            count_clean_input=self.count_clean_input,
            stop_when_unreachable=self.stop_when_unreachable,
            num_rounds=self.num_rounds,
            inputs=None if self.inputs is None else self.inputs[:, idx],
            **per_sample,
            **per_round,
        )

    def sar_stats(self) -> list[dict[str, Any]]:
        """Mean and standard error over valid samples of SAR and singleton-completed SAR.

        One dict per delta (the caller's order) with ``delta``, ``tau``, ``n``
        (valid samples), ``mean_sar``, ``se_sar``, ``mean_sar_singleton``,
        ``se_sar_singleton`` and ``mean_singleton_unbreakable_share`` (mean of
        ``singleton_unbreakable / M``: the part of the singleton-completed
        value that rests on members the single-model attack could not break).
        The standard error is that of the mean, ``std(ddof=1) / sqrt(n)``
        (:func:`mean_and_se`); it is None for ``n = 1``, and every value is
        None for ``n = 0``.
        """
        v = self.valid
        out = []
        for j, (delta, tau) in enumerate(zip(self.deltas, self.taus)):
            mean, se, n = mean_and_se(self.sar[v, j])
            mean_sc, se_sc, _ = mean_and_se(self.sar_singleton[v, j])
            unb, _, _ = mean_and_se(self.singleton_unbreakable[v, j] / self.num_members)
            out.append(
                {
                    "delta": float(delta),
                    "tau": int(tau),
                    "n": n,
                    "mean_sar": mean,
                    "se_sar": se,
                    "mean_sar_singleton": mean_sc,
                    "se_sar_singleton": se_sc,
                    "mean_singleton_unbreakable_share": unb,
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        """Pool-level means (and standard errors, :meth:`sar_stats`) over valid samples, per delta."""
        v = self.valid
        out = []
        for j, stats in enumerate(self.sar_stats()):
            out.append(
                {
                    **stats,
                    "share_sar_one": float((self.sar[v, j] >= 1.0).mean()) if v.any() else None,
                    "mean_k_hat_reached": (
                        float(self.k_hat[v & self.reached[:, j], j].mean()) if (v & self.reached[:, j]).any() else None
                    ),
                }
            )
        return {
            "num_members": self.num_members,
            "num_samples": int(v.sum()),
            "num_rounds": self.num_rounds,
            "mean_queries": float(self.queries[v].mean()) if v.any() else None,
            "share_fallback": float(self.fallback_fired[v].mean()) if v.any() else None,
            "per_delta": out,
        }

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-ready description: config, summary and per-sample records."""
        samples = []
        for b in range(self.batch_size):
            inputs = []
            for r in np.flatnonzero(self.recorded[:, b]):
                coverage = np.where(self.fallback[r, b], self.fallback_covered[r, b], self.joint_covered[r, b])
                inputs.append(
                    {
                        "round": int(r),
                        "source": "fallback" if self.fallback[r, b] else "joint",
                        "new_covered": np.flatnonzero(self.new_covered[r, b]).tolist(),
                        "coverage": np.flatnonzero(coverage).tolist(),
                    }
                )
            samples.append(
                {
                    "valid": bool(self.valid[b]),
                    "sar": [None if np.isnan(s) else float(s) for s in self.sar[b]],
                    "k_hat": self.k_hat[b].tolist(),
                    "reached": self.reached[b].tolist(),
                    "sar_singleton": [None if np.isnan(s) else float(s) for s in self.sar_singleton[b]],
                    "k_singleton": self.k_singleton[b].tolist(),
                    "singleton_added": self.singleton_added[b].tolist(),
                    "singleton_unbreakable": self.singleton_unbreakable[b].tolist(),
                    "queries": int(self.queries[b]),
                    "fallback_fired": bool(self.fallback_fired[b]),
                    "clean_broken": np.flatnonzero(self.clean_broken[b]).tolist(),
                    "unbreakable": np.flatnonzero(self.unbreakable[b]).tolist(),
                    "inputs": inputs,
                }
            )
        return {**self.header(), "summary": self.summary(), "samples": samples}

    def header(self) -> dict[str, Any]:
        """The scalar fields (``num_members``, ``deltas``, ``taus``, the options, ``num_rounds``) as JSON values.

        With :meth:`arrays` it is everything :meth:`from_parts` needs to rebuild the result.
        """
        return {
            "num_members": self.num_members,
            "deltas": [float(d) for d in self.deltas],
            "taus": [int(t) for t in self.taus],
            "count_clean_input": self.count_clean_input,
            "stop_when_unreachable": self.stop_when_unreachable,
            "num_rounds": self.num_rounds,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array field by name (``inputs`` only when stored)."""
        return {f.name: v for f in fields(self) if isinstance(v := getattr(self, f.name), np.ndarray)}

    @classmethod
    def from_parts(cls, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> SARResult:
        """The result of :meth:`header` (or the same keys of ``result.json``) and :meth:`arrays`.

        Used by :meth:`load` and by :func:`sarjax.sar.distributed.allgather_parts`; ``arrays``
        is not modified.
        """
        arrays = dict(arrays)
        return cls(
            num_members=int(header["num_members"]),
            deltas=tuple(header["deltas"]),
            taus=tuple(header["taus"]),
            count_clean_input=bool(header["count_clean_input"]),
            stop_when_unreachable=bool(header["stop_when_unreachable"]),
            num_rounds=int(header["num_rounds"]),
            inputs=arrays.pop("inputs", None),
            **arrays,
        )

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``result.json`` and ``arrays.npz`` into ``directory``."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "result.json").write_text(json.dumps(self.to_json_dict(), indent=1))
        np.savez_compressed(path / "arrays.npz", **self.arrays())  # pyright: ignore[reportArgumentType]
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> SARResult:
        """Read a result written by :meth:`save`.

        Results saved before the singleton-completed fields existed get them
        derived from their round logs.
        """
        path = Path(directory)
        meta = json.loads((path / "result.json").read_text())
        with np.load(path / "arrays.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return cls.from_parts(meta, arrays)


_ROUND_FILL = {"fallback_target": -1}


def concat_results(results: list[SARResult]) -> SARResult:
    """Concatenate results of runs over disjoint sample chunks (same pool and deltas).

    Round logs are padded to the longest run (inactive rounds: False, 0, and -1
    for ``fallback_target``); ``num_rounds`` is the maximum.

    Raises:
        ValueError: empty list, or runs that disagree on the pool size,
            deltas or options.
    """
    if not results:
        raise ValueError("concat_results needs at least one result")
    first = results[0]
    for r in results[1:]:
        same = (r.num_members, r.deltas, r.count_clean_input, r.stop_when_unreachable) == (
            first.num_members,
            first.deltas,
            first.count_clean_input,
            first.stop_when_unreachable,
        )
        if not same:
            raise ValueError("results disagree on num_members, deltas or options")
        if (r.inputs is None) != (first.inputs is None):
            raise ValueError("results disagree on whether inputs were stored")
    rounds = max(r.num_rounds for r in results)

    def pad(a: np.ndarray, fill: Any) -> np.ndarray:
        if a.shape[0] == rounds:
            return a
        extra = np.full((rounds - a.shape[0],) + a.shape[1:], fill, dtype=a.dtype)
        return np.concatenate([a, extra], axis=0)

    per_round = {
        name: np.concatenate([pad(getattr(r, name), _ROUND_FILL.get(name, 0)) for r in results], axis=1)
        for name in ROUND_FIELDS
    }
    per_sample = {
        name: np.concatenate([getattr(r, name) for r in results], axis=0) for name in _PER_SAMPLE + _SINGLETON
    }
    inputs = None
    if first.inputs is not None:
        inputs = np.concatenate([pad(r.inputs, 0) for r in results if r.inputs is not None], axis=1)
        if inputs.shape[1] != sum(r.batch_size for r in results):
            raise ValueError("concat_results: some results stored their inputs and others did not")
    return SARResult(
        num_members=first.num_members,
        deltas=first.deltas,
        taus=first.taus,
        count_clean_input=first.count_clean_input,
        stop_when_unreachable=first.stop_when_unreachable,
        num_rounds=rounds,
        inputs=inputs,
        **per_sample,
        **per_round,
    )


def rederive(result: SARResult, deltas: Sequence[float]) -> SARResult:
    """The result of a finished run for other deltas, read off its coverage order.

    A separate run for target ``tau`` follows the stored run's rounds for as long as both keep
    a sample active (the oracles see only the sample's own mask and key). So its ``k_hat`` for a
    sample is determined when the stored run either reached ``tau`` for it (the first such
    round gives ``k_hat``) or stopped with ``covered + |I| < tau`` (no input can reach ``tau``:
    SAR = 1). A sample the stored run stopped while ``tau`` was still reachable (e.g. a looser
    target after a stricter run gave up, or a stricter target after a looser one was met) is
    not determined, and no number is made up for it.

    Args:
        result: a finished run (the full result with its round logs).
        deltas: the new deltas, each in ``[0, 1)``.

    Returns:
        A copy of ``result`` with ``deltas``, ``taus``, ``sar``, ``k_hat``, ``reached`` (and the
        singleton-completed fields) for the new deltas.

    Raises:
        ValueError: a delta the stored run does not determine, naming the samples.
    """
    if isinstance(deltas, (int, float)):
        deltas = (deltas,)
    deltas = tuple(float(d) for d in deltas)
    if not deltas:
        raise ValueError("deltas must hold at least one delta")
    m = result.num_members
    taus = tuple(coverage_target(d, m) for d in deltas)
    sar, k_hat, reached = derive_sar(
        result.new_covered, result.recorded, result.clean_broken, result.valid, taus, m, result.count_clean_input
    )
    count = result.covered.sum(axis=1)
    left = np.where(result.valid, m - count - result.unbreakable.sum(axis=1), 0)
    for j, (delta, tau) in enumerate(zip(deltas, taus)):
        open_ = np.flatnonzero(result.valid & ~reached[:, j] & (count + left >= tau))
        if open_.size:
            raise ValueError(
                f"delta={delta:g} (tau={tau} of M={m}) is not determined by the stored run at "
                f"deltas={list(result.deltas)}: samples {open_[:10].tolist()}"
                f"{' ...' if open_.size > 10 else ''} stopped with tau={tau} still reachable"
            )
    names = {f.name for f in dataclasses.fields(result)}
    derived = {
        n: None for n in ("sar_singleton", "k_singleton", "singleton_added", "singleton_unbreakable") if n in names
    }  # rebuilt for the new taus from the round logs
    return dataclasses.replace(result, deltas=deltas, taus=taus, sar=sar, k_hat=k_hat, reached=reached, **derived)
