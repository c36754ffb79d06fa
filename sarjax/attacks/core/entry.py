"""The two entries of every attack: jit-safe and audited, one code path.

:class:`AttackFn` wraps an :class:`~sarjax.attacks.core.protocol.Attack`:

* ``fn(params, x0, ref, mask=None, key=..., *, eps=None, max_queries=None, x_init=None,
  sample_ids=None)``: validate on the host -> :func:`~sarjax.attacks.core.protocol.run_jit`
  -> audit every returned point against the ORIGINAL ``x0``;
* ``fn.jit(...)``, same arguments: :func:`~sarjax.attacks.core.protocol.make_problem` +
  :func:`~sarjax.attacks.core.protocol.run`, nothing on the host (for ``jax.jit`` train steps);
* ``fn.attack``: the state machine itself (``init`` / ``step`` / ``result``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from sarjax.attacks.core.protocol import Attack, Problem, make_problem, run, run_jit


class AttackFn:
    """An attack's two entries (see the module docstring).

    Args:
      attack: the state machine.
      name: for messages (e.g. ``"pgd"``).
      apply: the model, ``apply(params, x) -> logits [M, B, C]`` or ``[B, C]`` (with ``eot > 1``
        the stochastic ``apply(params, x, key)``).
      validate: ``validate(params, x0, ref, mask, key, eps, max_queries, x_init, sample_ids) ->
        Problem``: the host-side checks (shapes, box, finite inputs, labels in ``[0, C)``, eps,
        caps, sample ids); raises ``ValueError`` / ``TypeError`` naming what was expected.
      audit: ``audit(problem, result) -> None``: raises on a ball, box or NaN violation of any
        returned point measured against ``problem.x0``; None: no audit (documented per attack).
      default_eps: the factory's eps (scalar or ``[B]``), used when a call gives none.
    """

    def __init__(
        self,
        attack: Attack,
        *,
        name: str,
        apply: Callable | None,
        validate: Callable,
        audit: Callable | None,
        default_eps=None,
    ):
        self.attack = attack
        self.name = name
        self.apply = apply
        self._validate = validate
        self._audit = audit
        self.default_eps = default_eps
        self.__name__ = name

    def problem(
        self, params, x0, ref, mask=None, key=None, *, eps=None, max_queries=None, x_init=None, sample_ids=None
    ) -> Problem:
        """The validated :class:`Problem` of a call (host side; raises on bad input)."""
        if key is None:
            raise TypeError(f"{self.name}: key is required (a jax.random key); sarjax never defaults it")
        e = self.default_eps if eps is None else eps
        return self._validate(params, x0, ref, mask, key, e, max_queries, x_init, sample_ids)

    def __call__(
        self, params, x0, ref, mask=None, key=None, *, eps=None, max_queries=None, x_init=None, sample_ids=None
    ):
        problem = self.problem(
            params, x0, ref, mask, key, eps=eps, max_queries=max_queries, x_init=x_init, sample_ids=sample_ids
        )
        res = run_jit(self.attack, params, problem)
        if self._audit is not None:
            self._audit(problem, res)
        return res

    def jit(self, params, x0, ref, mask=None, key=None, *, eps=None, max_queries=None, x_init=None, sample_ids=None):
        """The jit-safe entry: no host call, no validation, no audit (labels must lie in ``[0, C)``)."""
        e = self.default_eps if eps is None else eps
        problem = make_problem(
            self.apply, params, x0, ref, mask, key, eps=e, max_queries=max_queries, sample_ids=sample_ids, x_init=x_init
        )
        return run(self.attack, params, problem)

    def __repr__(self) -> str:
        return f"AttackFn({self.name}, steps={self.attack.num_steps})"


def host(a) -> np.ndarray:
    """A traced-free array on the host (for validators and audits)."""
    return np.asarray(jax.device_get(a))


__all__ = ["AttackFn", "host"]
