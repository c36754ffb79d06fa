"""The attack protocol: every sarjax attack is a pure state machine.

An attack is an :class:`Attack`, a hashable bundle of three pure functions over a NamedTuple
state (the optax / evosax shape, docs/design.md "The attack protocol")::

    state  = attack.init(params, problem)        # State (a NamedTuple pytree)
    state  = attack.step(state, params)          # one iteration; run = lax.scan over step
    result = attack.result(state, params)        # AttackResult / MinNormResult, member axis [B, M]

A :class:`Problem` is the normalised, fully traced description of one call: the ORIGINAL
input ``x0``, the references, the member mask, per-sample ``eps``, per-sample query cap,
the key and each sample's index in the data set. Nothing in ``init``/``step``/``result``
touches the host, so :func:`run` works inside a user's ``jax.jit``, ``vmap`` or ``grad``.

Two entries, one code path (:class:`AttackFn`):

* ``fn.jit(params, x0, ref, *, key, mask=None, eps, ...)`` -- jit-safe: builds the problem with
  ``jnp`` operations only (:func:`make_problem`) and runs the state machine. No validation,
  no audit: labels must already lie in ``[0, C)``. Use it inside training loops.
* ``fn(params, x0, ref, *, key, mask=None, eps, ...)`` -- the audited public entry: validates on the
  host (:func:`check_problem`), runs the same :func:`run` under one ``jax.jit`` keyed by the
  attack (equal attacks share one compiled kernel; eps, masks, caps and keys are traced, so
  new values never recompile), then audits ``x_adv`` (and ``best_x``) against the ORIGINAL
  ``x0`` on the host and raises on any ball, box or NaN violation.

``init``, ``step`` and ``result`` take the attack's static config first
(``init(cfg, params, problem)``): write them as module-level functions and put every
hyperparameter in a hashable ``cfg`` (a NamedTuple), so two factories with equal
hyperparameters build equal attacks and share one compiled kernel.
"""

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.core
import jax.numpy as jnp

from sarjax.attacks import queries as Q


class Problem(NamedTuple):
    """One attack call, normalised (every field traced; shapes static).

    Attributes:
      x0: ``[B, *S]`` float32, the ORIGINAL inputs (every iterate is projected around them).
      ref: ``[B, M]`` int32, each member's reference label (untargeted: the label it should
        leave) or target (targeted: the class it should reach).
      mask: ``[B, M]`` float32, the members the objective covers (0 = not attacked).
      eps: ``[B]`` float32, per-sample radius (minimum-norm attacks: unused, ``inf``).
      cap: ``[B]`` int32, per-sample query cap (``queries.NO_CAP`` for none).
      key: PRNG key of the call (required; never a silent default).
      sample_ids: ``[B]`` int32, each sample's index in the data set: sample ``b``'s random
        stream is ``fold_in(key, sample_ids[b])``, never its position in the batch.
      x_init: ``[B, *S]`` warm start (used where ``has_init``; projected into the ball of x0).
      has_init: scalar bool.
    """

    x0: jax.Array
    ref: jax.Array
    mask: jax.Array
    eps: jax.Array
    cap: jax.Array
    key: jax.Array
    sample_ids: jax.Array
    x_init: jax.Array
    has_init: jax.Array


class Attack(NamedTuple):
    """An attack as a pure state machine (hashable: it keys the jit cache).

    Attributes:
      init: ``init(cfg, params, problem) -> State``.
      step: ``step(cfg, state, params) -> State``: one iteration. Samples whose budget is spent
        (or that are done) must leave the state unchanged.
      result: ``result(cfg, state, params) -> Result`` with a member axis ``[B, M]``.
      num_steps: static number of ``step`` calls :func:`run` makes (the static upper bound; the
        traced per-sample cap ``problem.cap`` decides how many take effect).
      cfg: hashable static config (hyperparameters, ``apply``, norm, box).
      prepare: optional ``prepare(cfg, params) -> (cfg, params)``, called once by :func:`run`
        before ``init`` (x-independent work hoisted out of the step loop, e.g. a pool's weight
        layouts, :func:`sarjax.attacks.core.evaluate.prepare_cfg`); ``init``/``step``/``result``
        then see the prepared pair. None: nothing to prepare.
    """

    init: Callable
    step: Callable
    result: Callable
    num_steps: int
    cfg: Any
    prepare: Callable | None = None


def run(attack: Attack, params, problem: Problem | Any):
    """Runs ``attack`` on ``problem``: ``init``, ``num_steps`` x ``step`` in a ``lax.scan``,
    ``result``. Pure and jit-safe (no host calls, no audit). ``problem`` is a :class:`Problem`
    or an attack's own pytree that extends it (the minimum-norm attacks' ``MinNormProblem``)."""
    cfg = attack.cfg
    if attack.prepare is not None:
        cfg, params = attack.prepare(cfg, params)
    state = attack.init(cfg, params, problem)

    def body(s, _):
        return attack.step(cfg, s, params), None

    state, _ = jax.lax.scan(body, state, None, length=attack.num_steps)
    return attack.result(cfg, state, params)


run_jit = jax.jit(run, static_argnums=0)
"""``run`` compiled once per attack (equal attacks share the compiled kernel)."""


def prepare_outside(attack: Attack, params) -> tuple[Attack, Any]:
    """``(attack', params')`` with ``run(attack', params', p) == run(attack, params, p)``, the
    ``prepare`` hook applied here, once, outside the compiled kernel.

    For the audited entries (concrete ``params``): a pool's weight layouts are then computed by
    the pool, which keeps them for its own params (:meth:`sarjax.models.pool.Stack.prepare`),
    instead of inside every call's kernel.  Applied only when the prepared ``cfg.apply`` is a
    bound method (hashed by its owner, so ``attack'`` keys the same compiled kernel on every
    call); otherwise, for traced params, or with no hook, ``(attack, params)`` is returned as is.
    """
    if attack.prepare is None or any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(params)):
        return attack, params
    cfg, prepared = attack.prepare(attack.cfg, params)
    if cfg is attack.cfg or not inspect.ismethod(getattr(cfg, "apply", None)):
        return attack, params
    return attack._replace(cfg=cfg, prepare=None), prepared


def member_count(apply: Callable, params, x0) -> int:
    """``M``: members ``apply`` returns on ``x0`` (1 for ``[B, C]`` logits), by tracing only."""
    shape = jax.eval_shape(apply, params, x0).shape
    return int(shape[0]) if len(shape) == 3 else 1


def make_problem(
    apply: Callable | None, params, x0, ref, *, key, mask=None, eps, max_queries=None, sample_ids=None, x_init=None
) -> Problem:
    """The :class:`Problem` of a call, with ``jnp`` operations only (jit-safe; no validation).

    ``ref`` ``[B]`` is shared by every member ``apply`` returns (``M`` read by tracing, or from
    ``mask`` when ``apply`` is None); ``mask`` ``[M]`` is shared by every sample; ``eps`` and
    ``max_queries`` are scalars or ``[B]``.

    Raises:
      TypeError: ``key`` is None (a key is required everywhere).
    """
    if key is None:
        raise TypeError("key is required (a jax.random key); sarjax never defaults it")
    x0 = jnp.asarray(x0, jnp.float32)
    b = x0.shape[0]
    ref = jnp.asarray(ref).astype(jnp.int32)
    if ref.ndim == 1:
        ref = ref[:, None]
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.ndim == 1:
            mask = jnp.broadcast_to(mask[None], (b, mask.shape[0]))
    m = max(ref.shape[1], 1 if mask is None else mask.shape[1])
    if apply is not None and m == 1:
        m = member_count(apply, params, x0)
    ref = jnp.broadcast_to(ref, (b, m))
    mask = jnp.ones((b, m), jnp.float32) if mask is None else jnp.broadcast_to(mask.astype(jnp.float32), (b, m))
    eps = jnp.broadcast_to(jnp.asarray(jnp.inf if eps is None else eps, jnp.float32), (b,))
    cap = Q.cap_array(max_queries, b)
    sid = jnp.arange(b, dtype=jnp.int32) if sample_ids is None else jnp.asarray(sample_ids).astype(jnp.int32)
    if x_init is None:
        xi, has = x0, jnp.asarray(False)
    else:
        xi, has = jnp.asarray(x_init, jnp.float32), jnp.asarray(True)
    return Problem(x0, ref, mask, eps, cap, key, sid, xi, has)


def sample_keys(problem: Problem) -> jax.Array:
    """Per-sample keys ``[B]``: ``fold_in(problem.key, sample_id)`` (chunking, padding, sharding
    and resume give every sample the same draws)."""
    return jax.vmap(lambda s: jax.random.fold_in(problem.key, s))(problem.sample_ids.astype(jnp.uint32))


__all__ = ["Attack", "Problem", "make_problem", "member_count", "prepare_outside", "run", "run_jit", "sample_keys"]
