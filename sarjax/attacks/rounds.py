"""Multi-round attacks that stay inside the eps-ball of the ORIGINAL input.

the Note: an adaptive attack ran n rounds, each starting from the previous
round's output AND projecting around that output, so the perturbation grew to
n * eps.  Here every round is an ordinary sarjax attack call measured against
``x0``: round r may warm-start from the best point so far, but the attack
projects that start (and every step) onto the ball of ``x0``.  Rounds are
combined per sample by (selected members fooled, objective), and the
combined output is audited once more.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sarjax.attacks.audit import check
from sarjax.attacks.core.entry import Entry
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import Threat


def _pick(better, a, b):
    return jax.tree.map(lambda u, v: jnp.where(better.reshape((-1,) + (1,) * (u.ndim - 1)), u, v), a, b)


def _combine(acc: AttackResult, res: AttackResult, mask) -> AttackResult:
    """Per sample, the better of two rounds' results: most selected members fooled, then
    objective, for ``x_adv`` and ``best_x`` separately; queries added."""
    sel = (jnp.ones_like(res.success, jnp.float32) if mask is None else jnp.broadcast_to(mask, res.success.shape)) > 0

    def score(s):
        return jnp.sum(s & sel, axis=-1)

    nf, of = score(res.success), score(acc.success)
    b1 = (nf > of) | ((nf == of) & (res.objective > acc.objective))
    nb, ob = score(res.best_success), score(acc.best_success)
    b2 = (nb > ob) | ((nb == ob) & (res.best_objective > acc.best_objective))
    x_f, s_f, o_f, l_f = _pick(
        b1,
        (res.x_adv, res.success, res.objective, res.member_loss),
        (acc.x_adv, acc.success, acc.objective, acc.member_loss),
    )
    x_b, s_b, o_b = _pick(
        b2,
        (res.best_x, res.best_success, res.best_objective),
        (acc.best_x, acc.best_success, acc.best_objective),
    )
    return AttackResult(x_f, s_f, o_f, l_f, acc.queries + res.queries, x_b, s_b, o_b)


class Rounds(Entry):
    """``rounds`` rounds of a fixed-budget attack against the same ``x0`` (build with
    :func:`make_rounds`).

    Call: ``fn(params, x0, ref, *, key, mask=None, eps=None, max_queries=None, x_init=None,
    sample_ids=None) -> AttackResult``; ``fn.jit(...)`` with the same arguments (the rounds
    unrolled around the attack's jit-safe entry; no validation, no audit).
    """

    def __init__(self, attack: Callable, rounds: int, *, norm, warm_start: bool, box):
        self.inner = attack
        self.rounds = rounds
        self.norm = norm
        self.warm_start = warm_start
        self.box = box
        self.name = f"{rounds}-round combinator"
        self.__name__ = self.name
        self.apply = getattr(attack, "apply", None)

    @property
    def attack(self):
        """The inner attack's state machine (each round runs it once)."""
        return self.inner.attack

    def _rounds(self, call, params, x0, ref, key, mask, kw) -> AttackResult:
        m = None if mask is None else jnp.asarray(mask)
        x_init = kw.pop("x_init", None)
        acc = None
        for r in range(self.rounds):  # a few compiled calls (host) or an unrolled trace (jit)
            init = acc.best_x if (self.warm_start and acc is not None) else (x_init if r == 0 else None)
            res = call(params, x0, ref, key=jax.random.fold_in(key, r), mask=m, x_init=init, **kw)
            acc = res if acc is None else _combine(acc, res, m)
        assert acc is not None  # rounds >= 1
        return acc

    def __call__(self, params, x0, ref, *, key, mask=None, **call) -> AttackResult:
        """Every round through the inner attack's audited entry, then the combined points
        audited once more against the ORIGINAL ``x0``."""
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        eps = call.get("eps")
        eps = getattr(self.inner, "default_eps", None) if eps is None else eps
        if eps is None:
            raise TypeError(f"{self.name}: eps is required (the call's or the attack's default)")
        acc = self._rounds(self.inner, params, x0, ref, key, mask, dict(call))
        threat = Threat(self.norm, np.broadcast_to(np.asarray(eps, np.float32), (np.shape(x0)[0],)), self.box)
        check(x0, acc.x_adv, threat, what=f"{self.name} (x_adv)")
        check(x0, acc.best_x, threat, what=f"{self.name} (best_x)")
        return acc

    def jit(self, params, x0, ref, *, key, mask=None, **call) -> AttackResult:
        """The jit-safe entry: the rounds around the inner attack's ``.jit``."""
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        inner_jit = getattr(self.inner, "jit", None)
        if inner_jit is None:
            raise TypeError(f"{self.name}: the inner attack {self.inner!r} has no jit-safe entry (.jit)")
        return self._rounds(inner_jit, params, x0, ref, key, mask, dict(call))

    def __repr__(self) -> str:
        return f"Rounds({self.inner!r}, rounds={self.rounds})"


def make_rounds(attack: Callable, rounds: int, *, norm, warm_start: bool = True, box=(0.0, 1.0)) -> Rounds:
    """Runs ``attack`` for ``rounds`` rounds against the same ``x0`` and keeps the best.

    Each round uses key ``fold_in(key, r)`` (fresh random starts; sample ``b`` then draws from
    ``fold_in(fold_in(key, r), sample_ids[b])`` inside the attack) and, with
    ``warm_start``, starts from the best point so far (projected onto the ball
    of ``x0`` by the attack; the first round from the call's ``x_init``, if any).  Use it for
    rounds of an attack with restarts or with EOT over a stochastic model
    (``make_pgd(apply, eot=n)``, ``apply(params, x, key)``): nothing can push a round out of the
    original ball.

    Args:
      attack: a sarjax fixed-budget attack (an ``Entry`` such as :func:`make_pgd`'s, or one
        written on the protocol; any callable of the call shape works for the audited call,
        ``.jit`` needs the attack's own ``.jit``); it validates ``ref`` (labels or targets in ``[0, C)``) before
        the first round.
      rounds: number of rounds (>= 1).
      norm: the attack's norm (for the final audit).
      warm_start: start round r > 0 from the best point so far.
      box: input bounds (for the final audit).

    Returns:
      ``fn(params, x0, ref, *, key, mask=None, eps=None, max_queries=None, x_init=None,
      sample_ids=None) -> AttackResult``: per sample, the round with the most selected members
      fooled (ties: objective) for ``x_adv`` and ``best_x`` separately; ``queries`` summed over
      rounds (``max_queries`` applies per round). ``fn.jit(...)``: the same, jit-safe.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    return Rounds(attack, rounds, norm=norm, warm_start=warm_start, box=box)


def chained_rounds(attack, *, params, x0, y, key, eps, rounds: int) -> list[np.ndarray]:
    """THE NOTE'S ERROR (the Note), reproduced on purpose, never used by an attack: ``rounds``
    rounds of ``attack``, round ``r`` started from, and projected around, round ``r - 1``'s
    output (never the original ``x0``), so the perturbation grows to about ``rounds * eps``.
    For benchmarks and tests that show the error next to :func:`make_rounds`, which stays in
    the ball of ``x0``.

    Args:
      attack: a sarjax AttackFn built with ``audit=False`` (each round's own audit would compare
        it with its own start, which it satisfies: the error is invisible round by round).
      params, y, eps: as the attack's.
      x0: ``[B, *S]`` the ORIGINAL inputs (round 0's start).
      key: PRNG key (round ``r`` uses ``fold_in(key, r)``).
      rounds: number of rounds.

    Returns:
      The output after each round, ``rounds`` arrays ``[B, *S]``.

    Raises:
      ValueError: if the attack audits its outputs (build it with ``audit=False``).
    """
    if getattr(attack, "audits_bound", False):
        raise ValueError("chained_rounds reproduces an error on purpose: build the attack with audit=False")
    x = jnp.asarray(x0)
    outs = []
    for r in range(rounds):
        res = attack(params, x, y, key=jax.random.fold_in(key, r), mask=None, eps=eps)
        x = res.x_adv
        outs.append(np.asarray(x))
    return outs


__all__ = ["Rounds", "chained_rounds", "make_rounds"]
