"""The entry of a token-level suffix attack (joint GCG, joint BEAST): :class:`TextAttackFn`, the
validation that builds a call's problem (:func:`host_problem`, :func:`traced_problem`), the
threat-model audit (:func:`audit_text`), the result (:class:`TextAttackResult`), the bookkeeping
of a best suffix (:func:`finish`) and the re-tokenization of the returned prompts
(:func:`resend`): with a tokenizer, the audited entry re-tokenizes the whole prompt text and
judges every member again on those ids (:attr:`TextAttackResult.sent`); a break that does not
survive is not reported as a success, and :attr:`TextAttackResult.retokenized` lists the rows
whose ids changed.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks import queries as Q
from sarjax.attacks.core.entry import Entry, host
from sarjax.attacks.core.validate import check_sample_ids
from sarjax.attacks.text.losses import (
    judge_prompts,
    member_success,
)
from sarjax.attacks.text.model import (
    member_count,
    member_losses,
    prompt_losses,
)
from sarjax.attacks.text.requests import (
    SlotTexts,
    TextBatch,
    TextProblem,
    TextRequests,
    assemble,
    check_member_mask,
    check_ref_none,
    render_requests,
    request_targets,
    slot_text_bytes,
    suffix_mask,
    text_batch,
    text_requests,
)
from sarjax.attacks.text.retokenize import (
    DECODE,
    sent_ids,
    texts_of,
)
from sarjax.models.llm.pool import left_pad
from sarjax.models.llm.prompts import retokenizes


class TextAttackResult(NamedTuple):
    """Best-so-far suffix of a call (member axis ``[B, M]``).

    Attributes:
      x_adv: ``[B, T]`` int32, the searched prompt ``before | suffix | after`` (``T = Pb + Ls +
        Pa``; holes where :attr:`mask` is 0): the ids the attack scored.
      success: ``[B, M]`` bool, member ``m`` is broken on request ``b`` by the attack's criterion
        (``criterion`` of the factory), judged on the ids that are SENT (:attr:`sent`):
        ``"target"``: its greedy (argmax) token reproduces every target token under teacher
        forcing (its greedy response starts with the target); ``"refusal"``: it does not (the
        greedy response is not the refusal). Every member, covered or not.
      queries: ``[B, M]`` int32 queries spent on member ``m`` for request ``b`` (one forward or
        backward pass of one member on one candidate prompt = 1; uncovered members 0).
      mask: ``[B, T]`` int32, the real slots of :attr:`x_adv`.
      suffix: ``[B, Ls]`` int32, the best suffix, right-aligned (holes 0).
      suffix_mask: ``[B, Ls]`` int32, its real slots (a right-aligned block).
      loss: ``[B]`` float32, the joint loss of the best suffix (lower is better for the attacker).
      member_loss: ``[B, M]`` float32, each member's loss on :attr:`x_adv` (all members).
      sent: ``[B, S]`` int32, left-padded: the ids of the whole prompt as it is sent. With the
        factory's tokenizer, the audited entry's re-tokenization of the prompt text (``before text
        + decode(suffix) + after text``; ``S = T`` unless a row needs more); otherwise (no
        tokenizer, or :meth:`TextAttackFn.jit`) :attr:`x_adv` without its holes (``S = T``).
      sent_mask: ``[B, S]`` int32.
      retokenized: ``[B, M]`` bool, member ``m``'s :attr:`sent` ids differ from its searched
        :attr:`x_adv` on request ``b`` (the members share one tokenizer, so a row is all True or
        all False; the pool attacks across tokenizers have the same field per member); those
        rows' :attr:`success` was judged again on :attr:`sent`. All False where nothing was
        re-tokenized (no tokenizer, or the jit entry).
    """

    x_adv: Any
    success: Any
    queries: Any
    mask: Any
    suffix: Any
    suffix_mask: Any
    loss: Any
    member_loss: Any
    sent: Any
    sent_mask: Any
    retokenized: Any


class SuffixSpec(NamedTuple):
    """The suffix of a call: the factory's vocabulary and suffix shape with the call's budget,
    allowed ids and start suffix (the record :func:`host_problem` and :func:`traced_problem` read).

    Attributes:
      vocab_size: ``V``.
      ls: ``Ls``, the suffix slots.
      max_queries: None, a scalar or ``[B]``: the cap of each request's queries summed over its
        members.
      allowed: ``[V]`` bool, the ids a suffix may use (None: all).
      suffix_init: ``[Ls]`` or ``[B, Ls]`` start suffix, right-aligned (None: ``init_id`` x ``Ls``).
      sample_ids: ``[B]`` ints; request ``b`` draws from ``fold_in(key, sample_ids[b])`` (None:
        ``arange(B)``).
      init_id: the default start token (None: the first allowed id).
      init_len: ``[B]`` or scalar real tokens of ``suffix_init`` (None: ``Ls``; needs a
        ``suffix_init``).
      grows: the attack appends tokens (BEAST: ``init_len`` in ``[0, Ls]``, default 0) rather than
        editing a full-length suffix (GCG: ``init_len == Ls``).
      m: ``M``, the members (:func:`traced_problem` needs it; :func:`host_problem` counts them).
    """

    vocab_size: int
    ls: int
    max_queries: Any = None
    allowed: Any = None
    suffix_init: Any = None
    sample_ids: Any = None
    init_id: int | None = None
    init_len: Any = None
    grows: bool = False
    m: int | None = None


def host_problem(name: str, model, params, batch, ref, mask, key, spec: SuffixSpec) -> TextProblem:
    """Validates a call on the host and builds its :class:`TextProblem`.

    Args:
      name: the attack, for messages.
      model: the :class:`~sarjax.attacks.text.model.TextModel`; params: its parameters.
      batch: the :class:`TextBatch` (its ``target`` rows are the targets).
      ref: must be None (the batch lays the targets out).
      mask: ``[M]`` or ``[B, M]`` bool or 0/1 (None: every member).
      key: the call's PRNG key.
      spec: the :class:`SuffixSpec` (``spec.m`` is not read).

    Raises:
      TypeError: ``key`` is None, ``batch`` is not a TextBatch, ``ref`` is not None.
      ValueError: an id outside ``[0, V)``, a mask that is not bool or 0/1, a bad mask / allowed /
        cap / init shape, a disallowed init token (each naming what was expected and what came).
    """
    vocab_size, ls, grows = spec.vocab_size, spec.ls, spec.grows
    suffix_init, init_len = spec.suffix_init, spec.init_len
    if key is None:
        raise TypeError(f"{name}: key is required (a jax.random key); sarjax never defaults it")
    if not isinstance(batch, TextBatch):
        raise TypeError(
            f"{name}: expected a TextBatch (see text_batch) or, with the factory's tokenizer, TextRequests; got "
            f"{type(batch).__name__}"
        )
    check_ref_none(name, ref)
    batch = TextBatch(*(np.asarray(a) for a in batch))
    bsz = batch.before.shape[0]
    for f, a in zip(TextBatch._fields, batch, strict=True):
        if a.ndim != 2 or a.shape[0] != bsz:
            raise ValueError(f"{name}: batch.{f} must be [B={bsz}, n], got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{name}: batch.{f} must hold integers, got {a.dtype}")
    for f in ("before", "after", "target"):
        a = getattr(batch, f)
        bad = np.argwhere((a < 0) | (a >= vocab_size))
        if bad.size:
            raise ValueError(f"{name}: batch.{f} has ids outside [0, {vocab_size}) at (row, pos) {bad[:5].tolist()}")
    if np.any(batch.before_mask[:, -1] == 0) or np.any(batch.target_mask[:, 0] == 0):
        raise ValueError(f"{name}: before must be left-padded and target right-padded with >= 1 token (use text_batch)")
    if batch.after.shape[1] and np.any(batch.after_mask[:, -1] == 0):
        raise ValueError(f"{name}: after must be left-padded with >= 1 token per row when Pa > 0 (use text_batch)")
    m = member_count(model, params, batch)
    mk = check_member_mask(name, mask, bsz, m)
    al = np.ones((vocab_size,), bool) if spec.allowed is None else np.asarray(spec.allowed, bool)
    if al.shape != (vocab_size,):
        raise ValueError(f"{name}: allowed must be [V={vocab_size}] bool, got shape {al.shape}")
    if not al.any():
        raise ValueError(f"{name}: allowed excludes every token id")
    first = int(np.argmax(al)) if spec.init_id is None else int(spec.init_id)
    if suffix_init is None:
        si = np.full((bsz, ls), first, np.int32)
        n0 = np.full((bsz,), 0 if grows else ls, np.int32)
    else:
        si = np.asarray(suffix_init)
        if si.ndim == 1:
            si = np.broadcast_to(si[None], (bsz, si.shape[0]))
        if si.shape != (bsz, ls):
            raise ValueError(f"{name}: suffix_init must be [Ls={ls}] or [B={bsz}, Ls={ls}], got shape {si.shape}")
        n0 = np.broadcast_to(np.asarray(ls if init_len is None else init_len, np.int32), (bsz,))
    if suffix_init is None and init_len is not None:
        raise ValueError(f"{name}: init_len needs a suffix_init")
    if np.any((n0 < 0) | (n0 > ls)) or (not grows and np.any(n0 != ls)):
        lo = 0 if grows else ls
        raise ValueError(f"{name}: init_len must lie in [{lo}, {ls}], got {n0.tolist()}")
    real = np.arange(ls)[None] >= ls - n0[:, None]
    bad = np.argwhere(real & ((si < 0) | (si >= vocab_size) | ~al[np.clip(si, 0, vocab_size - 1)]))
    if bad.size:
        raise ValueError(
            f"{name}: the start suffix uses ids outside the allowed vocabulary at (row, pos) {bad[:5].tolist()}"
        )
    sid = check_sample_ids(spec.sample_ids, bsz)
    cap = Q.normalize_cap(spec.max_queries, bsz)
    jb = TextBatch(*(jnp.asarray(a, jnp.int32) for a in batch))
    si = np.where(real, si, 0)
    return TextProblem(jb, jnp.asarray(mk), jnp.asarray(al), cap, key, sid, jnp.asarray(si, jnp.int32), jnp.asarray(n0))


def traced_problem(batch, ref, mask, key, spec: SuffixSpec) -> TextProblem:
    """The :class:`TextProblem` with ``jnp`` operations only (jit-safe; no validation but the
    static ones: a key, ``ref`` None, ``spec.m`` given).

    Args:
      batch: the :class:`TextBatch`; ref: None (the batch lays the targets out).
      mask: ``[M]`` or ``[B, M]`` (None: every member); key: the call's PRNG key.
      spec: the :class:`SuffixSpec`, with ``m``.
    """
    if key is None:
        raise TypeError("key is required (a jax.random key); sarjax never defaults it")
    check_ref_none("jit", ref)
    if spec.m is None:
        raise TypeError("traced_problem: spec.m (the members M) is required")
    vocab_size, ls, m, grows = spec.vocab_size, spec.ls, spec.m, spec.grows
    suffix_init, init_len, allowed, sample_ids = spec.suffix_init, spec.init_len, spec.allowed, spec.sample_ids
    batch = TextBatch(*(jnp.asarray(a).astype(jnp.int32) for a in batch))
    bsz = batch.before.shape[0]
    mk = jnp.ones((bsz, m), jnp.float32) if mask is None else jnp.broadcast_to(jnp.asarray(mask, jnp.float32), (bsz, m))
    al = jnp.ones((vocab_size,), bool) if allowed is None else jnp.asarray(allowed, bool)
    first = jnp.argmax(al).astype(jnp.int32) if spec.init_id is None else jnp.int32(spec.init_id)
    si = (
        jnp.full((bsz, ls), first, jnp.int32)
        if suffix_init is None
        else jnp.broadcast_to(jnp.asarray(suffix_init, jnp.int32), (bsz, ls))
    )
    sid = jnp.arange(bsz, dtype=jnp.int32) if sample_ids is None else jnp.asarray(sample_ids).astype(jnp.int32)
    if suffix_init is None:
        n0 = jnp.full((bsz,), 0 if grows else ls, jnp.int32)
    else:
        n0 = jnp.broadcast_to(jnp.asarray(ls if init_len is None else init_len, jnp.int32), (bsz,))
    si = jnp.where(jnp.arange(ls)[None] >= ls - n0[:, None], si, 0)
    return TextProblem(batch, mk, al, Q.cap_array(spec.max_queries, bsz), key, sid, si, n0)


def audit_text(name: str, problem: TextProblem, result: TextAttackResult, tokenizer=None) -> None:
    """The threat-model audit of a suffix attack's output (host side).

    Checks, per row: the prompt's ``before`` and ``after`` blocks equal the ORIGINAL request's
    (only the suffix changed); the suffix is one right-aligned block (possibly empty: a cap too
    small to score anything); every suffix token is in the allowed vocabulary; the loss is not NaN
    (``inf``: the cap allowed no scoring); queries are charged to covered members only and their
    sum stays within the cap; with a ``tokenizer``, the suffix ids re-tokenize to themselves
    (``encode(decode(ids)) == ids``; whether the whole prompt does is the re-tokenization of the
    audited entry, :attr:`TextAttackResult.retokenized`).

    Raises:
      ValueError: naming every offending row and why.
    """
    b = TextBatch(*(host(a) for a in problem.batch))
    al = host(problem.allowed)
    ids, mask = host(result.x_adv), host(result.mask)
    q, mk, cap = host(result.queries), host(problem.mask) > 0, host(problem.cap)
    suf, sm = host(result.suffix), host(result.suffix_mask)
    loss = host(result.loss)
    pb, ls = b.before.shape[1], suf.shape[1]
    problems = []
    for i in range(ids.shape[0]):
        why = []
        if not (np.array_equal(ids[i, :pb], b.before[i]) and np.array_equal(mask[i, :pb], b.before_mask[i])):
            why.append("the part before the suffix changed")
        if not (np.array_equal(ids[i, pb + ls :], b.after[i]) and np.array_equal(mask[i, pb + ls :], b.after_mask[i])):
            why.append("the part after the suffix changed")
        if not (np.array_equal(ids[i, pb : pb + ls], suf[i]) and np.array_equal(mask[i, pb : pb + ls], sm[i])):
            why.append("the prompt's suffix slots differ from the returned suffix")
        n = int(sm[i].sum())
        if not np.array_equal(sm[i], (np.arange(ls) >= ls - n).astype(sm.dtype)):
            why.append("the suffix is not one right-aligned block")
        real = suf[i][sm[i] != 0]
        if np.any((real < 0) | (real >= al.shape[0])) or not al[np.clip(real, 0, al.shape[0] - 1)].all():
            why.append(
                f"suffix ids outside the allowed vocabulary: {sorted({int(t) for t in real if not (0 <= t < al.shape[0] and al[t])})}"
            )
        if np.isnan(loss[i]):
            why.append("loss is NaN")
        if np.any(q[i] < 0) or np.any(q[i][~mk[i]] != 0) or int(q[i].sum()) > int(cap[i]):
            why.append(
                f"queries {q[i].tolist()} are negative, charged to uncovered members or above the cap {int(cap[i])}"
            )
        if tokenizer is not None and not why:
            if not retokenizes(tokenizer, real.tolist()):
                why.append("the suffix ids do not re-tokenize to themselves")
        if why:
            problems.append(f"row {i}: " + "; ".join(why))
    if problems:
        raise ValueError(f"{name}: output violates the threat model: " + " | ".join(problems))


def _is_requests(inputs) -> bool:
    """``inputs`` are requests as text: :class:`TextRequests`, or a non-empty list / tuple of strings
    (not a :class:`TextBatch`)."""
    if isinstance(inputs, TextRequests):
        return True
    return (
        isinstance(inputs, (list, tuple))
        and not isinstance(inputs, TextBatch)
        and len(inputs) > 0
        and all(isinstance(x, str) for x in inputs)
    )


class TextAttackFn(Entry):
    """The entries of a token-level suffix attack (joint GCG, joint BEAST).

    - ``fn(params, inputs, ref, *, key, mask=None, max_queries=None, sample_ids=None, allowed=None,
      suffix_init=None, init_len=None, texts=None) -> TextAttackResult``: the audited entry:
      validate on the host, run the compiled state machine
      (:func:`~sarjax.attacks.core.protocol.run_jit`), audit (:func:`audit_text`), then, with the
      factory's ``tokenizer``, re-tokenize every returned prompt as TEXT and judge every member
      again on those ids where they changed (:attr:`TextAttackResult.sent`,
      :attr:`TextAttackResult.retokenized`).
    - ``fn.jit(...)``, same arguments but ``texts``, ``inputs`` a :class:`TextBatch` only: the
      same state machine with the problem built by ``jnp`` operations only (no host call, no
      validation, no audit, no re-tokenization).
    - ``fn.render(requests, ref)``: the :class:`TextBatch` (and slot texts) the audited entry runs
      for :class:`TextRequests` (e.g. to call ``fn.jit``).
    - ``fn.attack``: the state machine.

    Arguments of a call:
      params: the pool's parameters (what ``model``'s functions read).
      inputs: the requests, in one of two forms:

        - :class:`TextRequests` (or a sequence of request strings as shorthand), with the
          factory's ``tokenizer``: each request rendered by the tokenizer's chat template as the
          pool searches render it (:meth:`render`), then the same compiled machine;
        - a :class:`TextBatch` (:func:`text_batch`), the pre-tokenized form (what ``fn.jit``
          takes).
      ref: the targets (the refusal or target strings a search scores): with
        :class:`TextRequests`, one string or one per request (None: the factory's default target,
        ``GCGOptions.target`` / ``BEASTOptions.target``); None when the :class:`TextBatch`
        already lays them out (its ``target`` rows are the targets).
      key: PRNG key (keyword-only, required).
      mask: ``[M]`` or ``[B, M]`` bool or 0/1, the members the objective covers (None: all).
      max_queries: None, a scalar or ``[B]``: the cap of each request's queries summed over its
        members.
      sample_ids: ``[B]`` ints; request ``b`` draws from ``fold_in(key, sample_ids[b])``.
      allowed: ``[V]`` bool, the ids a suffix may use.
      suffix_init, init_len: the start suffix ``[Ls]`` or ``[B, Ls]`` (right-aligned) and its
        real tokens (BEAST's seed).
      texts: with a :class:`TextBatch`, ``(before [B] str, after [B] str)``, the rendered text
        around each request's suffix slot (:func:`slot_texts`; each must encode to the batch's
        block): the prompt that is sent is ``before + decode(suffix) + after`` tokenized whole.
        None: each block's ids decoded (exact when a block's text round-trips through the
        tokenizer). Needs the tokenizer. :class:`TextRequests` bring their own.

    A subclass of the image attacks' :class:`~sarjax.attacks.core.entry.Entry`: one code path
    through its hooks ``_host_problem`` / ``_traced_problem`` / ``_audit_result``; ``__call__``
    renders :class:`TextRequests` before and adds the re-tokenization after :meth:`Entry.__call__`.

    Args:
      attack: the state machine (:class:`~sarjax.attacks.core.Attack`).
      name: for messages.
      model: the :class:`TextModel`.
      vocab_size: ``V``.
      suffix_len: ``Ls``.
      tokenizer: optional; when given, the state machine scores the ids of the text that is sent
        (it holds a :class:`Retokenizer` of it: the audited entry puts the call's ``texts`` into
        the problem, :attr:`TextProblem.texts`), the audit also checks that the suffix
        re-tokenizes, the audited entry re-tokenizes the whole prompt, and the call accepts
        :class:`TextRequests`.
      init_id: default start token of a suffix (None: the first allowed id).
      grows: the attack appends tokens (BEAST: ``init_len`` may be < ``Ls``, default 0) rather
        than editing a full-length suffix (GCG: ``init_len == Ls``).
      target: the default target string of a :class:`TextRequests` call (``ref`` None).
      criterion: the success criterion (:attr:`TextAttackResult.success`).
    """

    def __init__(
        self, attack, *, name, model, vocab_size, suffix_len, tokenizer=None, init_id=None, grows=False, target=None,
        criterion,
    ):  # fmt: skip
        self._attack = attack
        self.name = name
        self.__name__ = name
        self.apply = None
        self.model = model
        self.vocab_size = vocab_size
        self.suffix_len = suffix_len
        self.tokenizer = tokenizer
        self.init_id = init_id
        self.grows = grows
        self.target = target
        self.criterion = criterion
        self.scores_sent = tokenizer is not None

    @property
    def attack(self):
        """The state machine."""
        return self._attack

    def _spec(self, **call) -> SuffixSpec:
        return SuffixSpec(self.vocab_size, self.suffix_len, init_id=self.init_id, grows=self.grows, **call)

    def _host_problem(
        self, params, batch, ref, mask, key, *, max_queries=None, sample_ids=None, allowed=None, suffix_init=None,
        init_len=None, texts=None,
    ):  # fmt: skip
        if _is_requests(batch):  # the audited call renders them first; fn.problem does not
            raise TypeError(
                f"{self.name}: the problem of TextRequests is built from their TextBatch: fn.render(requests, ref) "
                "gives it"
            )
        spec = self._spec(
            max_queries=max_queries, allowed=allowed, suffix_init=suffix_init, sample_ids=sample_ids, init_len=init_len
        )
        problem = host_problem(self.name, self.model, params, batch, ref, mask, key, spec)
        if not (self.scores_sent and self.tokenizer is not None):
            return problem
        si, n0 = host(problem.suffix_init), host(problem.init_len)
        bad = [
            i
            for i in range(si.shape[0])
            if n0[i] > 0 and not retokenizes(self.tokenizer, si[i, si.shape[1] - n0[i] :].tolist())
        ]
        if bad:
            raise ValueError(
                f"{self.name}: the start suffix of rows {bad} does not re-tokenize to itself (its decoded text encodes "
                "to other ids); the re-tokenization filter would drop it"
            )
        before, after = texts_of(self.name, self.tokenizer, texts, batch)
        return problem._replace(texts=SlotTexts(*(jnp.asarray(a) for a in slot_text_bytes(before, after))))

    def _traced_problem(
        self, params, batch, ref, mask, key, *, max_queries=None, sample_ids=None, allowed=None, suffix_init=None,
        init_len=None, texts=None,
    ):  # fmt: skip
        if texts is not None:
            raise TypeError(
                f"{self.name}.jit: texts is read by the audited entry only (re-tokenization runs on the host)"
            )
        if _is_requests(batch):
            raise TypeError(
                f"{self.name}.jit: takes a TextBatch (token ids; its target rows are the targets), got "
                f"{type(batch).__name__}; fn.render(requests, ref) renders TextRequests into one"
            )
        m = member_count(self.model, params, TextBatch(*(jnp.asarray(a) for a in batch)))
        spec = self._spec(
            max_queries=max_queries, allowed=allowed, suffix_init=suffix_init, sample_ids=sample_ids,
            init_len=init_len, m=m,
        )  # fmt: skip
        return traced_problem(batch, ref, mask, key, spec)

    def render(self, inputs, ref) -> tuple[TextBatch, tuple[list[str], list[str]]]:
        """The :class:`TextBatch` and slot texts of a :class:`TextRequests` call (host side): each
        request rendered by the factory's tokenizer and chat template
        (:func:`~sarjax.attacks.text.requests.render_requests`, the rendering of the pool
        searches), each block tokenized apart and padded by :func:`text_batch` (the tokenizer's pad
        id).

        Args:
          inputs: :class:`TextRequests`, or a sequence of request strings.
          ref: the targets: one string or one per request (None: the factory's default target).

        Returns:
          ``(batch, (before [B] str, after [B] str))``: the call ``fn(params, batch, None, ...,
          texts=(before, after))`` is the call ``fn(params, inputs, ref, ...)``.

        Raises:
          TypeError: no tokenizer; ``inputs`` not requests; ``ref`` missing or not strings.
          ValueError: ``ref`` not one or ``B`` strings; a block that encodes to no token.
        """
        if self.tokenizer is None:
            raise TypeError(
                f"{self.name}: TextRequests need the factory's tokenizer to be rendered (make_*(..., tokenizer=...)); "
                "without one pass a TextBatch of token ids (text_batch)"
            )
        req = text_requests(self.name, inputs)
        targets = request_targets(self.name, ref, self.target, len(req.prompts))
        r = render_requests(self.name, self.tokenizer, req, targets)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        batch = text_batch(r.before, r.after, r.target, pad_id=int(pad) if pad is not None else 0)
        return batch, (list(r.before_text), list(r.after_text))

    def _audit_result(self, params, problem, result) -> None:
        audit_text(self.name, problem, result, self.tokenizer)

    def __call__(self, params, batch, ref, *, key, mask=None, texts=None, **call) -> TextAttackResult:
        """Render :class:`TextRequests` (:meth:`render`) -> validate -> the compiled state machine
        -> audit (:meth:`Entry.__call__`), then the re-tokenization of the returned prompts (see
        the class docstring; ``batch`` is the call's ``inputs``)."""
        if _is_requests(batch):
            if texts is not None:
                raise TypeError(
                    f"{self.name}: texts come from the TextRequests (rendered by the tokenizer); pass texts with a "
                    "TextBatch only"
                )
            batch, texts = self.render(batch, ref)
            ref = None
        if texts is not None and self.tokenizer is None:
            raise TypeError(f"{self.name}: texts needs the factory's tokenizer (make_*(..., tokenizer=...))")
        result = super().__call__(params, batch, ref, key=key, mask=mask, texts=texts, **call)
        if self.tokenizer is None:
            return result
        return resend(self.name, self.model, self.criterion, self.tokenizer, params, batch, result, texts)

    def __repr__(self) -> str:
        return f"TextAttackFn({self.name}, steps={self.attack.num_steps}, Ls={self.suffix_len})"


def resend(name, model, criterion, tokenizer, params, batch, result: TextAttackResult, texts=None) -> TextAttackResult:
    """The result with every prompt re-tokenized as TEXT (host side): :attr:`TextAttackResult.sent`
    the ids of ``before text + decode(suffix) + after text``, :attr:`~TextAttackResult.retokenized`
    (``[B, M]``) the rows whose ids changed, and those rows' :attr:`~TextAttackResult.success` judged again on
    the new ids (:func:`judge_prompts`; the search's loss fields are left as they are)."""
    before, after = texts_of(name, tokenizer, texts, batch)
    x, xm = host(result.x_adv), host(result.mask)
    suf, sm = host(result.suffix), host(result.suffix_mask)
    rows, changed = [], []
    for i in range(x.shape[0]):
        text = tokenizer.decode(suf[i][sm[i] != 0].tolist(), **DECODE)
        ids = sent_ids(tokenizer, before[i], text, after[i])
        rows.append(ids)
        changed.append(ids != x[i][xm[i] != 0].tolist())
    t = x.shape[1]
    n = max(map(len, rows))
    pad = tokenizer.pad_token_id if getattr(tokenizer, "pad_token_id", None) is not None else 0
    sent, smask = left_pad(rows, int(pad), t if n <= t else -(-n // 8) * 8)
    retok = np.asarray(changed, bool)
    success = host(result.success)
    if retok.any():
        b = TextBatch(*(np.asarray(a) for a in batch))
        again = judge_prompts(
            params, jnp.asarray(sent), jnp.asarray(smask), jnp.asarray(b.target, jnp.int32),
            jnp.asarray(b.target_mask, jnp.int32), model=model, criterion=criterion,
        )  # fmt: skip
        success = np.where(retok[:, None], host(again), success)
    return result._replace(
        success=jnp.asarray(success),
        sent=jnp.asarray(sent),
        sent_mask=jnp.asarray(smask),
        retokenized=jnp.asarray(np.broadcast_to(retok[:, None], success.shape)),
    )


def compact_right(ids, mask):
    """``(ids, mask)`` of one row with its real tokens moved to the right end, in order (jit-safe;
    holes become 0 on the left)."""
    m = mask.astype(jnp.int32)
    order = jnp.argsort(m, stable=True)
    return jnp.where(m[order] > 0, ids[order], 0).astype(jnp.int32), m[order]


def finish(
    model, loss_fn, criterion, params, problem: TextProblem, best_suffix, best_len, best_loss, queries, retok=None
) -> TextAttackResult:
    """The :class:`TextAttackResult` of a best suffix per row: every member's loss and success on
    it (bookkeeping re-scoring, not counted as queries) and the queries split over the covered
    members (``queries [B]`` is every step's cost, charged equally to each covered member).

    With a :class:`Retokenizer` ``retok`` (a search that scores the text that is sent), the
    losses and the success are read on the sent ids of the best suffix (:attr:`TextAttackResult.sent`,
    width ``T``) and :attr:`~TextAttackResult.retokenized` marks the rows whose sent ids differ
    from the blocks; without one, on the blocks without their holes."""
    ls = best_suffix.shape[1]
    texts = problem.texts

    def one(r, s, n, tx):
        sm = suffix_mask(ls, n)
        s = s * sm
        ids, mask = assemble(r, s, sm)
        # judged on the prompt without holes: its last slot is a real token (an empty suffix with
        # no template tail would leave a hole where the first target token is predicted)
        blocks, bmask = compact_right(ids, mask)
        if retok is None:
            ml = member_losses(model, loss_fn, params, r, s[None], sm[None])[:, 0]
            sent, smask, changed = blocks, bmask, jnp.bool_(False)
        else:
            si, sk, good = retok.sent(r, tx, s[None], n, ids.shape[0])
            sent, smask = jnp.where(good[0], si[0], blocks), jnp.where(good[0], sk[0], bmask)
            ml = prompt_losses(model, loss_fn, params, r, sent[None], smask[None])[:, 0]
            changed = jnp.any((sent * smask != blocks * bmask) | (smask != bmask))
        ok = member_success(model, criterion, params, sent, smask, r.target, r.target_mask)
        return sm, ids, mask, ml, ok, sent, smask, changed

    sm, ids, mask, ml, ok, sent, smask, changed = jax.vmap(one)(problem.batch, best_suffix, best_len, texts)
    covered = problem.mask > 0
    nm = jnp.maximum(jnp.sum(covered, axis=1), 1).astype(jnp.int32)
    q = jnp.where(covered, (queries // nm)[:, None], 0).astype(jnp.int32)
    pb = problem.batch.before.shape[1]
    retokenized = jnp.broadcast_to(changed[:, None], ok.shape)  # [B, M]: one tokenizer for every member
    return TextAttackResult(ids, ok, q, mask, ids[:, pb : pb + ls], sm, best_loss, ml, sent, smask, retokenized)


__all__ = [
    "TextAttackFn",
    "TextAttackResult",
    "audit_text",
    "compact_right",
    "finish",
    "SuffixSpec",
    "host_problem",
    "resend",
    "traced_problem",
]
