"""Stochastic models for Expectation over Transformation (EOT) attacks.

The gradient attacks and APGD take ``eot=n`` for a stochastic ``apply(params, x, key)``
(docs/attacks.md, "Expectation over Transformation").  This module builds such an ``apply``
from a deterministic one.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def with_input_noise(apply: Callable, sigma: float, *, box=(0.0, 1.0), clip: bool = True) -> Callable:
    """``apply`` behind Gaussian input noise: ``apply(params, x + sigma * N(0, I), key)``.

    The randomized defense of noise at inference (as in randomized smoothing, Cohen et al. 2019,
    which classifies under ``N(0, sigma^2 I)`` input noise); attack it with ``eot > 1``.  The
    noise is drawn per sample and element from ``key``.

    Args:
      apply: deterministic ``apply(params, x) -> logits``.
      sigma: noise standard deviation, >= 0.
      box: input bounds; with ``clip`` the noisy input is clipped to them (images stay images).
      clip: whether to clip the noisy input to ``box``.

    Returns:
      ``apply(params, x, key) -> logits``.

    Raises:
      ValueError: if ``sigma`` is negative or not finite.
    """
    sigma = float(sigma)
    if not sigma >= 0.0 or sigma == float("inf"):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    lo, hi = float(box[0]), float(box[1])

    def noisy(params, x, key):
        z = x + sigma * jax.random.normal(key, x.shape, x.dtype)
        return apply(params, jnp.clip(z, lo, hi) if clip else z)

    return noisy
