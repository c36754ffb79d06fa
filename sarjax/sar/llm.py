"""SAR of an LLM pool: the greedy of :mod:`sarjax.cover` driven by a text attack and a judge.

the SAR paper (LLM half): a request (a HarmBench behavior) is broken for a member when the member's
DETERMINISTIC (greedy) response to the attacked prompt is judged harmful. Members that already
comply with the unmodified request count as broken without an attack (they are reported in
``clean_broken``). The rest follows the cover module: each round one joint attack on the
still-uncovered members of every request (at most ``calls`` calls with fresh keys for the requests
that are not broken yet, the SAR paper Table 2: "at most 4 calls" of BEAST), the single-member
fallback when the joint attack breaks nothing new, one run for every delta.

The adapter sees the pool through three host callables, so any model family, attack and judge fit:

- the attack, an :class:`LLMSARAttack`: ``fn(params, batch, None, *, key, mask [B, M],
  **kwargs) -> result`` (every sarjax text attack's call shape) with ``sent, sent_mask [B, T]`` (the whole attacked prompt as it is
  sent, holes allowed; a tuple per stack: the first stack's is read), ``member_loss [B, M]``
  (minimised by the attacker), ``queries [B, M]`` and ``success [B, M]``: a
  :class:`~sarjax.attacks.text.entry.TextAttackFn` (joint BEAST, joint GCG), a pool attack
  (:class:`~sarjax.attacks.text.gcg_joint.JointGCG`, :class:`~sarjax.attacks.text.beast_cross.CrossBEAST`:
  ``params`` the stacks' params, ``batch`` a :class:`~sarjax.attacks.text.requests.TextRequests`) or the AutoDAN-style rewriter
  (:mod:`sarjax.attacks.text.autodan`). With ``LLMSARAttack.self_judged`` the result's ``success`` is the
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from sarjax.attacks.text.requests import TextRequests
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
from sarjax.sar.llm_settings import LLMSARSettings

_JOINT_STREAM = 0
_SINGLE_STREAM = 1
_ASR_STREAM = 2
_CKPT_FILES = ("fingerprint.json", "clean.json", "greedy", "result", "asr.npz")  # what run_llm_sar writes
_CKPT_HINT = "pass overwrite=True (the settings; --overwrite) to discard it or choose another output directory"


# ---------------------------------------------------------------------------------------------
# oracles


def _prompt_ids(res: Any) -> tuple[np.ndarray, np.ndarray]:
    """The recorded prompt of an attack's result: ``sent`` / ``sent_mask`` (the first stack's when
    the result holds one per stack)."""
    ids, mask = res.sent, res.sent_mask
    if isinstance(ids, (tuple, list)):
        ids, mask = ids[0], mask[0]
    return np.asarray(ids), np.asarray(mask)


@dataclasses.dataclass(frozen=True)
class LLMSARAttack:
    """The text attack of an LLM SAR run and what every call passes it.

    Attributes:
      fn: ``fn(params, batch, None, *, key, mask [B, M], sample_ids=..., **kwargs)`` -> a result
        with ``sent``, ``sent_mask`` ``[B, T]`` (or one per stack: the first is recorded),
        ``member_loss [B, M]`` (minimised), ``queries [B, M]`` and, with ``self_judged``,
        ``success [B, M]`` (see the module docstring).
      params: passed through to ``fn`` untouched.
      batch: the requests as ``fn`` reads them (e.g. a :class:`~sarjax.attacks.text.TextBatch` or
        :class:`~sarjax.attacks.text.TextRequests`), ``B`` rows.
      kwargs: extra keyword arguments of every call (``max_queries``, ``allowed``, ...); None:
        none. ``key``, ``mask`` and ``sample_ids`` are the oracle's own.
      single: the single-member fallback's attack, called like ``fn`` (default None: ``fn`` with a
        one-member mask).
      self_judged: the result's ``success`` is the coverage (the attack judged every member with
        the SAR's judge: AutoDAN); False (default): every candidate's prompt is judged through
        ``respond``.
      clean_prompts: ``(ids [B, T], mask [B, T])`` of the unmodified requests as they are sent
        (:func:`~sarjax.sar.llm_requests.clean_prompt_ids`); None: ``batch.clean_prompts()`` when
        the batch has it, else the batch's ``before | after`` blocks.

    Raises:
      TypeError: ``fn`` or ``single`` not callable; ``kwargs`` not None or a mapping.
      ValueError: ``kwargs`` naming ``key``, ``mask`` or ``sample_ids``; ``self_judged`` not a
        bool; ``clean_prompts`` not None or an ``(ids, mask)`` pair.
    """

    fn: Callable
    params: Any = None
    batch: Any = None
    kwargs: Mapping[str, Any] | None = None
    single: Callable | None = None
    self_judged: bool = False
    clean_prompts: tuple[Any, Any] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"LLMSARAttack.fn must be callable, got {type(self.fn).__name__}")
        if self.single is not None and not callable(self.single):
            raise TypeError(f"LLMSARAttack.single must be None or callable, got {type(self.single).__name__}")
        if self.kwargs is not None and not isinstance(self.kwargs, Mapping):
            raise TypeError(f"LLMSARAttack.kwargs must be None or a mapping, got {type(self.kwargs).__name__}")
        reserved = sorted(set(self.kwargs or {}) & {"key", "mask", "sample_ids"})
        if reserved:
            raise ValueError(f"LLMSARAttack.kwargs must not hold the oracle's own arguments, got {reserved}")
        if not isinstance(self.self_judged, (bool, np.bool_)):
            raise ValueError(f"LLMSARAttack.self_judged must be a bool, got {self.self_judged!r}")
        if self.clean_prompts is not None and (
            not isinstance(self.clean_prompts, (tuple, list)) or len(self.clean_prompts) != 2
        ):
            raise ValueError(
                f"LLMSARAttack.clean_prompts must be None or an (ids, mask) pair, got {self.clean_prompts!r}"
            )


def make_llm_oracles(
    attack: LLMSARAttack,
    behaviors: Sequence[str],
    respond: Respond,
    judge: Judge,
    *,
    key: Any,
    num_members: int,
    calls: int = 1,
    sample_ids: Any = None,
    log: dict | None = None,
) -> tuple[JointAttack, SingleAttack]:
    """Joint and single-member oracles for :func:`sarjax.cover.greedy_sar` from a text attack.

    Args:
      attack: the :class:`LLMSARAttack` (its ``fn``, ``params``, ``batch``, ``kwargs``, fallback
        ``single`` and ``self_judged``).
      behaviors: ``[B]`` request texts (the judge's context).
      respond, judge: see the module docstring.
      key: PRNG key (required). Round ``r``, call ``c`` of the joint attack uses
        ``fold_in(fold_in(fold_in(key, 0), r), c)``; the fallback stream 1 likewise.
      num_members: ``M``.
      calls: at most this many attack calls per round and oracle (see
        :attr:`~sarjax.sar.llm_settings.LLMSARSettings.calls`).
      sample_ids: ``[B]`` ids folded into the attack's per-request keys (default ``arange(B)``).
      log: optional dict; ``log["calls"]`` collects ``(oracle, round, call, rows attacked)``.

    Returns:
      ``(joint, single)``. ``x_adv`` of a candidate is its prompt ``[B, W]`` with -1 at holes
      (real tokens right-aligned in the width ``W`` of the first result); ``objective`` is minus
      the attack's ``member_loss`` (the fallback then targets the member the joint attack came
      closest to breaking).

    Raises:
      TypeError: ``attack`` not an :class:`LLMSARAttack`; no key.
      ValueError: ``calls < 1``; a result whose ``success`` / ``queries`` are not ``[B, M]``, or
        whose prompt holds more tokens than the recorded width (naming the row).
    """
    if not isinstance(attack, LLMSARAttack):
        raise TypeError(f"make_llm_oracles: attack must be an LLMSARAttack, got {type(attack).__name__}")
    if key is None:
        raise TypeError("make_llm_oracles: key is required (a jax.random key); sarjax never defaults it")
    params, batch, self_judged = attack.params, attack.batch, attack.self_judged
    kw = dict(attack.kwargs or {})
    if int(calls) < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    b, m = len(behaviors), int(num_members)
    ids_kw = {} if sample_ids is None else {"sample_ids": np.asarray(sample_ids)}
    single_fn = attack.fn if attack.single is None else attack.single

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
        return run(attack.fn, _JOINT_STREAM, np.asarray(uncovered, bool), round_index)

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
    attack: LLMSARAttack,
    behaviors: Sequence[str],
    respond: Respond,
    judge: Judge,
    deltas: Sequence[float],
    *,
    key: Any,
    num_members: int,
    settings: LLMSARSettings | None = None,
    fingerprint: dict | None = None,
) -> LLMSARRun:
    """SAR_{1-delta} of an LLM pool on a batch of requests (the SAR paper, LLM half).

    Args:
      attack: the :class:`LLMSARAttack` (the attack, its params and batch, its extra call
        arguments, the fallback's attack, ``self_judged``, the clean prompts).
      behaviors, respond, judge: see :func:`make_llm_oracles`.
      deltas: allowed uncovered shares, each in ``[0, 1)``; one run serves all of them.
      key: PRNG key (required).
      num_members: ``M``.
      settings: the pipeline's knobs (:class:`~sarjax.sar.llm_settings.LLMSARSettings`: ``calls``,
        ``with_asr``, ``checkpoint_dir``, ``overwrite``, ``progress``); default
        ``LLMSARSettings()``. With ``with_asr`` the per-member ASR is measured too
        (:func:`member_asr`); its single-member attacks then serve as the greedy's fallback (the
        fallback for member ``j`` IS member ``j`` attacked alone on the clean request), at no
        extra attack cost. With ``checkpoint_dir`` the greedy checkpoints every round there and
        the run resumes with the fingerprint rule (:mod:`sarjax.runtime.fingerprint`):
        ``fingerprint.json`` holds ``fingerprint`` (the caller's: pool hash, attack settings,
        judge, ...) plus the requests' digest, deltas, key and options; a rerun with other
        settings raises naming them; other deltas are re-derived from a finished run.
      fingerprint: the caller's part of the fingerprint (JSON data).

    Returns:
      :class:`LLMSARRun`.

    Raises:
      TypeError: no key; ``attack`` not an :class:`LLMSARAttack`; ``settings`` not an
        :class:`~sarjax.sar.llm_settings.LLMSARSettings`. ValueError: bad deltas, a mismatching
        checkpoint.
    """
    if key is None:
        raise TypeError("run_llm_sar: key is required (a jax.random key); sarjax never defaults it")
    if not isinstance(attack, LLMSARAttack):
        raise TypeError(f"run_llm_sar: attack must be an LLMSARAttack, got {type(attack).__name__}")
    if settings is None:
        settings = LLMSARSettings()
    if not isinstance(settings, LLMSARSettings):
        raise TypeError(f"run_llm_sar: settings must be an LLMSARSettings or None, got {type(settings).__name__}")
    batch, calls, with_asr = attack.batch, settings.calls, settings.with_asr
    if isinstance(deltas, (int, float)):
        deltas = (float(deltas),)
    deltas = tuple(float(d) for d in deltas)
    if not deltas:
        raise ValueError("deltas must hold at least one delta")
    m = int(num_members)
    for d in deltas:
        coverage_target(d, m)
    behaviors = list(behaviors)
    run = ResumableRun(settings.checkpoint_dir, hint=_CKPT_HINT)
    if run.root is not None:
        fp = {
            "kind": "llm_sar",
            "sarjax_version": fingerprints.sarjax_version(),
            **(fingerprint or {}),
            "num_members": m,
            "deltas": list(deltas),
            "behaviors": fingerprints.array_digest(np.frombuffer("\x00".join(behaviors).encode(), np.uint8)),
            # token ids only (a TextBatch); requests as text (TextRequests) are the behaviors above
            "batch": fingerprints.array_digest(*[np.asarray(a) for a in batch])
            if isinstance(batch, tuple) and not isinstance(batch, TextRequests)
            else None,
            "key": fingerprints.key_fingerprint(key),
            "calls": int(calls),
            "with_asr": bool(with_asr),
        }
        run.open(fp, overwrite=settings.overwrite, files=_CKPT_FILES, results=("greedy", "result"), parts=("result",))

    def oracles(a: LLMSARAttack, k: Any) -> tuple[JointAttack, SingleAttack]:
        return make_llm_oracles(a, behaviors, respond, judge, key=k, num_members=m, calls=calls)

    def judge_clean() -> dict[str, Any]:  # deterministic decoding of the unmodified request
        judge_batch = getattr(batch, "judge_clean", None)
        if judge_batch is not None:  # each member on its own rendering (AutoDAN's batch)
            broken, gens = judge_batch(judge, behaviors)
        else:
            cids, cmask = _clean_prompts(batch) if attack.clean_prompts is None else attack.clean_prompts
            broken, gens = judge_members(respond, judge, behaviors, cids, cmask)
        return {"broken": np.asarray(broken).tolist(), "generations": gens}

    clean = run.cached_json("clean.json", judge_clean)
    clean_broken = np.asarray(clean["broken"], bool)
    clean_gens = clean["generations"]
    single_runs = None
    if with_asr:

        def per_member() -> dict[str, np.ndarray]:
            alone = dataclasses.replace(attack, fn=attack.single or attack.fn, single=None)
            asr_joint, _ = oracles(alone, jax.random.fold_in(key, _ASR_STREAM))
            return member_asr(asr_joint, clean_broken)

        single_runs = run.cached_arrays("asr.npz", per_member)

    def greedy_oracles() -> tuple[JointAttack, SingleAttack]:
        joint, single = oracles(attack, key)
        if single_runs is not None:
            single = precomputed_single(single_runs)
        return joint, single

    result = run.greedy(
        greedy_oracles, clean_broken, deltas, checkpoint="greedy", result="result", progress=settings.progress
    )
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


__all__ = ["LLMSARAttack", "LLMSARRun", "make_llm_oracles", "member_asr", "precomputed_single", "run_llm_sar"]
