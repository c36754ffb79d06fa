"""The defense zoo's registry: MNIST defenses as data.

:data:`DEFENSES` lists every defense (name, architecture, objective, norm, eps, hyperparameters
and the source of each choice); :func:`get_defense` and :func:`defense_names` look them up;
:func:`arch_of` and :func:`self_ensemble_config` give the model an entry trains.
:mod:`sarjax.defenses.zoo_train` trains the zoo (``sarjax train-defenses``) and
:mod:`sarjax.defenses.zoo_io` saves and loads it (``load_zoo``, ``zoo_pool``, ``save_zoo_pool``,
``sarjax zoo-pool``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sarjax.defenses.self_ensemble import SelfEnsembleConfig
from sarjax.models.zoo import Arch

ARCH_SPECS: dict[str, dict] = {
    "mlp": {"family": "mlp", "widths": (256, 128)},
    "cnn": {"family": "cnn", "widths": (16, 32), "dense": 64, "conv_impl": "fused"},
}
"""The two zoo architectures (:mod:`sarjax.models.zoo`): the MLP 784-256-128-10 and the CNN
conv16-pool-conv32-pool-dense64 (``conv_impl="fused"``: the fastest CPU path for adversarial training)."""


@dataclass(frozen=True)
class Defense:
    """One defense of the zoo.

    Attributes:
      name: unique name (the checkpoint directory).
      arch: ``"mlp"``, ``"cnn"`` (:data:`ARCH_SPECS`) or ``"self-ensemble"``.
      objective: ``"standard"``, ``"pgd-at"``, ``"trades"``, ``"l1-apgd-at"``,
        ``"gaussian-augmentation"``, ``"distillation"`` or ``"self-ensemble"``.
      norm: threat model of the training attack (``"linf"``, ``"l2"``, ``"l1"``), or None.
      eps: training radius, or None.
      hp: other hyperparameters as ``(name, value)`` pairs (``steps``, ``beta``, ``ramp_epochs``,
        ``sigma``, ``inference_sigma``, ``temperature``, ``teacher``, ...).
      seed: init / data-order seed.
      source: where each choice comes from.
    """

    name: str
    arch: str
    objective: str
    norm: str | None = None
    eps: float | None = None
    hp: tuple = ()
    seed: int = 0
    source: str = ""

    def get(self, key: str, default: Any = None) -> Any:
        """A hyperparameter of :attr:`hp` (``default`` when absent)."""
        return dict(self.hp).get(key, default)

    @property
    def stochastic(self) -> bool:
        """Whether the deployed model is randomized (attack it with EOT)."""
        return self.get("inference_sigma") is not None or self.objective == "self-ensemble"

    def spec(self) -> dict:
        """A JSON-able description (in ``zoo.json`` and in the fingerprint)."""
        return {
            "name": self.name,
            "arch": self.arch,
            "objective": self.objective,
            "norm": self.norm,
            "eps": self.eps,
            "hp": {k: list(v) if isinstance(v, tuple) else v for k, v in self.hp},
            "seed": self.seed,
            "source": self.source,
        }


_MADRY = "Madry et al. 2018 (PGD adversarial training; MNIST linf eps 0.3)"
_PGD_STEPS = "10 PGD steps of eps/4 from a random start (sarjax.defenses.pgd_at's default, as Rice et al. 2020)"
_RAMP = "eps ramped linearly: eps/3, 2 eps/3, then eps from epoch 3 (Gowal et al. 2018 ramp eps on MNIST)"

_TRADES = "Zhang et al. 2019 (TRADES, beta 6"


def _adversarial(
    name: str, objective: str, norm: str, eps: float, seed: int, source: str, *, arch: str = "cnn", ramp: int = 3
) -> Defense:
    """A PGD-AT / TRADES / l1-APGD-AT entry: 10 training-attack steps, ``ramp`` ramp epochs (TRADES: beta 6 first)."""
    hp = (("beta", 6.0),) if objective == "trades" else ()
    return Defense(
        name, arch, objective, norm, eps, (*hp, ("steps", 10), ("ramp_epochs", ramp)), seed=seed, source=source
    )


DEFENSES: tuple[Defense, ...] = (
    Defense("standard-mlp", "mlp", "standard", seed=1, source="standard training, cross-entropy (the zoo MLP)"),
    Defense(
        "standard-cnn",
        "cnn",
        "standard",
        seed=2,
        source="standard training, cross-entropy (the zoo CNN); the distillation teacher",
    ),
    _adversarial(
        "pgd-at-linf-0.1",
        "pgd-at",
        "linf",
        0.1,
        3,
        f"{_MADRY}; eps 0.1 as the milder MNIST point; {_PGD_STEPS}; {_RAMP} (shared with eps 0.3)",
    ),
    _adversarial(
        "pgd-at-linf-0.3", "pgd-at", "linf", 0.3, 4, f"{_MADRY}; {_PGD_STEPS} (Madry et al.: 40 steps of 0.01); {_RAMP}"
    ),
    _adversarial(
        "pgd-at-linf-0.1-mlp",
        "pgd-at",
        "linf",
        0.1,
        5,
        f"{_MADRY}; the MLP at eps 0.1 (a second architecture); {_PGD_STEPS}",
        arch="mlp",
        ramp=0,
    ),
    _adversarial(
        "pgd-at-l2-1.5",
        "pgd-at",
        "l2",
        1.5,
        6,
        "Madry et al. 2018 PGD-AT in l2; eps 1.5, the issue's value, below MNIST's l2 evaluation "
        "radius 2.0 (at 2.0 without a ramp this CNN stayed at chance: 10.2% clean); 10 l2 PGD steps of "
        f"eps/4 (normalised gradients); {_RAMP}",
    ),
    _adversarial(
        "l1-apgd-at-10",
        "l1-apgd-at",
        "l1",
        10.0,
        7,
        "Croce & Hein 2021 (Mind the box: adversarial training with l1-APGD, 10 iterations; "
        "CIFAR-10 eps 12); eps 10 = MNIST's standard l1 evaluation radius",
        ramp=0,
    ),
    _adversarial(
        "trades-linf-0.1",
        "trades",
        "linf",
        0.1,
        8,
        f"{_TRADES} = 1/lambda, start x + 0.001 N(0, I)); 10 steps of eps/4; {_RAMP} (shared with eps 0.3)",
    ),
    _adversarial(
        "trades-linf-0.3",
        "trades",
        "linf",
        0.3,
        9,
        f"{_TRADES}; MNIST eps 0.3: 40 steps of 0.01, here 10 of eps/4); {_RAMP}",
    ),
    Defense(
        "gaussian-noise-cnn",
        "cnn",
        "gaussian-augmentation",
        hp=(("sigma", 0.25), ("inference_sigma", 0.25)),
        seed=10,
        source="Cohen et al. 2019 (randomized smoothing's base classifier: trained under N(0, sigma^2) "
        "input noise and classified under the same noise; sigma 0.25 is one of their levels); "
        "randomized at inference (sarjax.attacks.eot.with_input_noise): attack it with EOT",
    ),
    Defense(
        "distilled-cnn",
        "cnn",
        "distillation",
        hp=(("temperature", 20.0), ("teacher", "standard-cnn")),
        seed=11,
        source="Hinton et al. 2015 (soft targets at T = 20, their MNIST setting); student trained at T "
        "and deployed at T = 1 as in Papernot et al. 2016's defensive distillation; teacher standard-cnn",
    ),
    Defense(
        "self-ensemble",
        "self-ensemble",
        "self-ensemble",
        hp=(
            ("resolutions", (28, 14, 7)),
            ("channels", (16, 32, 64)),
            ("jitter", 2),
            ("noise_std", 0.1),
            ("crossmax_k", 2),
        ),
        seed=12,
        source="Fort & Lakshminarayanan 2024 (Ensemble everything everywhere): multi-resolution input "
        "stack, random jitter and noise at train and test time, linear heads on intermediate layers of one "
        "backbone, CrossMax (Algorithm 1; k = 2); scaled to MNIST 28/14/7 (sarjax.defenses.self_ensemble)",
    ),
)
"""Every defense of the zoo, in training order (the distillation teacher before its student)."""


def defense_names() -> list[str]:
    """Names of :data:`DEFENSES`, in order."""
    return [d.name for d in DEFENSES]


def get_defense(name: str) -> Defense:
    """The entry named ``name``. Raises ValueError naming the known ones."""
    for d in DEFENSES:
        if d.name == name:
            return d
    raise ValueError(f"unknown defense {name!r}; the zoo has {defense_names()}")


def arch_of(defense: Defense):
    """The :class:`~sarjax.models.zoo.Arch` of a zoo-architecture defense."""

    if defense.arch not in ARCH_SPECS:
        raise ValueError(f"defense {defense.name!r} has no zoo architecture (arch {defense.arch!r})")
    return Arch(**ARCH_SPECS[defense.arch])


def self_ensemble_config(defense: Defense):
    """The :class:`~sarjax.defenses.self_ensemble.SelfEnsembleConfig` of the self-ensemble entry."""

    keys = ("resolutions", "channels", "jitter", "noise_std", "crossmax_k")
    return SelfEnsembleConfig(**{k: defense.get(k) for k in keys if defense.get(k) is not None})


__all__ = [
    "ARCH_SPECS",
    "DEFENSES",
    "Defense",
    "arch_of",
    "defense_names",
    "get_defense",
    "self_ensemble_config",
]
