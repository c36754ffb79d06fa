"""Per-member attack losses (all to be MAXIMISED) and the success test.

Written for one example: ``logits: [M, C]`` (M members), ``ref: [M]`` int
labels (untargeted: the label to move away from, e.g. each member's own clean
prediction; targeted: the target class).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LOSSES = ("ce", "dlr", "margin")


def cross_entropy(logits: jnp.ndarray, label: jnp.ndarray) -> jnp.ndarray:
    """Cross-entropy ``-log softmax(logits)[label]`` per member.

    Args:
      logits: ``[M, C]``.
      label: ``[M]`` int.

    Returns:
      ``[M]``.
    """
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, label[:, None], axis=-1)[:, 0]


def _sorted_desc(logits):
    return -jnp.sort(-logits, axis=-1)


def dlr(logits: jnp.ndarray, label: jnp.ndarray) -> jnp.ndarray:
    """Untargeted Difference-of-Logits-Ratio (Croce & Hein 2020, eq. 5), to maximise.

    ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3 + 1e-12)`` with ``z_pi``
    sorted descending.  Needs at least 3 classes.

    Args:
      logits: ``[M, C]``.
      label: ``[M]`` int.

    Returns:
      ``[M]``.
    """
    if logits.shape[-1] < 3:
        raise ValueError(f"DLR loss needs at least 3 classes, got {logits.shape[-1]}")
    z_y = jnp.take_along_axis(logits, label[:, None], axis=-1)[:, 0]
    other = jnp.max(jnp.where(jax.nn.one_hot(label, logits.shape[-1], dtype=bool), -jnp.inf, logits), axis=-1)
    s = _sorted_desc(logits)
    return -(z_y - other) / (s[:, 0] - s[:, 2] + 1e-12)


def dlr_targeted(logits: jnp.ndarray, label: jnp.ndarray, target: jnp.ndarray) -> jnp.ndarray:
    """Targeted DLR (Croce & Hein 2020, eq. 6), to maximise.

    ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2 + 1e-12)``.  Needs at least
    4 classes.

    Args:
      logits: ``[M, C]``.
      label: ``[M]`` int, the label to move away from.
      target: ``[M]`` int, the target class.

    Returns:
      ``[M]``.
    """
    if logits.shape[-1] < 4:
        raise ValueError(f"targeted DLR loss needs at least 4 classes, got {logits.shape[-1]}")
    z_y = jnp.take_along_axis(logits, label[:, None], axis=-1)[:, 0]
    z_t = jnp.take_along_axis(logits, target[:, None], axis=-1)[:, 0]
    s = _sorted_desc(logits)
    return -(z_y - z_t) / (s[:, 0] - 0.5 * (s[:, 2] + s[:, 3]) + 1e-12)


def margin(logits: jnp.ndarray, label: jnp.ndarray) -> jnp.ndarray:
    """Carlini-Wagner margin ``max_{i != y} z_i - z_y`` per member (positive = fooled)."""
    z_y = jnp.take_along_axis(logits, label[:, None], axis=-1)[:, 0]
    other = jnp.max(jnp.where(jax.nn.one_hot(label, logits.shape[-1], dtype=bool), -jnp.inf, logits), axis=-1)
    return other - z_y


def member_loss(
    logits: jnp.ndarray, ref: jnp.ndarray, kind: str, targeted: bool, source: jnp.ndarray | None = None
) -> jnp.ndarray:
    """The loss each member contributes, oriented so that larger = more adversarial.

    Args:
      logits: ``[M, C]``.
      ref: ``[M]`` int: the label to leave (untargeted) or the target (targeted).
      kind: ``"ce"``, ``"dlr"`` or ``"margin"``.
      targeted: whether ``ref`` is a target.
      source: ``[M]`` int, the label to leave in targeted DLR (defaults to the
        current top class).

    Returns:
      ``[M]``.
    """
    if kind == "ce":
        return -cross_entropy(logits, ref) if targeted else cross_entropy(logits, ref)
    if kind == "margin":
        return -margin(logits, ref) if targeted else margin(logits, ref)
    if kind == "dlr":
        if not targeted:
            return dlr(logits, ref)
        src = jnp.argmax(logits, axis=-1) if source is None else source
        return dlr_targeted(logits, src, ref)
    raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")


def fooled(logits: jnp.ndarray, ref: jnp.ndarray, targeted: bool) -> jnp.ndarray:
    """Success per member: prediction != ref (untargeted) or == ref (targeted).

    Args:
      logits: ``[M, C]``.
      ref: ``[M]`` int.
      targeted: mode.

    Returns:
      ``[M]`` bool.
    """
    pred = jnp.argmax(logits, axis=-1)
    return pred == ref if targeted else pred != ref
