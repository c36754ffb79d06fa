"""Threat models: which perturbations an attack may use.

A :class:`Threat` is plain data (a frozen dataclass): the norm ``p`` of the
perturbation ball, its radius ``eps`` (scalar or one per sample) and the box
the input must stay in.  Every attack result is audited against a Threat
(:mod:`sarjax.attacks.audit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

_NORM_ALIASES = {
    "l0": 0.0,
    "linf": math.inf,
    "l1": 1.0,
    "l2": 2.0,
    "inf": math.inf,
    "infinity": math.inf,
    "0": 0.0,
    "1": 1.0,
    "2": 2.0,
}


def canonical_norm(p: Any) -> float:
    """Returns the norm exponent as one of ``0.0, 1.0, 2.0, inf``.

    Args:
      p: ``0, 1, 2, jnp.inf`` (int or float) or a string such as ``"linf"``,
        ``"l2"``, ``"L1"``, ``"l0"``, ``"inf"``.

    Returns:
      The exponent as a Python float.

    Raises:
      ValueError: if ``p`` names no supported norm.
      TypeError: if ``p`` is neither a number nor a string.
    """
    if isinstance(p, str):
        key = p.strip().lower()
        if key not in _NORM_ALIASES:
            raise ValueError(f"norm must be one of 0, 1, 2, inf or 'l0', 'l1', 'l2', 'linf'; got {p!r}")
        return _NORM_ALIASES[key]
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"norm must be a number or a string, got {type(p).__name__}: {p!r}")
    p = float(p)
    if p not in (0.0, 1.0, 2.0, math.inf):
        raise ValueError(f"norm must be one of 0, 1, 2, inf; got {p!r}")
    return p


def norm_name(p: float) -> str:
    """Returns ``"l0"``, ``"l1"``, ``"l2"`` or ``"linf"`` for a canonical exponent."""
    p = canonical_norm(p)
    return "linf" if p == math.inf else f"l{int(p)}"


@dataclass(frozen=True)
class Threat:
    """A perturbation set ``{x : ||x - x0||_p <= eps} ∩ [box]``.

    Attributes:
      norm: ``0, 1, 2`` or ``inf`` (strings like ``"linf"`` are accepted and
        converted).  For ``norm=0`` the radius counts perturbed elements.
      eps: radius, a non-negative scalar or a per-sample array ``[B]``.
      box: ``(low, high)`` bounds of every input element; default ``(0, 1)``
        (images in [0, 1], docs/design.md "Conventions").
    """

    norm: float
    eps: Any
    box: tuple[float, float] = (0.0, 1.0)

    def __post_init__(self):
        object.__setattr__(self, "norm", canonical_norm(self.norm))
        eps = self.eps
        if isinstance(eps, (int, float, np.integer, np.floating)) and not isinstance(eps, bool):
            if not math.isfinite(float(eps)) or float(eps) < 0:
                raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
            object.__setattr__(self, "eps", float(eps))
        else:
            try:
                arr = np.asarray(eps, dtype=np.float64)
            except (TypeError, ValueError) as e:
                raise TypeError(f"eps must be a number or an array [B], got {type(eps).__name__}") from e
            if arr.ndim > 1:
                raise ValueError(f"eps must be a scalar or shape [B], got shape {arr.shape}")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"eps must be finite and >= 0, got min {arr.min() if arr.size else None}")
            object.__setattr__(self, "eps", float(arr) if arr.ndim == 0 else arr.astype(np.float32))
        box = tuple(float(b) for b in self.box)
        if len(box) != 2 or not box[0] < box[1]:
            raise ValueError(f"box must be (low, high) with low < high, got {self.box!r}")
        object.__setattr__(self, "box", box)

    @property
    def name(self) -> str:
        """``"l0"``, ``"l1"``, ``"l2"`` or ``"linf"``."""
        return norm_name(self.norm)

    def eps_for(self, batch: int) -> jnp.ndarray:
        """Returns eps broadcast to ``[batch]`` float32.

        Raises:
          ValueError: if a per-sample eps does not have ``batch`` entries.
        """
        e = jnp.asarray(self.eps, jnp.float32)
        if e.ndim == 1 and e.shape[0] != batch:
            raise ValueError(f"per-sample eps has {e.shape[0]} entries, batch has {batch}")
        return jnp.broadcast_to(e, (batch,))


def check_labels(labels, num_classes: int, *, name: str = "labels", untargeted: int | None = None) -> np.ndarray:
    """Raises unless every label is a class of the model: ``0 <= label < num_classes``.

    The one label/target range check of sarjax: every public attack entry that takes labels,
    reference predictions or targets calls it on the host before running (an out-of-range label
    makes the cross-entropy NaN and every member "fooled" at ``x0``).

    Args:
      labels: ``[B]`` or ``[B, M]`` int labels; the first axis is the sample axis named in the
        error (pass ``[K, B]`` per-member labels transposed).
      num_classes: ``C``, the size of the logits' last axis.
      name: what the values are, for the message (``"labels"``, ``"targets"``, ``"ref"``).
      untargeted: a sentinel value that is also allowed (minimum-norm targets use ``-1`` for
        "untargeted"); ``None``: none.

    Returns:
      The labels as a numpy array (unchanged).

    Raises:
      TypeError: if the labels are not integers.
      ValueError: ``"labels out of range [0, C=10): samples [0, 1, 3] have [10, 99, -3]"``, naming
        the samples (first axis) and, per sample, the first offending value (up to 10 samples).
    """
    a = np.asarray(labels)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be integer class indices, got dtype {a.dtype}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    bad = (a < 0) | (a >= num_classes)
    if untargeted is not None:
        bad &= a != untargeted
    if not bad.any():
        return a
    rows = bad.reshape(a.shape[0], -1) if a.ndim else bad.reshape(1, 1)
    vals = a.reshape(rows.shape)
    samples = np.flatnonzero(rows.any(axis=1))
    first = [int(vals[s][np.argmax(rows[s])]) for s in samples[:10]]
    more = f" (and {samples.size - 10} more samples)" if samples.size > 10 else ""
    allowed = "" if untargeted is None else f" or {untargeted}"
    raise ValueError(
        f"{name} out of range [0, C={int(num_classes)}){allowed}: samples {samples[:10].tolist()} have {first}{more}"
    )
