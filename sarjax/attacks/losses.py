"""Attack losses and success tests: one module, one sign convention, any batch shape.

**Convention.** Every loss here is oriented so that LARGER = MORE ADVERSARIAL: a fixed-budget
attack ascends it, a minimum-norm attack descends its negation. Logits are ``[..., C]``
(``[C]`` for one example, ``[M, C]`` for one example's members, ``[B, C]`` or ``[M, B, C]``);
the integer class arguments have the batch shape ``[...]`` of the logits without ``C``
(scalars for ``[C]``) and every loss returns ``[...]``.

Two forms, the same losses:

* **reference form** ``loss(logits, label)``: the loss of leaving ``label``
  (untargeted). A targeted attack maximises the NEGATED loss of its target
  (:func:`member_loss` does the orientation for the fixed-budget attacks).
* **goal form** ``goal_*(logits, y, t)``: the minimum-norm cores' per-example form, with the
  true label ``y`` and the target ``t`` (``t < 0``: untargeted). The loss of the goal:
  leaving ``y`` when untargeted, reaching ``t`` when targeted, larger = closer to (or deeper
  into) the goal. :func:`goal_reached` is its success test.

=====================  ======================================================  ==============
name                   value (``z`` = logits, ``o_c = max_{j != c} z_j``)    adversarial at
=====================  ======================================================  ==============
``cross_entropy``      ``-log softmax(z)[label]``                              large
``margin``             ``o_label - z_label`` (Carlini-Wagner)                  ``> 0``
``dlr``                ``-(z_y - o_y) / (z_pi1 - z_pi3)``                      ``> 0``
``dlr_targeted``       ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)``        large
``member_loss``        one of the above, negated for a target                  large
``goal_margin``        untargeted ``o_y - z_y``; targeted ``z_t - o_t``        ``> 0``
``goal_cross_entropy`` untargeted ``CE(y)``; targeted ``-CE(t)``               large
``goal_dlr``           untargeted ``dlr``; targeted ``dlr_targeted``           ``> 0``
=====================  ======================================================  ==============

(``z_pi`` sorted descending; DLR: Croce & Hein 2020, eqs. 5-6, with ``1e-12`` added to the
denominator.) Success tests (bool ``[...]``): :func:`fooled` (reference form: prediction ``!=
ref``, or ``== ref`` when targeted) and :func:`goal_reached` (goal form). :func:`value_grad`
gives a goal loss, its input gradient and the logits of one example's model in one
forward-backward pass (2 queries).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

LOSSES = ("ce", "dlr", "margin")


def _at(logits: jax.Array, c: jax.Array) -> jax.Array:
    """``logits[..., c]`` per batch element (``c`` of the batch shape)."""
    return jnp.take_along_axis(logits, jnp.asarray(c)[..., None], axis=-1)[..., 0]


def _other_max(logits: jax.Array, c: jax.Array) -> jax.Array:
    """``max_{j != c} logits[..., j]``."""
    other = jax.nn.one_hot(c, logits.shape[-1], dtype=bool)
    return jnp.max(jnp.where(other, -jnp.inf, logits), axis=-1)


def _sorted_desc(logits: jax.Array) -> jax.Array:
    return -jnp.sort(-logits, axis=-1)


def _dlr_targeted(logits, label, target):
    # with fewer than 4 classes the 4th largest is the smallest (the goal form evaluates this
    # branch for untargeted calls too, where it is discarded)
    s = _sorted_desc(logits)
    k4 = s[..., 3] if logits.shape[-1] >= 4 else s[..., -1]
    return -(_at(logits, label) - _at(logits, target)) / (s[..., 0] - 0.5 * (s[..., 2] + k4) + 1e-12)


# ---------------------------------------------------------------------------------------------
# reference form
# ---------------------------------------------------------------------------------------------


def cross_entropy(logits: jax.Array, label: jax.Array) -> jax.Array:
    """Cross-entropy ``-log softmax(logits)[label]`` (larger = farther from ``label``).

    Args:
      logits: ``[..., C]``.
      label: ``[...]`` int.

    Returns:
      ``[...]``.
    """
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -_at(logp, label)


def dlr(logits: jax.Array, label: jax.Array) -> jax.Array:
    """Untargeted Difference-of-Logits-Ratio (Croce & Hein 2020, eq. 5), larger = more adversarial.

    ``-(z_y - max_{i != y} z_i) / (z_pi1 - z_pi3 + 1e-12)`` with ``z_pi`` sorted descending;
    positive once ``label`` is not the top class.  Needs at least 3 classes.  Shapes as
    :func:`cross_entropy`.

    Raises:
      ValueError: fewer than 3 classes.
    """
    if logits.shape[-1] < 3:
        raise ValueError(f"DLR loss needs at least 3 classes, got {logits.shape[-1]}")
    s = _sorted_desc(logits)
    return -(_at(logits, label) - _other_max(logits, label)) / (s[..., 0] - s[..., 2] + 1e-12)


def dlr_targeted(logits: jax.Array, label: jax.Array, target: jax.Array) -> jax.Array:
    """Targeted DLR (Croce & Hein 2020, eq. 6), larger = more adversarial.

    ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2 + 1e-12)``.  Needs at least 4 classes.

    Args:
      logits: ``[..., C]``.
      label: ``[...]`` int, the label to move away from.
      target: ``[...]`` int, the target class.

    Returns:
      ``[...]``.

    Raises:
      ValueError: fewer than 4 classes.
    """
    if logits.shape[-1] < 4:
        raise ValueError(f"targeted DLR loss needs at least 4 classes, got {logits.shape[-1]}")
    return _dlr_targeted(logits, label, target)


def margin(logits: jax.Array, label: jax.Array) -> jax.Array:
    """Carlini-Wagner margin ``max_{i != y} z_i - z_y`` (positive = ``label`` is not the top
    class); shapes as :func:`cross_entropy`."""
    return _other_max(logits, label) - _at(logits, label)


def member_loss(
    logits: jax.Array, ref: jax.Array, kind: str, targeted: bool, source: jax.Array | None = None
) -> jax.Array:
    """The loss a fixed-budget attack maximises, oriented so that larger = more adversarial.

    Args:
      logits: ``[..., C]`` (the fixed-budget attacks pass ``[M, C]``: one example's members).
      ref: ``[...]`` int: the label to leave (untargeted) or the target (targeted).
      kind: ``"ce"``, ``"dlr"`` or ``"margin"``.
      targeted: whether ``ref`` is a target (then the target's loss is negated; targeted DLR
        is :func:`dlr_targeted`).
      source: ``[...]`` int, the label to leave in targeted DLR (defaults to the current top
        class).

    Returns:
      ``[...]``.
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


def fooled(logits: jax.Array, ref: jax.Array, targeted: bool) -> jax.Array:
    """Success: prediction ``!= ref`` (untargeted) or ``== ref`` (targeted).

    Args:
      logits: ``[..., C]``.
      ref: ``[...]`` int.
      targeted: mode.

    Returns:
      ``[...]`` bool.
    """
    pred = jnp.argmax(logits, axis=-1)
    return pred == ref if targeted else pred != ref


# ---------------------------------------------------------------------------------------------
# goal form (minimum-norm cores: y the true label, t the target or -1)
# ---------------------------------------------------------------------------------------------


def goal_margin(logits: jax.Array, y: jax.Array, t: jax.Array) -> jax.Array:
    """Margin of the goal: positive once it is reached (ties aside).

    Untargeted (``t < 0``): ``max_{j != y} z_j - z_y`` (:func:`margin`); targeted:
    ``z_t - max_{j != t} z_j`` (``-margin(z, t)``).  FMN, ALMA, PDGD, PDPGD, sigma-zero and
    APGD-min's radius estimate read it.

    Args:
      logits: ``[..., C]``.
      y: ``[...]`` int true label.
      t: ``[...]`` int target, ``-1`` = untargeted.

    Returns:
      ``[...]``.
    """
    return jnp.where(t >= 0, -margin(logits, jnp.maximum(t, 0)), margin(logits, y))


def goal_cross_entropy(logits: jax.Array, y: jax.Array, t: jax.Array) -> jax.Array:
    """Cross-entropy of the goal: ``CE(y)`` untargeted, ``-CE(t)`` targeted (DDN, APGD-min-CE).

    Written ``logsumexp(z) - z_y`` (the minimum-norm family's form; :func:`cross_entropy`
    reads ``log_softmax``, equal up to float rounding).  Arguments as :func:`goal_margin`.
    """
    lse = jax.nn.logsumexp(logits, axis=-1)
    tc = jnp.maximum(t, 0)
    return jnp.where(t >= 0, _at(logits, tc) - lse, lse - _at(logits, y))


def goal_dlr(logits: jax.Array, y: jax.Array, t: jax.Array) -> jax.Array:
    """DLR of the goal: :func:`dlr` untargeted, :func:`dlr_targeted` (from ``y`` to ``t``)
    targeted (APGD-min-DLR; Croce & Hein 2020's definitions, needs 3 resp. 4 classes).
    Arguments as :func:`goal_margin`.

    Raises:
      ValueError: fewer than 3 classes.
    """
    return jnp.where(t >= 0, _dlr_targeted(logits, y, jnp.maximum(t, 0)), dlr(logits, y))


def goal_reached(logits: jax.Array, y: jax.Array, t: jax.Array, strict: bool) -> jax.Array:
    """Success in the goal form: prediction ``!= y``; with ``strict`` and ``t >= 0``, ``== t``.

    Args:
      logits, y, t: as :func:`goal_margin`.
      strict: static; whether a targeted run succeeds only at its target (``False``: any
        class other than ``y``, the Frontiers pool's mode).

    Returns:
      ``[...]`` bool.
    """
    pred = jnp.argmax(logits, axis=-1)
    if strict:
        return jnp.where(t >= 0, pred == t, pred != y)
    return pred != y


def value_grad(f: Callable, loss: Callable, x: jax.Array, y: jax.Array, t: jax.Array):
    """A goal loss, its input gradient and the logits of one example (2 queries).

    Args:
      f: ``f(x [*S]) -> [C]``, one member's logits of one example.
      loss: a goal-form loss (``goal_margin``, ``goal_cross_entropy``, ``goal_dlr``).
      x: ``[*S]``.
      y, t: scalar int label and target (``-1``: untargeted).

    Returns:
      ``(value, grad [*S], logits [C])``; non-finite gradient entries are set to 0.
    """

    def obj(z):
        logits = f(z)
        return loss(logits, y, t), logits

    (val, logits), g = jax.value_and_grad(obj, has_aux=True)(x)
    g = jnp.where(jnp.isfinite(g), g, 0.0)
    return val, g, logits


__all__ = [
    "LOSSES",
    "cross_entropy",
    "dlr",
    "dlr_targeted",
    "margin",
    "member_loss",
    "fooled",
    "goal_margin",
    "goal_cross_entropy",
    "goal_dlr",
    "goal_reached",
    "value_grad",
]
