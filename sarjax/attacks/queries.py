"""Query accounting inside compiled attack kernels.

A query is one forward or one backward pass of one member on one sample
(docs/design.md "Attacks"; AttackBench's convention).  Counters are ``int32 [B]``
arrays carried through ``lax.scan``/``fori_loop``; a per-sample cap freezes a
sample (its state stops changing) once its next step would exceed the cap.
All functions are pure and jit-friendly.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

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


def check_integer_cap(max_queries, name: str | None = None) -> None:
    """Raises ``TypeError`` unless ``max_queries`` is an int, or an integer numpy / jax scalar or
    array (bool refused). Reads the dtype only, so a traced cap is checked at trace time."""
    dtype = getattr(max_queries, "dtype", None)
    if dtype is None and not isinstance(max_queries, bool) and isinstance(max_queries, int):
        return
    if dtype is None:
        dtype = np.asarray(max_queries).dtype
    if isinstance(max_queries, bool) or dtype == np.bool_ or not jnp.issubdtype(dtype, jnp.integer):
        who = f"{name}: " if name else ""
        raise TypeError(
            f"{who}max_queries must be None, an int or [B] ints (queries are counted whole), got "
            f"{max_queries!r} of dtype {dtype}"
        )


def cap_array(max_queries, batch: int) -> jnp.ndarray:
    """Per-sample cap ``[batch]`` int32 from ``None``, a scalar or ``[B]``, with ``jnp`` only
    (jit-safe: ``max_queries`` may be traced; only its integer dtype is checked, see
    :func:`normalize_cap`).

    Raises:
      TypeError: a cap that is not an integer (a float or a bool; read from the dtype at trace time).
    """
    if max_queries is None:
        return jnp.full((batch,), NO_CAP, jnp.int32)
    check_integer_cap(max_queries)
    if isinstance(max_queries, int):
        max_queries = min(max_queries, int(NO_CAP))
    return jnp.broadcast_to(jnp.asarray(max_queries).astype(jnp.int32), (batch,))


def normalize_cap(max_queries, batch: int, *, name: str | None = None) -> jnp.ndarray:
    """Per-sample cap ``[batch]`` int32 from ``None``, an int or ``[B]`` ints (numpy / jax
    integer scalars and arrays too; values above ``NO_CAP`` are clipped to it).

    Raises:
      TypeError: a cap that is not an integer (``7.9`` was truncated to 7; a bool is refused).
      ValueError: on negative caps or a wrong per-sample length.
    """
    if max_queries is None:
        return jnp.full((batch,), NO_CAP, jnp.int32)
    check_integer_cap(max_queries, name)
    who = f"{name}: " if name else ""
    if isinstance(max_queries, int):
        arr = np.asarray(max(min(max_queries, int(NO_CAP)), -1))
    else:
        arr = np.asarray(max_queries)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != batch):
        raise ValueError(f"{who}max_queries must be None, a scalar or shape [{batch}], got shape {arr.shape}")
    if np.any(arr < 0):
        raise ValueError(f"{who}max_queries must be >= 0, got {max_queries!r}")
    return jnp.broadcast_to(jnp.asarray(np.minimum(arr, int(NO_CAP)), jnp.int32), (batch,))


def per_member(count: jnp.ndarray, backward: jnp.ndarray | int, mask: jnp.ndarray) -> jnp.ndarray:
    """Queries per member ``[B, M]`` of a joint attack whose every charge is a forward pass of
    all ``M`` members plus, for gradient steps, a backward pass of each selected member.

    Such an attack spends ``count = M * F + n_sel * backward`` per sample (``F`` forwards of
    every member, ``backward`` backwards of each of the ``n_sel`` selected members), so member
    ``m`` of sample ``b`` was queried ``F + backward * [mask[b, m] > 0]`` times, exactly; the row
    sums give ``count`` back.

    Args:
      count: ``[B]`` int32 total queries per sample.
      backward: ``[B]`` (or scalar) int32 backward passes charged to each selected member.
      mask: ``[B, M]`` the attack's member mask (fixed for the call).

    Returns:
      ``[B, M]`` int32.
    """
    sel = (jnp.asarray(mask) > 0).astype(jnp.int32)
    m = sel.shape[-1]
    backward = jnp.broadcast_to(jnp.asarray(backward, jnp.int32), count.shape)
    forward = (count - jnp.sum(sel, axis=-1) * backward) // m
    return forward[:, None] + backward[:, None] * sel
