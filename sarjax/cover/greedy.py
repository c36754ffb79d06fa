"""Batched top-down greedy for SAR (Algorithm 1 of the SAR paper), host side.

Per sample the greedy keeps the uncovered set ``I`` and the covered set ``R``.
Each round: a joint attack on ``I``; if its input breaks at least one member
of ``I``, record the input and move what it covers from ``I`` to ``R``;
otherwise attack one member of ``I`` alone (the fallback): if that input
breaks the member, record it and move what it covers, else mark the member
unbreakable and drop it from ``I``. A sample stops when ``|R| >= tau`` or
``I`` is empty; SAR is ``k_hat / M`` when ``tau`` was reached and 1 otherwise.

All ``B`` samples run together: one joint-attack call per round with a
``[B, M]`` uncovered mask, finished samples masked (all-False rows), never
removed, so the caller's compiled attack sees fixed shapes every round.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sarjax.cover.metrics import coverage_target
from sarjax.cover.result import ROUND_FIELDS, SARResult, derive_sar, derive_singleton
from sarjax.cover.types import JointAttack, SingleAttack
from sarjax.runtime.progress import progress_bar

_STATE_FILE = "greedy_state.npz"


@dataclass(frozen=True)
class GreedySettings:
    """How :func:`greedy_sar` runs: its options beside the oracles and the data.

    Attributes:
        count_clean_input: if True, the clean input counts as one input when it breaks some
            member (default False: "counted as broken without using an attack", the SAR paper).
        stop_when_unreachable: stop a sample once no requested target can still be reached
            (``|R| + |I| < tau`` for every pending ``tau``; default True). The SAR is the same as
            the paper's run-until-``I``-is-empty (1 either way); only queries are saved. False
            runs the literal loop.
        store_inputs: keep the recorded adversarial inputs (``[R, B, *S]``; default True).
        checkpoint_dir: if set, the state is written there after every round (atomically), and
            a run with the same configuration resumes from the last finished round (default
            None: no checkpoint).
        resume: resume from ``checkpoint_dir`` when a checkpoint exists (default True).
        progress: show a rich progress bar (rounds, samples still active, mean covered share;
            default False).

    Raises:
        ValueError: a flag that is not a bool, or ``checkpoint_dir`` not None, a str or a path
            (the message names the field and the value).
    """

    count_clean_input: bool = False
    stop_when_unreachable: bool = True
    store_inputs: bool = True
    checkpoint_dir: str | os.PathLike | None = None
    resume: bool = True
    progress: bool = False

    def __post_init__(self) -> None:
        for name in ("count_clean_input", "stop_when_unreachable", "store_inputs", "resume", "progress"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"GreedySettings.{name} must be a bool, got {type(v).__name__} {v!r}")
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, (str, os.PathLike)):
            raise ValueError(
                "GreedySettings.checkpoint_dir must be None, a str or a path, got "
                f"{type(self.checkpoint_dir).__name__} {self.checkpoint_dir!r}"
            )


def _check_candidates(
    out: Any, who: str, b: int, m: int, x_shape: tuple[int, ...] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not isinstance(out, tuple) or len(out) != 4:
        raise TypeError(f"{who} must return Candidates(x_adv, covered, queries, objective), got {type(out).__name__}")
    x_adv, covered, queries, objective = (np.asarray(a) for a in out)
    if covered.dtype != np.bool_ or covered.shape != (b, m):
        raise ValueError(f"{who}: covered must be bool [{b}, {m}], got {covered.dtype} {covered.shape}")
    if queries.shape != (b,) or not np.issubdtype(queries.dtype, np.integer):
        raise ValueError(f"{who}: queries must be int [{b}], got {queries.dtype} {queries.shape}")
    if objective.shape != (b, m) or not np.issubdtype(objective.dtype, np.number):
        raise ValueError(f"{who}: objective must be numeric [{b}, {m}], got {objective.dtype} {objective.shape}")
    if x_adv.ndim < 1 or x_adv.shape[0] != b:
        raise ValueError(f"{who}: x_adv must have leading dim {b}, got shape {x_adv.shape}")
    if x_shape is not None and x_adv.shape != x_shape:
        raise ValueError(f"{who}: x_adv shape changed between calls: {x_adv.shape} vs {x_shape}")
    return x_adv, covered, queries.astype(np.int64), objective.astype(np.float64)


def _fallback_target(objective: np.ndarray, uncovered: np.ndarray) -> np.ndarray:
    """Uncovered member with the highest joint objective (ties: lowest index)."""
    obj = np.where(np.isnan(objective), -np.inf, objective)
    masked = np.where(uncovered, obj, -np.inf)
    target = np.argmax(masked, axis=1)
    rows = np.arange(uncovered.shape[0])
    bad = ~uncovered[rows, target]  # all uncovered objectives were -inf/nan
    target[bad] = np.argmax(uncovered[bad], axis=1)
    return target


class _State:
    """Mutable greedy state; everything is a numpy array or a list of them."""

    def __init__(self, clean_broken: np.ndarray, valid: np.ndarray):
        self.uncovered = ~clean_broken & valid[:, None]
        self.covered = clean_broken.copy()
        self.unbreakable = np.zeros_like(clean_broken)
        self.covered_round = np.full(clean_broken.shape, -1, dtype=np.int64)
        self.logs: dict[str, list[np.ndarray]] = {k: [] for k in ROUND_FIELDS}
        self.inputs: list[np.ndarray] = []
        self.next_round = 0

    def arrays(self) -> dict[str, np.ndarray]:
        out = {
            "uncovered": self.uncovered,
            "covered": self.covered,
            "unbreakable": self.unbreakable,
            "covered_round": self.covered_round,
        }
        for k, v in self.logs.items():
            out[k] = np.stack(v) if v else np.zeros((0,), dtype=np.int64)
        if self.inputs:
            out["inputs"] = np.stack(self.inputs)
        return out


def _config(
    clean_broken: np.ndarray,
    valid: np.ndarray,
    deltas: tuple[float, ...],
    taus: tuple[int, ...],
    count_clean_input: bool,
    stop_when_unreachable: bool,
    store_inputs: bool,
) -> dict[str, Any]:
    return {
        "batch_size": int(clean_broken.shape[0]),
        "num_members": int(clean_broken.shape[1]),
        "deltas": [float(d) for d in deltas],
        "taus": list(taus),
        "count_clean_input": bool(count_clean_input),
        "stop_when_unreachable": bool(stop_when_unreachable),
        "store_inputs": bool(store_inputs),
        "clean_broken": np.packbits(clean_broken).tolist(),
        "valid": np.packbits(valid).tolist(),
    }


def _atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)  # pyright: ignore[reportArgumentType]  (numpy's stub types **kwds as allow_pickle)
    os.replace(tmp, path)  # atomic: a crash leaves the previous file intact


def _save_state(directory: Path, state: _State, config: dict[str, Any]) -> None:
    """Write the finished round's logs, then the small state that points to it.

    One file per round keeps the cost per round constant; the state file is
    written last, so a crash between the two leaves the previous round's state,
    and the orphaned round file is overwritten when that round is redone.
    """
    directory.mkdir(parents=True, exist_ok=True)
    r = state.next_round - 1
    round_arrays = {k: state.logs[k][r] for k in ROUND_FIELDS}
    if state.inputs:
        round_arrays["inputs"] = state.inputs[r]
    _atomic_savez(directory / f"round_{r:05d}.npz", **round_arrays)
    meta = {"config": config, "next_round": state.next_round}
    _atomic_savez(
        directory / _STATE_FILE,
        meta=np.array(json.dumps(meta)),
        uncovered=state.uncovered,
        covered=state.covered,
        unbreakable=state.unbreakable,
        covered_round=state.covered_round,
    )


def _load_state(directory: Path, config: dict[str, Any], clean_broken: np.ndarray, valid: np.ndarray) -> _State | None:
    path = directory / _STATE_FILE
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta["config"] != config:
            raise ValueError(
                f"checkpoint in {directory} was written by a run with another configuration "
                "(pool size, batch, deltas, options or clean_broken differ); "
                "use a fresh checkpoint_dir or resume=False"
            )
        state = _State(clean_broken, valid)
        state.next_round = int(meta["next_round"])
        state.uncovered = z["uncovered"]
        state.covered = z["covered"]
        state.unbreakable = z["unbreakable"]
        state.covered_round = z["covered_round"]
    for r in range(state.next_round):
        round_path = directory / f"round_{r:05d}.npz"
        if not round_path.exists():
            raise ValueError(f"checkpoint in {directory} lacks {round_path.name}")
        with np.load(round_path, allow_pickle=False) as z:
            for k in ROUND_FIELDS:
                state.logs[k].append(z[k])
            if "inputs" in z.files:
                state.inputs.append(z["inputs"])
    return state


def _active(state: _State, valid: np.ndarray, taus: np.ndarray, stop_when_unreachable: bool) -> np.ndarray:
    count = state.covered.sum(axis=1)
    left = state.uncovered.sum(axis=1)
    pending = count[:, None] < taus[None, :]  # [B, D]
    if stop_when_unreachable:
        pending &= (count + left)[:, None] >= taus[None, :]
    return valid & (left > 0) & pending.any(axis=1)


def greedy_sar(
    joint: JointAttack,
    single: SingleAttack,
    clean_broken: Any,
    deltas: Sequence[float],
    *,
    valid: Any = None,
    settings: GreedySettings | None = None,
) -> SARResult:
    """SAR_{1-delta} for a batch of samples by Algorithm 1's top-down greedy.

    One run serves every delta: it runs to the strictest target
    ``tau = ceil((1 - min(deltas)) M)`` and records the coverage order; each
    delta's ``k_hat`` is the number of inputs recorded when its own target was
    first reached, which is exactly what a separate run for that delta returns
    (the rounds before that point are identical).

    Fallback member: when the joint attack covers nothing new for a sample,
    the single-member attack targets the uncovered member with the highest
    per-member joint objective (the member the joint attack came closest to
    breaking; ties go to the lowest index). Algorithm 1 leaves this choice
    open. The fallback succeeds iff its input breaks that member; its input is
    then recorded and credited with every uncovered member it breaks. If it
    fails, the member is marked unbreakable and removed from ``I`` (the input
    is discarded, as in the paper).

    Args:
        joint: joint attack oracle, see :class:`sarjax.cover.JointAttack`.
        single: single-member attack oracle, see
            :class:`sarjax.cover.SingleAttack`.
        clean_broken: ``[B, M]`` bool, members already outside the safe region
            on the clean input. They count as covered without an attack
            (the SAR paper, LLM success determination) and are reported.
        deltas: one or more allowed uncovered shares, each in ``[0, 1)``.
        valid: optional ``[B]`` bool, real samples (False rows are padding:
            never attacked, SAR nan).
        settings: the run's options (:class:`GreedySettings`: whether the clean input counts,
            early stop, stored inputs, checkpoint, progress bar); default ``GreedySettings()``.

    Returns:
        SARResult with ``sar``, ``k_hat``, ``reached`` of shape ``[B, D]`` (D =
        ``len(deltas)``, in the given order), the singleton-completed
        ``sar_singleton`` / ``k_singleton`` of the same run (the SAR paper,
        Figures 7 and 8; no extra attack, see
        :func:`sarjax.cover.result.derive_singleton`) and the per-round logs.

    Raises:
        TypeError, ValueError: malformed arguments or oracle outputs (shapes,
            dtypes, deltas); ``settings`` not a :class:`GreedySettings`.
    """
    if settings is None:
        settings = GreedySettings()
    if not isinstance(settings, GreedySettings):
        raise TypeError(f"settings must be a GreedySettings, got {type(settings).__name__}")
    count_clean_input, stop_when_unreachable = settings.count_clean_input, settings.stop_when_unreachable
    store_inputs, progress = settings.store_inputs, settings.progress
    cb = np.asarray(clean_broken)
    if cb.dtype != np.bool_ or cb.ndim != 2:
        raise TypeError(f"clean_broken must be a bool array [B, M], got {cb.dtype} {cb.shape}")
    b, m = cb.shape
    if b < 1 or m < 1:
        raise ValueError(f"clean_broken must be non-empty [B, M], got {cb.shape}")
    if valid is None:
        vd = np.ones(b, dtype=bool)
    else:
        vd = np.asarray(valid)
        if vd.dtype != np.bool_ or vd.shape != (b,):
            raise ValueError(f"valid must be bool [{b}], got {vd.dtype} {vd.shape}")
    cb = cb & vd[:, None]
    if isinstance(deltas, (int, float)):
        deltas = (deltas,)
    deltas = tuple(float(d) for d in deltas)
    if not deltas:
        raise ValueError("deltas must hold at least one delta")
    taus = tuple(coverage_target(d, m) for d in deltas)
    tau_arr = np.asarray(taus)
    if not callable(joint) or not callable(single):
        raise TypeError("joint and single must be callables")

    config = _config(cb, vd, deltas, taus, count_clean_input, stop_when_unreachable, store_inputs)
    ckpt = Path(settings.checkpoint_dir) if settings.checkpoint_dir is not None else None
    state = _load_state(ckpt, config, cb, vd) if (ckpt is not None and settings.resume) else None
    if state is None:
        state = _State(cb, vd)

    rows = np.arange(b)
    x_shape = state.inputs[0].shape if state.inputs else None
    bars = contextlib.ExitStack()  # sarjax.runtime.progress: a rich bar, or a no-op stand-in without progress
    bar = bars.enter_context(progress_bar(progress))
    task = bar.add_task("SAR greedy", total=m, completed=state.next_round)
    try:
        while True:
            act = _active(state, vd, tau_arr, stop_when_unreachable)
            if not act.any():
                break
            r = state.next_round
            if r >= m:  # every round removes >= 1 member from some I
                raise RuntimeError(f"greedy did not finish within M={m} rounds")
            unc = state.uncovered & act[:, None]
            x_j, cov_j, q_j, obj_j = _check_candidates(joint(unc.copy(), r), "joint", b, m, x_shape)
            x_shape = x_j.shape
            new = cov_j & unc
            hit = act & new.any(axis=1)
            need = act & ~hit
            target = np.full(b, -1, dtype=np.int64)
            cov_f = np.zeros((b, m), dtype=bool)
            q_f = np.zeros(b, dtype=np.int64)
            success = np.zeros(b, dtype=bool)
            x_rec = x_j.copy() if store_inputs else None
            if need.any():
                tgt = np.where(need, _fallback_target(obj_j, unc), 0)
                x_f, cov_f, q_f, _ = _check_candidates(single(tgt.copy(), need.copy(), r), "single", b, m, x_shape)
                cov_f = cov_f & need[:, None]
                q_f = np.where(need, q_f, 0)
                success = need & cov_f[rows, tgt]
                new = np.where(success[:, None], cov_f & unc, new)
                fail = need & ~success
                state.unbreakable[rows[fail], tgt[fail]] = True
                state.uncovered[rows[fail], tgt[fail]] = False
                target = np.where(need, tgt, -1)
                if x_rec is not None:
                    x_rec[success] = x_f[success]
            recorded = hit | success
            state.uncovered &= ~new
            state.covered |= new
            state.covered_round[new] = r
            log = {
                "active": act,
                "recorded": recorded,
                "new_covered": new,
                "joint_covered": cov_j & act[:, None],
                "joint_queries": np.where(act, q_j, 0),
                "fallback": need,
                "fallback_target": target,
                "fallback_covered": cov_f,
                "fallback_success": success,
                "fallback_queries": q_f,
            }
            for k in ROUND_FIELDS:
                state.logs[k].append(log[k])
            if x_rec is not None:
                x_rec[~recorded] = 0
                state.inputs.append(x_rec)
            state.next_round = r + 1
            if ckpt is not None:
                _save_state(ckpt, state, config)
            if progress:
                still = _active(state, vd, tau_arr, stop_when_unreachable)
                frac = state.covered[vd].mean() if vd.any() else 0.0
                bar.update(
                    task,
                    completed=r + 1,
                    description=f"round {r + 1}: {int(still.sum())} active, covered {frac:.3f}",
                )
    finally:
        bars.close()

    arrays = state.arrays()
    n_rounds = state.next_round
    if n_rounds == 0:
        arrays.update(
            active=np.zeros((0, b), bool),
            recorded=np.zeros((0, b), bool),
            new_covered=np.zeros((0, b, m), bool),
            joint_covered=np.zeros((0, b, m), bool),
            joint_queries=np.zeros((0, b), np.int64),
            fallback=np.zeros((0, b), bool),
            fallback_target=np.zeros((0, b), np.int64),
            fallback_covered=np.zeros((0, b, m), bool),
            fallback_success=np.zeros((0, b), bool),
            fallback_queries=np.zeros((0, b), np.int64),
        )
    sar, k_hat, reached = derive_sar(arrays["new_covered"], arrays["recorded"], cb, vd, taus, m, count_clean_input)
    sar_sc, k_sc, sc_added, sc_unbreakable = derive_singleton(
        arrays["new_covered"],
        arrays["recorded"],
        arrays["fallback"],
        arrays["fallback_success"],
        cb,
        vd,
        taus,
        m,
        count_clean_input,
        stop_when_unreachable,
    )
    return SARResult(
        num_members=m,
        deltas=deltas,
        taus=taus,
        count_clean_input=bool(count_clean_input),
        stop_when_unreachable=bool(stop_when_unreachable),
        num_rounds=n_rounds,
        valid=vd,
        clean_broken=cb,
        unbreakable=state.unbreakable,
        covered=state.covered,
        covered_round=state.covered_round,
        sar=sar,
        k_hat=k_hat,
        reached=reached,
        inputs=arrays.get("inputs") if store_inputs else None,
        sar_singleton=sar_sc,
        k_singleton=k_sc,
        singleton_added=sc_added,
        singleton_unbreakable=sc_unbreakable,
        **{k: arrays[k] for k in ROUND_FIELDS},
    )
