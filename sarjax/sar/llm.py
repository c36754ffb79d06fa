"""SAR of an LLM pool: the greedy of :mod:`sarjax.cover` driven by a text attack and a judge.

the SAR paper (LLM half): a request (a HarmBench behavior) is broken for a member when the member's
DETERMINISTIC (greedy) response to the attacked prompt is judged harmful. Members that already
comply with the unmodified request count as broken without an attack (they are reported in
``clean_broken``). The rest follows the cover module: each round one joint attack on the
still-uncovered members of every request (at most ``calls`` calls with fresh keys for the requests
that are not broken yet, the SAR paper Table 2: "at most 4 calls" of BEAST), the single-member
fallback when the joint attack breaks nothing new, one run for every delta.

The adapter sees the pool through three host callables, so any model family, attack and judge fit:

- ``attack(params, batch, None, *, key, mask [B, M], **attack_kwargs) -> result`` (every sarjax
  text attack's call shape) with ``sent, sent_mask [B, T]`` (the whole attacked prompt as it is
  sent, holes allowed; a tuple per stack: the first stack's is read), ``member_loss [B, M]``
  (minimised by the attacker), ``queries [B, M]`` and ``success [B, M]``: a
  :class:`~sarjax.attacks.text.core.TextAttackFn` (joint BEAST, joint GCG), a pool attack
  (:class:`~sarjax.attacks.text.gcg_joint.JointGCG`, :class:`~sarjax.attacks.text.beast_cross.CrossBEAST`:
  ``params`` the stacks' params, ``batch`` the request strings) or the AutoDAN-style rewriter
  (:mod:`sarjax.attacks.text.autodan`). With ``self_judged`` the result's ``success`` is the
  coverage (AutoDAN: the SAR judge's verdict on every member, each in its own tokens); otherwise
  every candidate is judged through ``respond``. A batch with ``judge_clean(judge, behaviors)``
  (AutoDAN's) judges the unmodified requests itself;
- ``respond(ids [N, T], mask [N, T]) -> [M][N] str``: every member's greedy response
  (:class:`~sarjax.sar.llm_judging.PoolResponder` for sarjax decoder pools);
- ``judge(behaviors [N], generations [N]) -> [N] bool``: True = the response complies (broken):
  :func:`~sarjax.sar.llm_judging.refusal_judge_fn` (GCG's refusal phrases) or
  :func:`~sarjax.sar.llm_judging.harmbench_judge_fn`.

The judges and the responder are in :mod:`sarjax.sar.llm_judging`, the requests' token blocks and
pools of sarjax decoders in :mod:`sarjax.sar.llm_requests`.

Queries in the result are the attack's (one forward pass of one member on one candidate = 1);
the greedy decoding used to judge a candidate is not charged to the attack's budget.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from sarjax.cover.metrics import coverage_target
from sarjax.cover.result import SARResult
from sarjax.cover.types import Candidates, JointAttack, SingleAttack
from sarjax.runtime import fingerprint as fingerprints
from sarjax.sar.driver import ResumableRun
from sarjax.sar.llm_judging import (
    Judge,
    Respond,
    compact_left,
    judge_members,
)

_JOINT_STREAM = 0
_SINGLE_STREAM = 1
_ASR_STREAM = 2
_CKPT_FILES = ("fingerprint.json", "clean.json", "greedy", "result", "asr.npz")  # what run_llm_sar writes
_CKPT_HINT = "pass overwrite=True (--overwrite) to discard it or choose another output directory"


# ---------------------------------------------------------------------------------------------
# oracles


def _prompt_ids(res: Any) -> tuple[np.ndarray, np.ndarray]:
    """The recorded prompt of an attack's result: ``sent`` / ``sent_mask`` (the first stack's when
    the result holds one per stack)."""
    ids, mask = res.sent, res.sent_mask
    if isinstance(ids, (tuple, list)):
        ids, mask = ids[0], mask[0]
    return np.asarray(ids), np.asarray(mask)


def make_llm_oracles(
    attack: Callable,
    params: Any,
    batch: Any,
    behaviors: Sequence[str],
    respond: Respond,
    judge: Judge,
    key: Any,
    *,
    num_members: int,
    calls: int = 1,
    attack_kwargs: dict | None = None,
    sample_ids: Any = None,
    single_attack: Callable | None = None,
    log: dict | None = None,
    self_judged: bool = False,
) -> tuple[JointAttack, SingleAttack]:
    """Joint and single-member oracles for :func:`sarjax.cover.greedy_sar` from a text attack.

    Args:
      attack: ``attack(params, batch, None, *, key, mask [B, M], **attack_kwargs)`` -> a result
        with ``sent``, ``sent_mask`` ``[B, T]`` (or one per stack: the first is recorded),
        ``member_loss [B, M]`` (minimised), ``queries [B, M]`` and, with ``self_judged``,
        ``success [B, M]``.
      params: passed through to ``attack`` untouched.
      batch: the requests (e.g. a :class:`~sarjax.attacks.text.core.TextBatch`), ``B`` rows.
      behaviors: ``[B]`` request texts (the judge's context).
      respond, judge: see the module docstring.
      key: PRNG key. Round ``r``, call ``c`` of the joint attack uses
        ``fold_in(fold_in(fold_in(key, 0), r), c)``; the fallback stream 1 likewise.
      num_members: ``M``.
      calls: at most this many attack calls per round and oracle; a call runs only the requests
        whose earlier calls broke no targeted member (the SAR paper Table 2: BEAST "at most 4
        calls" of 15,000 queries; 1 for GCG's rounds and AutoDAN).
      attack_kwargs: extra keyword arguments of every call (``max_queries``, ``allowed``, ...).
      sample_ids: ``[B]`` ids folded into the attack's per-request keys (default ``arange(B)``).
      single_attack: the fallback's attack (default ``attack`` with a one-member mask).
      log: optional dict; ``log["calls"]`` collects ``(oracle, round, call, rows attacked)``.
      self_judged: the result's ``success`` is the coverage (the attack judged every member with
        the SAR's judge: AutoDAN); False: every candidate's prompt is judged through ``respond``.

    Returns:
      ``(joint, single)``. ``x_adv`` of a candidate is its prompt ``[B, W]`` with -1 at holes
      (real tokens right-aligned in the width ``W`` of the first result); ``objective`` is minus
      the attack's ``member_loss`` (the fallback then targets the member the joint attack came
      closest to breaking).

    Raises:
      ValueError: a result whose ``success`` / ``queries`` are not ``[B, M]``, or whose prompt
        holds more tokens than the recorded width (naming the row).
    """
    kw = dict(attack_kwargs or {})
    if int(calls) < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    b, m = len(behaviors), int(num_members)
    ids_kw = {} if sample_ids is None else {"sample_ids": np.asarray(sample_ids)}
    single_fn = attack if single_attack is None else single_attack

    width: dict[str, int] = {}

    def recorded(pid: np.ndarray, pm: np.ndarray) -> np.ndarray:
        """The prompts right-aligned in the run's fixed width, -1 at holes."""
        w = width.setdefault("w", pid.shape[1])
        ids, om = compact_left(pid, pm, 0, length=max(w, int(np.asarray(pm).astype(bool).sum(1).max(initial=0))))
        if ids.shape[1] > w:
            rows = np.flatnonzero(om.sum(1) > w).tolist()
            raise ValueError(f"rows {rows}: the attack's prompt holds more tokens than the recorded width {w}")
        return np.where(om.astype(bool), ids, -1).astype(np.int64)

    def run(fn: Callable, stream: int, mask: np.ndarray, r: int) -> Candidates:
        base = jax.random.fold_in(jax.random.fold_in(key, stream), r)
        x = None
        covered = np.zeros((b, m), bool)
        queries = np.zeros(b, np.int64)
        objective = np.full((b, m), -np.inf)
        todo = np.asarray(mask.any(axis=1), bool)
        for c in range(int(calls)):
            if not todo.any():
                break
            call_mask = np.where(todo[:, None], mask, False)
            res = fn(params, batch, None, key=jax.random.fold_in(base, c), mask=call_mask, **kw, **ids_kw)
            pid, pm = _prompt_ids(res)
            if self_judged:  # the attack judged its own output (AutoDAN: every member, own tokens)
                broken = np.asarray(res.success, bool)
                if broken.shape != (b, m):
                    raise ValueError(f"the attack's success must be [B={b}, M={m}], got shape {broken.shape}")
            else:
                broken, _ = judge_members(respond, judge, behaviors, pid, pm)
            q = np.asarray(res.queries)
            if q.shape != (b, m):
                raise ValueError(f"the attack's queries must be [B={b}, M={m}], got shape {q.shape}")
            xs = recorded(pid, pm)
            if x is None:
                x = np.full_like(xs, -1)
            rows = todo
            x[rows] = xs[rows]
            covered[rows] = broken[rows]
            objective[rows] = -np.asarray(res.member_loss, np.float64)[rows]
            queries += np.where(rows, q.astype(np.int64).sum(1), 0)
            if log is not None:
                log.setdefault("calls", []).append((["joint", "single"][stream], int(r), c, int(rows.sum())))
            todo = todo & ~(broken & mask).any(axis=1)
        assert x is not None
        return Candidates(x, covered, queries, objective)

    def joint(uncovered: np.ndarray, round_index: int) -> Candidates:
        return run(attack, _JOINT_STREAM, np.asarray(uncovered, bool), round_index)

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        mask = (np.arange(m)[None, :] == np.asarray(target)[:, None]) & np.asarray(active, bool)[:, None]
        return run(single_fn, _SINGLE_STREAM, mask, round_index)

    return joint, single


# ---------------------------------------------------------------------------------------------
# the run


@dataclasses.dataclass
class LLMSARRun:
    """What :func:`run_llm_sar` returns.

    Attributes:
      result: the :class:`~sarjax.cover.SARResult` (``inputs [R, B, T]``: the recorded prompts,
        -1 at holes).
      behaviors: ``[B]`` request texts.
      clean_generations: ``[M][B]`` greedy responses to the unmodified requests.
      asr: ``[M]`` per-member attack success rate of single-member attacks (None unless asked),
        counting a member that complies with the clean request as broken.
      member_broken: ``[B, M]`` bool behind ``asr`` (None unless asked).
    """

    result: SARResult
    behaviors: list[str]
    clean_generations: list[list[str]]
    asr: np.ndarray | None = None
    member_broken: np.ndarray | None = None


def member_asr(joint: JointAttack, clean_broken: Any) -> dict[str, np.ndarray]:
    """Per-member ASR: each member attacked ALONE on each request (the individual robustness
    ``1 - ASR`` of the SAR paper, Table 6), one oracle call per member over all requests.

    A member that complies with the clean request is broken without an attack (the SAR paper,
    success determination) and is not attacked.

    Args:
      joint: the joint oracle of :func:`make_llm_oracles` (build it on its own key stream, as
        :func:`run_llm_sar` does: ``fold_in(key, 2)``); member ``j`` is attacked through it with
        the one-member mask ``[:, j]`` as round ``j``.
      clean_broken: ``[B, M]`` bool, the members that comply with the clean requests.

    Returns:
      ``{"asr": [M] float64, "broken": [B, M] bool, "covered": [M, B, M] bool (the whole pool's
      judgement of member j's attacked prompt), "prompts": [M, B, T] int64 (-1 at holes; -1
      everywhere where member j was not attacked), "queries": [M, B] int64}``.
    """
    cb = np.asarray(clean_broken, bool)
    b, m = cb.shape
    broken = cb.copy()
    covered = np.zeros((m, b, m), bool)
    queries = np.zeros((m, b), np.int64)
    prompts = None
    for j in range(m):
        mask = np.zeros((b, m), bool)
        mask[:, j] = ~cb[:, j]
        if not mask.any():
            continue
        cand = joint(mask, j)
        if prompts is None:
            prompts = np.full((m,) + cand.x_adv.shape, -1, np.int64)
        rows = mask[:, j]
        prompts[j][rows] = cand.x_adv[rows]
        covered[j][rows] = cand.covered[rows]
        queries[j] = np.where(rows, cand.queries, 0)
        broken[:, j] |= cand.covered[:, j] & rows
    if prompts is None:
        prompts = np.full((m, b, 1), -1, np.int64)
    return {"asr": broken.mean(axis=0), "broken": broken, "covered": covered, "prompts": prompts, "queries": queries}


def run_llm_sar(
    attack: Callable,
    params: Any,
    batch: Any,
    behaviors: Sequence[str],
    respond: Respond,
    judge: Judge,
    deltas: Sequence[float],
    *,
    key: Any,
    num_members: int,
    calls: int = 1,
    attack_kwargs: dict | None = None,
    single_attack: Callable | None = None,
    with_asr: bool = False,
    checkpoint_dir: str | os.PathLike | None = None,
    fingerprint: dict | None = None,
    overwrite: bool = False,
    progress: bool = False,
    self_judged: bool = False,
    clean_prompts: tuple[Any, Any] | None = None,
) -> LLMSARRun:
    """SAR_{1-delta} of an LLM pool on a batch of requests (the SAR paper, LLM half).

    Args:
      attack, params, batch, behaviors, respond, judge, calls, attack_kwargs, single_attack,
        self_judged: see :func:`make_llm_oracles`.
      clean_prompts: ``(ids [B, T], mask [B, T])`` of the unmodified requests as they are sent
        (:func:`clean_prompt_ids`); None: ``batch.clean_prompts()`` when the batch has it, else
        the batch's ``before | after`` blocks.
      deltas: allowed uncovered shares, each in ``[0, 1)``; one run serves all of them.
      key: PRNG key (required).
      num_members: ``M``.
      with_asr: also measure the per-member ASR (:func:`member_asr`); its single-member attacks
        then serve as the greedy's fallback (the fallback for member ``j`` IS member ``j``
        attacked alone on the clean request), at no extra attack cost.
      checkpoint_dir: if set, the greedy checkpoints every round there and the run resumes with
        the fingerprint rule (:mod:`sarjax.runtime.fingerprint`): ``fingerprint.json`` holds
        ``fingerprint`` (the caller's: pool hash, attack settings, judge, ...) plus the
        requests' digest, deltas, key and options; a rerun with other settings raises naming
        them; other deltas are re-derived from a finished run.
      fingerprint: the caller's part of the fingerprint (JSON data).
      overwrite: delete an earlier run's files in ``checkpoint_dir`` first.
      progress: show the greedy's progress bar.

    Returns:
      :class:`LLMSARRun`.

    Raises:
      TypeError: no key. ValueError: bad deltas, a mismatching checkpoint.
    """
    if key is None:
        raise TypeError("run_llm_sar: key is required (a jax.random key); sarjax never defaults it")
    if isinstance(deltas, (int, float)):
        deltas = (float(deltas),)
    deltas = tuple(float(d) for d in deltas)
    if not deltas:
        raise ValueError("deltas must hold at least one delta")
    m = int(num_members)
    for d in deltas:
        coverage_target(d, m)
    behaviors = list(behaviors)
    run = ResumableRun(checkpoint_dir, hint=_CKPT_HINT)
    if run.root is not None:
        fp = {
            "kind": "llm_sar",
            "sarjax_version": fingerprints.sarjax_version(),
            **(fingerprint or {}),
            "num_members": m,
            "deltas": list(deltas),
            "behaviors": fingerprints.array_digest(np.frombuffer("\x00".join(behaviors).encode(), np.uint8)),
            "batch": fingerprints.array_digest(*[np.asarray(a) for a in batch]) if isinstance(batch, tuple) else None,
            "key": fingerprints.key_fingerprint(key),
            "calls": int(calls),
            "with_asr": bool(with_asr),
        }
        run.open(fp, overwrite=overwrite, files=_CKPT_FILES, results=("greedy", "result"), parts=("result",))

    def oracles(fn: Callable, k: Any, **kw: Any) -> tuple[JointAttack, SingleAttack]:
        return make_llm_oracles(
            fn,
            params,
            batch,
            behaviors,
            respond,
            judge,
            k,
            num_members=m,
            calls=calls,
            attack_kwargs=attack_kwargs,
            self_judged=self_judged,
            **kw,
        )

    def judge_clean() -> dict[str, Any]:  # deterministic decoding of the unmodified request
        judge_batch = getattr(batch, "judge_clean", None)
        if judge_batch is not None:  # each member on its own rendering (AutoDAN's batch)
            broken, gens = judge_batch(judge, behaviors)
        else:
            cids, cmask = _clean_prompts(batch) if clean_prompts is None else clean_prompts
            broken, gens = judge_members(respond, judge, behaviors, cids, cmask)
        return {"broken": np.asarray(broken).tolist(), "generations": gens}

    clean = run.cached_json("clean.json", judge_clean)
    clean_broken = np.asarray(clean["broken"], bool)
    clean_gens = clean["generations"]
    single_runs = None
    if with_asr:

        def per_member() -> dict[str, np.ndarray]:
            asr_joint, _ = oracles(single_attack or attack, jax.random.fold_in(key, _ASR_STREAM))
            return member_asr(asr_joint, clean_broken)

        single_runs = run.cached_arrays("asr.npz", per_member)

    def greedy_oracles() -> tuple[JointAttack, SingleAttack]:
        joint, single = oracles(attack, key, single_attack=single_attack)
        if single_runs is not None:
            single = precomputed_single(single_runs)
        return joint, single

    result = run.greedy(greedy_oracles, clean_broken, deltas, checkpoint="greedy", result="result", progress=progress)
    asr = None if single_runs is None else single_runs["asr"]
    broken_single = None if single_runs is None else single_runs["broken"]
    return LLMSARRun(result, behaviors, [list(g) for g in clean_gens], asr, broken_single)


def precomputed_single(single_runs: dict[str, np.ndarray]) -> SingleAttack:
    """The greedy's fallback read off per-member attacks already run (:func:`member_asr`).

    The fallback of Algorithm 1 attacks one uncovered member alone on the request; those
    attacks ARE the per-member ASR attacks, so the fallback for member ``j`` on request ``b``
    returns ``prompts[j, b]`` with its whole-pool coverage ``covered[j, b]`` and its queries, at
    no new attack cost (as :func:`sarjax.sar.vision.precomputed_single` does for images).

    Args:
      single_runs: the dict of :func:`member_asr` (``covered [M, B, M]``, ``prompts [M, B, T]``,
        ``queries [M, B]``).
    """
    cov_all = np.asarray(single_runs["covered"], bool)
    prompts = np.asarray(single_runs["prompts"])
    q = np.asarray(single_runs["queries"], np.int64)

    def single(target: np.ndarray, active: np.ndarray, round_index: int) -> Candidates:
        del round_index  # the member attacks are fixed inputs
        m, b = q.shape
        rows = np.arange(b)
        t = np.asarray(target)
        act = np.asarray(active, bool)
        return Candidates(
            prompts[t, rows], cov_all[t, rows] & act[:, None], np.where(act, q[t, rows], 0), np.zeros((b, m))
        )

    return single


def _clean_prompts(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """``before | after`` of each request (no suffix), ``[B, Pb + Pa]``."""
    if hasattr(batch, "clean_prompts"):
        return batch.clean_prompts()
    ids = np.concatenate([np.asarray(batch.before), np.asarray(batch.after)], axis=1)
    mask = np.concatenate([np.asarray(batch.before_mask), np.asarray(batch.after_mask)], axis=1)
    return ids, mask


__all__ = ["LLMSARRun", "make_llm_oracles", "member_asr", "precomputed_single", "run_llm_sar"]
