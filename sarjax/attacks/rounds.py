"""Multi-round attacks that stay inside the eps-ball of the ORIGINAL input.

papers/002: an adaptive attack ran n rounds, each starting from the previous
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
from sarjax.attacks.result import AttackResult
from sarjax.attacks.threat import Threat


def _pick(better, a, b):
    return jax.tree.map(lambda u, v: jnp.where(better.reshape((-1,) + (1,) * (u.ndim - 1)), u, v), a, b)


def make_rounds(attack: Callable, rounds: int, *, norm, warm_start: bool = True, box=(0.0, 1.0)) -> Callable:
    """Runs ``attack`` for ``rounds`` rounds against the same ``x0`` and keeps the best.

    Each round uses key ``fold_in(key, r)`` (fresh random starts; sample ``b`` then draws from
    ``fold_in(fold_in(key, r), sample_ids[b])`` inside the attack) and, with
    ``warm_start``, starts from the best point so far (projected onto the ball
    of ``x0`` by the attack).  Use it for rounds of an attack with restarts or
    with EOT over a stochastic model (``make_pgd(apply, eot=n)``, ``apply(params, x,
    key)``): nothing can push a round out of the original ball.

    Args:
      attack: a sarjax public attack ``fn(params, x0, ref, mask, key, *, eps,
        max_queries, x_init, sample_ids) -> AttackResult`` (e.g. from :func:`make_pgd`); it
        validates ``ref`` (labels or targets in ``[0, C)``) before the first round.
      rounds: number of rounds (>= 1).
      norm: the attack's norm (for the final audit).
      warm_start: start round r > 0 from the best point so far.
      box: input bounds (for the final audit).

    Returns:
      ``fn(params, x0, ref, mask=None, key, *, eps, max_queries=None, sample_ids=None) ->
      AttackResult``: per sample, the round with the most selected members
      fooled (ties: objective) for ``x_adv`` and ``best_x`` separately;
      ``queries`` summed over rounds (``max_queries`` applies per round). ``key`` is required
      (``TypeError`` without it).
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")

    def fn(params, x0, ref, mask=None, key=None, *, eps, max_queries=None, sample_ids=None) -> AttackResult:
        if key is None:
            raise TypeError(f"{rounds}-round combinator: key is required (a jax.random key); sarjax never defaults it")
        m = None if mask is None else jnp.asarray(mask)
        acc = None
        for r in range(rounds):  # host loop over a few compiled calls
            init = acc.best_x if (warm_start and acc is not None) else None
            res = attack(
                params,
                x0,
                ref,
                m,
                jax.random.fold_in(key, r),
                eps=eps,
                max_queries=max_queries,
                x_init=init,
                sample_ids=sample_ids,
            )
            if acc is None:
                acc = res
                continue
            sel = (jnp.ones_like(res.success, jnp.float32) if m is None else jnp.broadcast_to(m, res.success.shape)) > 0

            def score(s):
                return jnp.sum(s & sel, axis=-1)

            nf, of = score(res.success), score(acc.success)
            b1 = (nf > of) | ((nf == of) & (res.objective > acc.objective))
            nb, ob = score(res.best_success), score(acc.best_success)
            b2 = (nb > ob) | ((nb == ob) & (res.best_objective > acc.best_objective))
            final = _pick(
                b1,
                (res.x_adv, res.success, res.objective, res.member_loss),
                (acc.x_adv, acc.success, acc.objective, acc.member_loss),
            )
            best = _pick(
                b2,
                (res.best_x, res.best_success, res.best_objective),
                (acc.best_x, acc.best_success, acc.best_objective),
            )
            x_f, s_f, o_f, l_f = final
            x_b, s_b, o_b = best
            acc = AttackResult(x_f, s_f, o_f, l_f, acc.queries + res.queries, x_b, s_b, o_b)
        assert acc is not None  # rounds >= 1
        threat = Threat(norm, np.broadcast_to(np.asarray(eps, np.float32), (np.shape(x0)[0],)), box)
        check(x0, acc.x_adv, threat, what=f"{rounds}-round combinator (x_adv)")
        check(x0, acc.best_x, threat, what=f"{rounds}-round combinator (best_x)")
        return acc

    return fn
