"""Shared optimiser steps of the attacks (pure, per example, jit-safe).

:func:`adam` is the Adam moment update with bias correction that PDGD, PDPGD and sigma-zero
take on their perturbation (the PDGD / sigma-zero reference code's ``torch.optim.Adam``
with betas ``(0.9, 0.999)`` and ``eps = 1e-8``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

B1, B2 = 0.9, 0.999  # Adam, as in the PDGD / sigma-zero reference code
EPS = 1e-8


def adam(g: jax.Array, m1: jax.Array, m2: jax.Array, i) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One Adam moment update.

    Args:
      g: ``[*S]`` gradient.
      m1, m2: ``[*S]`` first and second moments (zeros at the start).
      i: 0-based step index (scalar; bias correction uses ``i + 1``).

    Returns:
      ``(m1, m2, num, denom)``: the new moments and the step ``num / denom`` (bias-corrected
      first moment over ``sqrt`` of the bias-corrected second moment plus ``1e-8``); the
      caller scales it by its learning rate.
    """
    m1 = m1 + (1 - B1) * (g - m1)
    m2 = B2 * m2 + (1 - B2) * g * g
    bc1, bc2 = 1 - B1 ** (i + 1), 1 - B2 ** (i + 1)
    denom = jnp.sqrt(m2) / jnp.sqrt(bc2) + EPS
    return m1, m2, m1 / bc1, denom


__all__ = ["adam", "B1", "B2"]
