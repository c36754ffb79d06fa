"""Query accounting inside compiled attack kernels.

A query is one forward or one backward pass of one member on one sample
(DESIGN.md "Attacks"; AttackBench's convention).  Counters are ``int32 [B]``
arrays carried through ``lax.scan``/``fori_loop``; a per-sample cap freezes a
sample (its state stops changing) once its next step would exceed the cap.
All functions are pure and jit-friendly.
"""

from __future__ import annotations

import jax.numpy as jnp

NO_CAP = jnp.iinfo(jnp.int32).max


def allowed(count: jnp.ndarray, cost: jnp.ndarray | int, cap) -> jnp.ndarray:
    """Which samples may take a step of ``cost`` queries without passing ``cap``.

    Args:
      count: ``[B]`` int32 queries spent so far.
      cost: ``[B]`` or scalar int32 cost of the next step.
      cap: scalar or ``[B]`` per-sample query cap (``NO_CAP`` for none).

    Returns:
      ``[B]`` bool.
    """
    count = jnp.asarray(count, jnp.int32)
    cost = jnp.asarray(cost, jnp.int32)
    cap = jnp.asarray(cap, jnp.int32)
    # Compare as count <= cap - cost to avoid int32 overflow near NO_CAP.
    return count <= cap - cost


def charge(count: jnp.ndarray, cost: jnp.ndarray | int, active: jnp.ndarray) -> jnp.ndarray:
    """Adds ``cost`` to the counter of the ``active`` samples.

    Args:
      count: ``[B]`` int32.
      cost: ``[B]`` or scalar int32.
      active: ``[B]`` bool, samples that actually ran the step.

    Returns:
      ``[B]`` int32 updated counter.
    """
    return count + jnp.where(active, jnp.asarray(cost, jnp.int32), 0)


def freeze(active: jnp.ndarray, new, old):
    """Selects ``new`` where ``active`` else ``old`` (leading axis = batch)."""
    active = jnp.asarray(active)
    shape = active.shape + (1,) * (jnp.ndim(new) - active.ndim)
    return jnp.where(active.reshape(shape), new, old)


def cap_array(max_queries, batch: int) -> jnp.ndarray:
    """Per-sample cap ``[batch]`` int32 from ``None``, a scalar or ``[B]``, with ``jnp`` only
    (jit-safe: ``max_queries`` may be traced; no validation, see :func:`normalize_cap`)."""
    if max_queries is None:
        return jnp.full((batch,), NO_CAP, jnp.int32)
    if isinstance(max_queries, int):
        max_queries = min(max_queries, int(NO_CAP))
    return jnp.broadcast_to(jnp.asarray(max_queries).astype(jnp.int32), (batch,))


def normalize_cap(max_queries, batch: int) -> jnp.ndarray:
    """Per-sample cap ``[batch]`` int32 from ``None``, a scalar or ``[B]``.

    Raises:
      ValueError: on negative caps or a wrong per-sample length.
    """
    if max_queries is None:
        return jnp.full((batch,), NO_CAP, jnp.int32)
    import numpy as np

    arr = np.asarray(max_queries)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != batch):
        raise ValueError(f"max_queries must be None, a scalar or shape [{batch}], got shape {arr.shape}")
    if np.any(arr < 0):
        raise ValueError(f"max_queries must be >= 0, got {max_queries!r}")
    return jnp.broadcast_to(jnp.asarray(np.minimum(arr, int(NO_CAP)), jnp.int32), (batch,))
