"""Diversity presets of the SAR paper's vision pools (the SAR paper..., "Vision pools").

- ``low``: one architecture; only the initialisation differs (same data, same order, same
  hyperparameters).
- ``medium``: one architecture; also per-member augmentation strength, data subset and order,
  optimisation (learning rate, weight decay) and regularisation (label smoothing, dropout).
- ``high``: as medium, and the architecture differs too (MLPs, CNNs and residual CNNs with
  different widths and activations: several stacks).

The paper trains M=20 per preset with Adam and early stopping (its Appendix A.3.1, not in the
text we have); the ranges below are ours and documented here.

The high pool's MLP members always train with augmentation strength 1.0 (the other members of
medium and high draw it from {0, 0.5, 1}): on the 4,000 embedded training images an MLP is the
least accurate member (6 ``mlp-256x128-relu`` members, 10 epochs, mean test accuracy: 94.4%
without augmentation, 95.2% with strength 1.0, both at a constant rate; 96.0% with strength 1.0
and ``TrainConfig(lr_schedule="cosine")``), and the paper's high pool is
its MOST accurate (99.2% vs 98.0 / 98.3%), so weak MLPs would confound diversity with accuracy
(issue 19 item 8; README, "The diversity claim").
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sarjax.models import zoo
from sarjax.models.train import MemberConfig
from sarjax.models.zoo import Arch

PRESETS = ("low", "medium", "high")

#: augmentation strength of every MLP member of the high pool (module docstring)
MLP_AUG_STRENGTH = 1.0

#: the single architecture of the low and medium pools
BASE_ARCH = zoo.cnn((8, 16), dense=64)

#: the architectures cycled through by the high-diversity pool
HIGH_ARCHS = (
    zoo.cnn((8, 16), dense=64),
    zoo.mlp((256, 128), act="relu"),
    zoo.cnn((16, 32), dense=64, act="gelu"),
    zoo.resnet((8,), blocks=2, dense=64, act="elu"),
    zoo.mlp((512,), act="tanh"),
    zoo.cnn((12, 24), dense=64, kernel=5, act="swish"),
)


def preset_members(name: str, members: int = 20, seed: int = 0) -> list[tuple[Arch, MemberConfig]]:
    """The (architecture, member config) list of a diversity preset.

    Args:
      name: "low", "medium" or "high".
      members: pool size M (the paper uses 20).
      seed: base seed; member i uses ``seed * 1000 + i``.

    Returns:
      M pairs of (Arch, MemberConfig).
    """
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {name!r}")
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    rng = np.random.default_rng([seed, PRESETS.index(name)])
    out = []
    for i in range(members):
        s = seed * 1000 + i
        if name == "low":
            out.append((BASE_ARCH, MemberConfig(seed=s, data_seed=seed)))
            continue
        cfg = MemberConfig(
            seed=s,
            data_seed=s,
            lr=float(np.exp(rng.uniform(np.log(1e-3), np.log(4e-3)))),
            weight_decay=float(rng.choice([0.0, 1e-4, 5e-4])),
            label_smoothing=float(rng.uniform(0.0, 0.1)),
            dropout=float(rng.uniform(0.0, 0.3)),
            aug_strength=float(rng.choice([0.0, 0.5, 1.0])),
            data_fraction=float(rng.uniform(0.7, 1.0)),
        )
        arch = BASE_ARCH if name == "medium" else HIGH_ARCHS[i % len(HIGH_ARCHS)]
        if arch.family == "mlp":
            cfg = dataclasses.replace(cfg, aug_strength=MLP_AUG_STRENGTH)
        out.append((arch, cfg))
    return out


def preset_names(name: str, members: int) -> list[str]:
    """Member names of a preset: ``low-00`` ... (high: ``high-00-cnn-8x16-relu`` ...)."""
    archs = [a for a, _ in preset_members(name, members)]
    if name == "high":
        return [f"{name}-{i:02d}-{a.name}" for i, a in enumerate(archs)]
    return [f"{name}-{i:02d}" for i in range(members)]
