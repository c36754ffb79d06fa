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
    "l0": 0.0, "linf": math.inf, "l1": 1.0, "l2": 2.0, "inf": math.inf,
    "infinity": math.inf, "0": 0.0, "1": 1.0, "2": 2.0,
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
            raise ValueError(
                f"norm must be one of 0, 1, 2, inf or 'l0', 'l1', 'l2', 'linf'; got {p!r}")
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
        (images in [0, 1], DESIGN.md "Conventions").
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
