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


def init_counter(batch: int) -> jnp.ndarray:
    """Zero counter ``[batch]`` int32."""
    return jnp.zeros((batch,), jnp.int32)


def members_queried(mask: jnp.ndarray) -> jnp.ndarray:
    """Number of selected members per sample.

    Args:
      mask: ``[B, M]`` or ``[M]`` bool/float member mask.

    Returns:
      ``[B]`` (or scalar for ``[M]``) int32 count of non-zero entries.
    """
    return jnp.sum(jnp.asarray(mask) > 0, axis=-1).astype(jnp.int32)


def step_cost(members: jnp.ndarray, forward: bool = True, backward: bool = True) -> jnp.ndarray:
    """Queries one attack step spends on each sample.

    Args:
      members: ``[B]`` (or scalar) number of members evaluated per sample.
      forward: the step runs a forward pass.
      backward: the step runs a backward pass (gradient attacks).

    Returns:
      Same shape as ``members``: ``members * (forward + backward)``.
    """
    return jnp.asarray(members, jnp.int32) * (int(forward) + int(backward))


def allowed(count: jnp.ndarray, cost: jnp.ndarray, cap) -> jnp.ndarray:
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


def charge(count: jnp.ndarray, cost: jnp.ndarray, active: jnp.ndarray) -> jnp.ndarray:
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
