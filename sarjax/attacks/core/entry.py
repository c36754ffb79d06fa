"""The two entries of every attack: jit-safe and audited, one code path.

:class:`Entry` is the base of every attack's public object (the fixed-budget
:class:`AttackFn` and the minimum-norm :class:`~sarjax.attacks.minnorm.MinNormAttackFn`):

* ``fn(params, x0, ref, *, key, mask=None, **call)``: :meth:`Entry.problem` (validate on
  the host) -> :func:`~sarjax.attacks.core.protocol.prepare_outside` (a pool's weight layouts,
  kept by the pool) -> :func:`~sarjax.attacks.core.protocol.run_jit` -> audit every returned
  point against the ORIGINAL ``x0``;
* ``fn.jit(...)``, same arguments: the problem built with ``jnp`` operations only and
  :func:`~sarjax.attacks.core.protocol.run`, nothing on the host (for ``jax.jit`` train steps);
* ``fn.attack``: the state machine itself (``init`` / ``step`` / ``result``).

A subclass supplies the call's keywords (``**call``: ``eps`` for the fixed-budget attacks,
``labels`` / ``init_eps`` for the minimum-norm ones) through three hooks: ``_host_problem``
(validation), ``_traced_problem`` (jit-safe) and ``_audit_result``; ``_attack_for`` picks the
state machine of a problem (default :attr:`attack`).
"""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from sarjax.attacks.core.protocol import Attack, Problem, make_problem, prepare_outside, run, run_jit


def _require_key(name: str, key) -> None:
    if key is None:
        raise TypeError(f"{name}: key is required (a jax.random key); sarjax never defaults it")


class Entry:
    """An attack's two entries over one code path (see the module docstring).

    Attributes:
      name: the attack's name (for messages, e.g. ``"pgd"``).
      apply: the model the entries call (``apply(params, x) -> logits``).
    """

    name: str
    apply: Callable | None

    @property
    def attack(self) -> Attack:
        """The state machine (``init`` / ``step`` / ``result``) the entries run."""
        raise NotImplementedError

    def _host_problem(self, params, x0, ref, mask, key, **call) -> Any:
        raise NotImplementedError

    def _traced_problem(self, params, x0, ref, mask, key, **call) -> Any:
        raise NotImplementedError

    def _attack_for(self, params, problem) -> Attack:
        return self.attack

    def _audit_result(self, params, problem, result) -> None:
        return None

    def audit_result(self, params, problem, result) -> None:
        """Audits ``result`` against ``problem.x0`` (what the audited call does after the run;
        combinators that run the state machine themselves, e.g. member mode, call it)."""
        self._audit_result(params, problem, result)

    def problem(self, params, x0, ref, *, key, mask=None, **call):
        """The validated problem of a call (host side; raises ``ValueError`` / ``TypeError`` on
        bad input, naming what was expected)."""
        _require_key(self.name, key)
        return self._host_problem(params, x0, ref, mask, key, **call)

    def __call__(self, params, x0, ref, *, key, mask=None, **call):
        """The audited public entry: validate -> the compiled state machine -> audit.

        Args:
          params: the model's parameters (a pool's stacked params).
          x0: ``[B, *S]`` the ORIGINAL inputs (every returned point is audited against them).
          ref: ``[B]`` or ``[B, M]`` labels (untargeted) or targets (targeted).
          key: a ``jax.random`` key (keyword-only, required: sarjax never defaults it).
          mask: ``[M]`` or ``[B, M]`` bool / {0, 1}, the members the objective covers (None: all).
          **call: ``max_queries``, ``sample_ids`` and the family's keywords (``eps``, ``x_init``;
            minimum-norm: ``labels``, ``init_eps``).
        """
        problem = self.problem(params, x0, ref, key=key, mask=mask, **call)
        attack, prepared = prepare_outside(self._attack_for(params, problem), params)
        result = run_jit(attack, prepared, problem)
        self._audit_result(params, problem, result)
        return result

    def jit(self, params, x0, ref, *, key, mask=None, **call):
        """The jit-safe entry, same arguments as the call: no host call, no validation, no audit
        (references must lie in ``[0, C)``)."""
        _require_key(self.name, key)
        problem = self._traced_problem(params, x0, ref, mask, key, **call)
        return run(self._attack_for(params, problem), params, problem)


class AttackFn(Entry):
    """A fixed-budget attack's entries: ``fn(params, x0, ref, *, key, mask=None, eps=None,
    max_queries=None, x_init=None, sample_ids=None) -> AttackResult``, ``fn.jit(...)`` (same
    arguments), ``fn.attack``.

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
        self._attack = attack
        self.name = name
        self.apply = apply
        self._validate = validate
        self._audit = audit
        self.default_eps = default_eps
        self.__name__ = name

    @property
    def attack(self) -> Attack:
        """The state machine."""
        return self._attack

    def _host_problem(
        self, params, x0, ref, mask, key, *, eps=None, max_queries=None, x_init=None, sample_ids=None
    ) -> Problem:
        e = self.default_eps if eps is None else eps
        return self._validate(params, x0, ref, mask, key, e, max_queries, x_init, sample_ids)

    def _traced_problem(
        self, params, x0, ref, mask, key, *, eps=None, max_queries=None, x_init=None, sample_ids=None
    ) -> Problem:
        e = self.default_eps if eps is None else eps
        if e is None:  # checked at trace time: without it the attack would be unbounded
            raise TypeError(
                f"{self.name}: eps is required (scalar or [B]) either at construction or call time; "
                "pass eps=jnp.inf for an unbounded attack"
            )
        return make_problem(
            self.apply,
            params,
            x0,
            ref,
            key=key,
            mask=mask,
            eps=e,
            max_queries=max_queries,
            sample_ids=sample_ids,
            x_init=x_init,
        )

    @property
    def audits_bound(self) -> bool:
        """Whether the audited call checks every returned point's ball and box against ``x0``
        (False for an attack built with ``audit=False``, whose call still checks non-finite
        logits)."""
        return self._audit is not None and bool(getattr(self._audit, "bound", True))

    def _audit_result(self, params, problem, result) -> None:
        if self._audit is not None:
            self._audit(problem, result)

    def __repr__(self) -> str:
        return f"AttackFn({self.name}, steps={self.attack.num_steps})"


def host(a) -> np.ndarray:
    """A traced-free array on the host (for validators and audits)."""
    return np.asarray(jax.device_get(a))


class HostDrivenEntry(Entry):
    """The base of an attack whose loop runs on the host (AutoAttack's cascade, the text attacks
    that run tokenizers between steps): the one call shape through its own ``__call__``, no state
    machine and no jit-safe entry (both raise ``TypeError`` naming ``host_reason``)."""

    apply = None
    host_reason = "its loop runs on the host"

    @property
    def attack(self):
        """Raises ``TypeError``: a host-driven attack has no state machine."""
        raise TypeError(f"{self.name}: a host-driven attack ({self.host_reason}) has no state machine")

    def jit(self, *args, **kwargs):
        """Raises ``TypeError``: a host-driven attack has no jit-safe entry; call ``fn(...)``."""
        raise TypeError(f"{self.name}: no jit-safe entry ({self.host_reason}); call fn(...)")

    def _reject_keywords(self, call: dict) -> None:
        """Raises ``TypeError`` naming the keywords an override's ``**call`` received that it does
        not take (an override keeps the base's ``**call`` so that its signature stays compatible;
        its own keywords are explicit)."""
        if call:
            raise TypeError(f"{self.name}: unexpected keyword argument(s) {sorted(call)}")


__all__ = ["AttackFn", "Entry", "HostDrivenEntry", "host"]
