"""The defense zoo: MNIST defenses as data, trained with sarjax's own loop, saved and loaded back.

:data:`DEFENSES` lists every defense (name, architecture, objective, norm, eps, hyperparameters
and the source of each choice). :func:`train_defenses` trains the ones asked for into a directory
(``sarjax train-defenses``): defenses that share an architecture and an objective train as ONE
vmapped stack (:func:`sarjax.models.train.train_stack`, per-member ``objective_hp``: the two
PGD-AT linf radii, the two TRADES radii, and the standard CNN with the noise-trained CNN, which
is Gaussian augmentation at sigma 0 and 0.25); each defense is saved on its own, a zoo
architecture as a pool checkpoint (:func:`sarjax.models.checkpoint.save_pool`: ``DIR/<name>/``,
loadable by every ``--pool`` command), the self-ensemble as ``DIR/<name>/params.npz`` +
``model.json`` and, in the same directory, as a pool checkpoint of its
:class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack` (noise off; zoos trained before that:
:func:`save_zoo_pool`); ``DIR/zoo.json`` indexes them with each one's fingerprint, clean accuracy and
training time. A rerun skips the defenses whose fingerprint (the entry, the training settings,
the data, the teacher, the sarjax version) is unchanged and refuses the stale ones unless
``overwrite`` is given (as :mod:`sarjax.runtime.fingerprint` does for runs).

:func:`load_zoo` restores them as :class:`ZooModel` (deterministic ``apply``, params, a one-member
:class:`~sarjax.models.pool.Pool`, and the stochastic ``apply(params, x, key)`` of the randomized
defenses for EOT); :func:`zoo_pool` puts defenses (the self-ensemble included) into one Pool and
:func:`save_zoo_pool` saves such a pool for the ``--pool`` commands (``sarjax zoo-pool``).

Eps ramp (``ramp_epochs``): PGD-AT and TRADES at linf 0.3 from scratch on MNIST often stay at
chance for many epochs (measured here: 11.5% clean accuracy after 2 epochs at 0.3); the radius
grows linearly over the first epochs, as in Gowal et al. 2018 (interval bound propagation, MNIST:
eps ramped up linearly) — here epoch ``e < R`` (``R = ramp_epochs``) trains at ``eps * e / R``, one
trainer call per ramp epoch (params carried over, Adam's moments restarted), then the remaining
epochs at ``eps`` in one call. The members of a group share the ramp (the 0.1 member too).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from sarjax.attacks.eot import with_input_noise
from sarjax.data.mnist import load_mnist
from sarjax.defenses import self_ensemble as se
from sarjax.defenses.objectives import pgd_at, trades
from sarjax.defenses.self_ensemble import SelfEnsembleConfig
from sarjax.defenses.zoo_objectives import distillation, gaussian_augmentation, l1_apgd_at
from sarjax.models.checkpoint import PROBE_RTOL, load_pool, probe_batch, save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.stack import leaf_signature
from sarjax.models.train import MemberConfig, TrainConfig, teacher_targets, train_stack
from sarjax.models.zoo import Arch
from sarjax.runtime.fingerprint import array_digest, sarjax_version

ZOO_FORMAT = "sarjax-defense-zoo/1"
ZOO_INDEX = "zoo.json"
SELF_ENSEMBLE_FORMAT = "sarjax-self-ensemble/1"
N_HEAD = 8  # zoo.json keeps each defense's deterministic logits on the first N_HEAD test images

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


@dataclass(frozen=True)
class ZooSettings:
    """Training settings shared by the zoo (part of every fingerprint).

    Attributes:
      epochs: epochs of the zoo-architecture defenses (ramp epochs included).
      self_ensemble_epochs: epochs of the self-ensemble.
      batch_size: batch size per member.
      lr: Adam learning rate (:class:`sarjax.models.train.MemberConfig`'s default).
      train_samples: train on a random subset of N training images (seed 0; None = all).
      attack_steps: override of every training attack's steps (None = each entry's).
    """

    epochs: int = 6
    self_ensemble_epochs: int = 6
    batch_size: int = 64
    lr: float = 2e-3
    train_samples: int | None = None
    attack_steps: int | None = None

    def spec(self) -> dict:
        """A JSON-able description."""
        return dict(self.__dict__)


QUICK = ZooSettings(epochs=1, self_ensemble_epochs=1, batch_size=32, train_samples=256, attack_steps=2)
"""``--quick``: 1 epoch on 256 images, 2-step training attacks (a smoke run, not a defense)."""


@dataclass
class ZooModel:
    """A trained defense restored by :func:`load_zoo`.

    Attributes:
      name: the defense's name.
      defense: its :class:`Defense` entry.
      apply: deterministic ``apply(params, x [B, 28, 28, 1]) -> logits [B, C]`` (the
        self-ensemble's plain views; the noise defense without its noise).
      params: one model's params.
      pool: a one-member :class:`~sarjax.models.pool.Pool` of the deterministic model (a zoo
        architecture's stack, or the self-ensemble's
        :class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack` with its noise off).
      stochastic_apply: ``apply(params, x, key) -> [B, C]``, the defense as deployed, for the
        randomized ones (EOT; ``make_apgd(..., eot=n)``), else None.
      info: its ``zoo.json`` record (clean accuracy, training time, fingerprint).
    """

    name: str
    defense: Defense
    apply: Callable
    params: Any
    pool: Any = None
    stochastic_apply: Callable | None = None
    info: dict = field(default_factory=dict)

    @property
    def stochastic(self) -> bool:
        """Whether the deployed model is randomized."""
        return self.stochastic_apply is not None


# ----------------------------------------------------------------------------- building blocks


def arch_of(defense: Defense):
    """The :class:`~sarjax.models.zoo.Arch` of a zoo-architecture defense."""

    if defense.arch not in ARCH_SPECS:
        raise ValueError(f"defense {defense.name!r} has no zoo architecture (arch {defense.arch!r})")
    return Arch(**ARCH_SPECS[defense.arch])


def self_ensemble_config(defense: Defense):
    """The :class:`~sarjax.defenses.self_ensemble.SelfEnsembleConfig` of the self-ensemble entry."""

    keys = ("resolutions", "channels", "jitter", "noise_std", "crossmax_k")
    return SelfEnsembleConfig(**{k: defense.get(k) for k in keys if defense.get(k) is not None})


def _steps(defense: Defense, settings: ZooSettings) -> int:
    return int(settings.attack_steps or defense.get("steps", 10))


def group_key(defense: Defense, settings: ZooSettings = ZooSettings()) -> tuple:
    """Defenses with equal keys train as one vmapped stack: the architecture, the objective kind
    and its static settings (the standard objective is Gaussian augmentation at sigma 0)."""
    o = defense.objective
    if o in ("standard", "gaussian-augmentation"):
        return (defense.arch, "gaussian-augmentation")
    if o in ("pgd-at", "trades"):
        return (defense.arch, o, defense.norm, _steps(defense, settings), defense.get("ramp_epochs", 0))
    if o == "l1-apgd-at":
        return (defense.arch, o, _steps(defense, settings), defense.get("ramp_epochs", 0))
    if o == "distillation":
        return (defense.arch, o, defense.get("teacher"), defense.get("temperature"))
    return (defense.name,)


def _objective(defense: Defense, settings: ZooSettings):
    """(objective, the member's objective_hp values) of a zoo-architecture defense."""

    o = defense.objective
    if o in ("standard", "gaussian-augmentation"):
        return gaussian_augmentation(), {"sigma": float(defense.get("sigma", 0.0))}
    if o == "pgd-at":
        return pgd_at(eps=float(defense.eps or 0.0), norm=defense.norm, steps=_steps(defense, settings)), {
            "eps": float(defense.eps or 0.0)
        }
    if o == "trades":
        return trades(eps=float(defense.eps or 0.0), norm=defense.norm, steps=_steps(defense, settings)), {
            "eps": float(defense.eps or 0.0),
            "beta": float(defense.get("beta", 6.0)),
        }
    if o == "l1-apgd-at":
        return l1_apgd_at(eps=float(defense.eps or 0.0), n_iter=_steps(defense, settings)), {
            "eps": float(defense.eps or 0.0)
        }
    if o == "distillation":
        return distillation(float(defense.get("temperature"))), {"temperature": float(defense.get("temperature"))}
    raise ValueError(f"defense {defense.name!r}: objective {o!r} is not trained by the zoo trainer")


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(defense: Defense, settings: ZooSettings, data_digest: str, teacher_sha: str | None = None) -> dict:
    """Everything that changes a trained defense: the entry, the settings, the data, the teacher's
    fingerprint (distillation) and the sarjax version."""
    return {
        "format": ZOO_FORMAT,
        "defense": defense.spec(),
        "settings": settings.spec(),
        "data": data_digest,
        "teacher": teacher_sha,
        "sarjax": sarjax_version(),
    }


def _read_index(out: Path) -> dict:
    f = out / ZOO_INDEX
    if not f.is_file():
        return {"format": ZOO_FORMAT, "defenses": {}}
    try:
        idx = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f} is not valid JSON ({e})") from e
    if not isinstance(idx, dict) or idx.get("format") != ZOO_FORMAT or not isinstance(idx.get("defenses"), dict):
        raise ValueError(f"{f} is not a {ZOO_FORMAT} index")
    return idx


def _write_index(out: Path, idx: dict) -> None:
    tmp = out / (ZOO_INDEX + ".tmp")
    tmp.write_text(json.dumps(idx, indent=1))
    tmp.replace(out / ZOO_INDEX)


# ----------------------------------------------------------------------------- self-ensemble files


def _flat(params) -> dict[str, np.ndarray]:
    import jax

    return {jax.tree_util.keystr(p): np.asarray(leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def _params_sha(params) -> str:
    h = hashlib.sha256()
    for k, a in sorted(_flat(params).items()):
        a = np.ascontiguousarray(a)
        h.update(repr((k, a.shape, str(a.dtype))).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_self_ensemble(path: str | os.PathLike, cfg, params, config: dict | None = None) -> Path:
    """Save a self-ensemble: ``params.npz`` (leaves by path), ``model.json`` (config, SHA-256 of the
    params, deterministic logits on the checkpoint probe batch) written last."""
    import jax

    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    np.savez(path / "params.npz", **_flat(params))
    x = probe_batch(cfg.input_shape)
    with jax.default_matmul_precision("highest"):
        probe = np.asarray(jax.jit(lambda p, x: se.apply(cfg, p, x))(params, x), np.float32)
    meta = {
        "format": SELF_ENSEMBLE_FORMAT,
        "model": cfg.spec(),
        "params_sha256": _params_sha(params),
        "probe_logits": probe.tolist(),
        "config": config or {},
    }
    tmp = path / "model.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(path / "model.json")
    return path


def load_self_ensemble(path: str | os.PathLike):
    """Restore :func:`save_self_ensemble`'s files: ``(cfg, params, meta)``, verified.

    Raises:
      ValueError: missing or corrupt files, params whose SHA-256 or probe logits differ.
    """
    import jax
    import jax.numpy as jnp

    path = Path(path).absolute()
    mf = path / "model.json"
    if not mf.is_file() or not (path / "params.npz").is_file():
        raise ValueError(f"self-ensemble checkpoint {path}: needs model.json and params.npz")
    meta = json.loads(mf.read_text())
    if meta.get("format") != SELF_ENSEMBLE_FORMAT:
        raise ValueError(f"self-ensemble checkpoint {path}: not a {SELF_ENSEMBLE_FORMAT} file")
    cfg = se.SelfEnsembleConfig.from_spec(meta["model"])
    abstract = jax.eval_shape(lambda k: se.init(cfg, k), jax.random.key(0))
    with np.load(path / "params.npz") as z:
        stored = {k: z[k] for k in z.files}
    leaves = []
    for p, a in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        k = jax.tree_util.keystr(p)
        if k not in stored or stored[k].shape != a.shape:
            raise ValueError(
                f"self-ensemble checkpoint {path}: params leaf {k} missing or of shape "
                f"{getattr(stored.get(k), 'shape', None)}, the config gives {a.shape}"
            )
        leaves.append(jnp.asarray(stored[k]))
    params = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract), leaves)
    if _params_sha(params) != meta.get("params_sha256"):
        raise ValueError(f"self-ensemble checkpoint {path}: params differ from the saved SHA-256")
    with jax.default_matmul_precision("highest"):
        got = np.asarray(jax.jit(lambda p, x: se.apply(cfg, p, x))(params, probe_batch(cfg.input_shape)))
    want = np.asarray(meta["probe_logits"], np.float32)
    if got.shape != want.shape or np.abs(got - want).max() > PROBE_RTOL * (1 + np.abs(want).max()):
        raise ValueError(f"self-ensemble checkpoint {path}: probe logits differ from the saved ones")
    return cfg, params, meta


# ----------------------------------------------------------------------------- training


def _eval_acc(fn: Callable, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    preds = [np.asarray(fn(x[i : i + batch], i)).argmax(-1) for i in range(0, len(x), batch)]
    return float((np.concatenate(preds) == y).mean())


def _train_group(members: list[Defense], settings: ZooSettings, x, y, teacher_pool, progress: bool, log):
    """Train one group of zoo-architecture defenses as one stack; returns the stack."""
    import jax

    arch = arch_of(members[0])
    objective, _ = _objective(members[0], settings)
    hps = [_objective(d, settings)[1] for d in members]
    hp = {k: np.array([h[k] for h in hps], np.float64) for k in hps[0]}
    cfgs = [MemberConfig(seed=d.seed, data_seed=d.seed, lr=settings.lr) for d in members]
    targets = y
    if members[0].objective == "distillation":
        targets = teacher_targets(teacher_pool, x, temperature=float(members[0].get("temperature")))
    names = [d.name for d in members]
    ramp = int(members[0].get("ramp_epochs", 0) or 0)
    ramp = min(ramp, settings.epochs)
    params = None
    for e in range(1, ramp):  # epochs 1 .. R-1 at eps * e / R, one trainer call each
        frac = e / ramp
        hp_e = {k: (v * frac if k == "eps" else v) for k, v in hp.items()}
        log(f"  ramp epoch {e}/{ramp}: eps {[round(float(v), 4) for v in hp_e['eps']]}")
        stack, _ = train_stack(
            arch,
            cfgs,
            x,
            targets,
            config=TrainConfig(epochs=1, batch_size=settings.batch_size, patience=0),
            init_params=params,
            names=names,
            progress=progress,
            label=f"{'+'.join(names)} ramp {e}",
            objective=objective,
            objective_hp=hp_e,
        )
        params = stack.params
    rest = settings.epochs - max(ramp - 1, 0)
    stack, _ = train_stack(
        arch,
        cfgs,
        x,
        targets,
        config=TrainConfig(epochs=rest, batch_size=settings.batch_size, patience=0),
        init_params=params,
        names=names,
        progress=progress,
        label="+".join(names),
        objective=objective,
        objective_hp=hp,
    )
    jax.block_until_ready(stack.params)
    return stack


def train_defenses(
    out: str | os.PathLike,
    *,
    only: Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    settings: ZooSettings = ZooSettings(),
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Train the zoo's defenses into ``out`` (resumable), save each one and index them in ``zoo.json``.

    Args:
      out: output directory.
      only: names of the defenses to train (default all); a distilled student's teacher is
        trained (or reused) too.
      data_dir: MNIST IDX directory (default: the embedded 5,000 digits, 4,000 train / 1,000 test).
      settings: epochs, batch size, subset (:class:`ZooSettings`; :data:`QUICK` for a smoke run).
      overwrite: retrain defenses whose saved fingerprint differs (else they are refused).
      progress: progress bars.
      log: where progress lines go.

    Returns:
      A summary ``{"out", "settings", "defenses": {name: {"clean_acc", "clean_acc_noisy"
      (randomized ones), "train_time_s", "group", "status": "trained" | "cached"}}, "total_time_s"}``.

    Raises:
      ValueError: an unknown name, or defenses in ``out`` trained with other settings (naming
        them and what differs) without ``overwrite``.
    """
    import jax

    t_start = time.perf_counter()
    names = list(only) if only else defense_names()
    for n in names:
        get_defense(n)
    want = set(names)
    for n in list(names):  # a student's teacher comes first
        t = get_defense(n).get("teacher")
        if t and t not in want:
            want.add(t)
    todo = [d for d in DEFENSES if d.name in want]

    out = Path(out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    idx = _read_index(out)
    data = load_mnist(data_dir)
    x, y = data.x_train, data.y_train
    if settings.train_samples is not None:  # a seeded random subset (the embedded split is sorted by class)
        sub = np.sort(np.random.default_rng(0).permutation(len(x))[: settings.train_samples])
        x, y = x[sub], y[sub]
    digest = array_digest(x, y, data.x_test, data.y_test)

    fps: dict[str, dict] = {}
    for d in todo:  # teachers precede students in DEFENSES
        teacher = d.get("teacher")
        fps[d.name] = fingerprint(d, settings, digest, _sha(fps[teacher]) if teacher else None)
    stale = {}
    for d in todo:
        rec = idx["defenses"].get(d.name)
        if rec is not None and rec.get("fingerprint") != fps[d.name]:
            old = rec.get("fingerprint") or {}
            stale[d.name] = sorted(k for k in fps[d.name] if old.get(k) != fps[d.name][k])
    if stale and not overwrite:
        what = "; ".join(f"{n} ({', '.join(v)})" for n, v in stale.items())
        raise ValueError(
            f"{out} holds defenses trained with other settings: {what}. Retrain them with overwrite "
            f"(--overwrite), or write to another directory"
        )

    def done(d: Defense) -> bool:
        rec = idx["defenses"].get(d.name)
        marker = "model.json" if d.arch == "self-ensemble" else "pool.json"
        return rec is not None and rec.get("fingerprint") == fps[d.name] and (out / d.name / marker).is_file()

    summary: dict[str, Any] = {"out": str(out), "settings": settings.spec(), "data": data.source, "defenses": {}}
    for d in todo:
        if done(d):
            rec = idx["defenses"][d.name]
            summary["defenses"][d.name] = {**_public(rec), "status": "cached"}
            log(f"{d.name}: cached (same fingerprint), clean acc {rec.get('clean_acc')}")

    pending = [d for d in todo if not done(d)]
    groups: dict[tuple, list[Defense]] = {}
    for d in pending:
        groups.setdefault(group_key(d, settings), []).append(d)
    xt, yt = data.x_test, data.y_test

    def record(d: Defense, acc: float, t: float, group: list[str], extra: dict, head: list) -> None:
        rec = {
            "fingerprint": fps[d.name],
            "dir": d.name,
            "defense": d.spec(),
            "clean_acc": acc,
            "train_time_s": t,
            "group": group,
            "stochastic": d.stochastic,
            **extra,
            "test_logits_head": head,
        }
        idx["defenses"][d.name] = rec
        _write_index(out, idx)
        summary["defenses"][d.name] = {**_public(rec), "status": "trained"}
        log(f"{d.name}: clean acc {acc:.3f} ({t:.0f} s)" + "".join(f", {k} {v}" for k, v in extra.items()))

    for key, members in groups.items():
        gnames = [m.name for m in members]
        log(f"training {gnames} (group {key})")
        t0 = time.perf_counter()
        if members[0].arch == "self-ensemble":
            (d,) = members
            cfg = self_ensemble_config(d)
            params, hist = se.train_self_ensemble(
                cfg,
                x,
                y,
                epochs=settings.self_ensemble_epochs,
                batch_size=settings.batch_size,
                lr=settings.lr,
                seed=d.seed,
                progress=progress,
            )
            jax.block_until_ready(params)
            dt = time.perf_counter() - t0
            f_det = jax.jit(lambda xb: se.apply(cfg, params, xb))
            f_rand = jax.jit(lambda xb, k: se.apply(cfg, params, xb, k))
            acc = _eval_acc(lambda xb, i: f_det(xb), xt, yt)
            acc_r = _eval_acc(lambda xb, i: f_rand(xb, jax.random.fold_in(jax.random.key(0), i)), xt, yt)
            save_self_ensemble(out / d.name, cfg, params, {"defense": d.spec(), "train_loss": hist})
            save_pool(  # the same directory as a pool checkpoint (noise off), for the --pool commands
                Pool([se.SelfEnsembleStack(cfg, jax.tree.map(lambda a: a[None], params), (d.name,))]),
                out / d.name,
                config={"defense": d.spec(), "fingerprint_sha256": _sha(fps[d.name]), "clean_acc": acc_r},
            )
            head = np.asarray(f_det(xt[:N_HEAD]), np.float32).tolist()
            record(d, acc_r, dt, gnames, {"clean_acc_deterministic": acc}, head)
            continue
        teacher_pool = None
        if members[0].objective == "distillation":
            teacher_pool, _ = load_pool(out / members[0].get("teacher"))
        stack = _train_group(members, settings, x, y, teacher_pool, progress, log)
        dt = (time.perf_counter() - t0) / len(members)
        for i, d in enumerate(members):
            p_i = jax.tree.map(lambda a, i=i: a[i : i + 1], stack.params)
            pool = Pool([Stack(stack.arch, p_i, (d.name,))])
            arch = stack.arch
            f_det = jax.jit(lambda p, xb, arch=arch: arch.apply(p, xb))
            p1 = jax.tree.map(lambda a: a[0], p_i)
            acc = _eval_acc(lambda xb, i: f_det(p1, xb), xt, yt)
            extra = {}
            if d.get("inference_sigma") is not None:
                noisy = jax.jit(with_input_noise(arch.apply, float(d.get("inference_sigma"))))
                extra["clean_acc_deterministic"] = acc
                acc = _eval_acc(lambda xb, i: noisy(p1, xb, jax.random.fold_in(jax.random.key(0), i)), xt, yt)
            save_pool(
                pool,
                out / d.name,
                config={"defense": d.spec(), "fingerprint_sha256": _sha(fps[d.name]), "clean_acc": acc},
            )
            record(d, acc, dt, gnames, extra, np.asarray(f_det(p1, xt[:N_HEAD]), np.float32).tolist())
    summary["total_time_s"] = time.perf_counter() - t_start
    return summary


def _public(rec: dict) -> dict:
    keep = ("clean_acc", "clean_acc_deterministic", "train_time_s", "group", "stochastic")
    return {k: rec[k] for k in keep if k in rec}


# ----------------------------------------------------------------------------- loading


def load_zoo(path: str | os.PathLike, names: Sequence[str] | None = None) -> dict[str, ZooModel]:
    """Restore the defenses indexed in ``path/zoo.json`` (all, or ``names``), each verified.

    Returns:
      ``{name: ZooModel}`` in the zoo's order. Zoo architectures come with a one-member ``pool``;
      the randomized defenses (Gaussian noise at inference, the self-ensemble's stochastic views)
      with ``stochastic_apply(params, x, key)`` for EOT.

    Raises:
      ValueError: no index, an unknown or untrained name, or a checkpoint that fails verification.
    """

    path = Path(path).absolute()
    if not (path / ZOO_INDEX).is_file():
        raise ValueError(f"{path} has no {ZOO_INDEX} (train it with `sarjax train-defenses --out {path}`)")
    idx = _read_index(path)
    avail = [n for n in defense_names() if n in idx["defenses"]]
    names = list(names) if names is not None else avail
    missing = [n for n in names if n not in idx["defenses"]]
    if missing:
        raise ValueError(f"{path}: defenses {missing} are not trained there (trained: {avail})")
    out: dict[str, ZooModel] = {}
    for n in names:
        rec = idx["defenses"][n]
        d = get_defense(n)
        spec = rec.get("defense", {})
        if spec and spec != d.spec():
            d = replace(d, hp=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in spec.get("hp", {}).items()))
        if d.arch == "self-ensemble":
            cfg, params, _ = load_self_ensemble(path / rec["dir"])
            import jax

            stack = se.SelfEnsembleStack(cfg, jax.tree.map(lambda a: a[None], params), (n,))
            out[n] = ZooModel(n, d, stack.member_apply, params, Pool([stack]), stack.member_stochastic_apply, rec)
            continue
        pool, _ = load_pool(path / rec["dir"])
        stack = pool.stacks[0]
        import jax

        params = jax.tree.map(lambda a: a[0], stack.params)
        sigma = d.get("inference_sigma")
        rand = with_input_noise(stack.arch.apply, float(sigma)) if sigma is not None else None
        out[n] = ZooModel(n, d, stack.arch.apply, params, pool, rand, rec)
    return out


def zoo_pool(models: dict[str, ZooModel], names: Sequence[str] | None = None):
    """One :class:`~sarjax.models.pool.Pool` of zoo defenses, each in its deterministic form.

    Args:
      models: what :func:`load_zoo` returned.
      names: the members, in order (default: every model of ``models``). The zoo architectures
        (the Gaussian-noise CNN without its noise) and the self-ensemble (a
        :class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack`, noise off; its deployed form for
        EOT: :func:`~sarjax.defenses.self_ensemble.pool_stochastic_apply` of the pool) all go in.

    Returns:
      The pool; members of one architecture share a stack (stacks in order of first appearance,
      so ``pool.names`` may reorder ``names`` across stacks, as :meth:`Pool.from_members`).

    Raises:
      ValueError: a name that ``models`` lacks, or a model without a pool.
    """

    names = list(names) if names is not None else list(models)
    missing = [n for n in names if n not in models]
    if missing:
        raise ValueError(f"{missing} are not among the loaded models {list(models)}")
    bad = [n for n in names if models[n].pool is None]
    if bad:
        raise ValueError(f"{bad} have no pool; use their apply / stochastic_apply")
    groups: dict[tuple, list[str]] = {}  # members of one stack kind, architecture and params layout
    for n in names:
        groups.setdefault(_stack_key(models[n].pool.stacks[0]), []).append(n)
    stacks = []
    for run in groups.values():
        first = models[run[0]].pool.stacks[0]
        params = [models[n].pool.stacks[0].params for n in run]
        stacks.append(first if len(run) == 1 else first.with_params(_stack_params(params), run))
    return Pool(stacks)


def _stack_key(stack) -> tuple:

    return (stack.kind, json.dumps(stack.spec(), sort_keys=True), leaf_signature(stack.member(0)))


def _stack_params(params: list):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *params)


def save_zoo_pool(zoo_dir: str | os.PathLike, out: str | os.PathLike, names: Sequence[str] | None = None) -> Path:
    """Save zoo defenses as ONE pool checkpoint (``sarjax zoo-pool``), loadable by every ``--pool`` command.

    Args:
      zoo_dir: a directory trained by :func:`train_defenses`.
      out: the pool directory to write (:func:`sarjax.models.checkpoint.save_pool`; it must not be
        inside ``zoo_dir``'s defense directories).
      names: the defenses (default: every trained one), each in its deterministic form
        (:func:`zoo_pool`).

    Returns:
      The pool directory. Its config records, per member, the defense entry, whether the
      deployed model is randomized (attack those with EOT) and the zoo's clean accuracy.

    Raises:
      ValueError: as :func:`load_zoo` and :func:`zoo_pool`.
    """

    models = load_zoo(zoo_dir, names)
    pool = zoo_pool(models, names)
    config = {
        "zoo": str(Path(zoo_dir).absolute()),
        "members": {
            n: {
                "defense": m.defense.spec(),
                "stochastic": m.stochastic,
                "clean_acc": m.info.get("clean_acc"),
                "clean_acc_deterministic": m.info.get("clean_acc_deterministic"),
            }
            for n, m in models.items()
        },
    }
    return save_pool(pool, out, config=config)


__all__ = [
    "ARCH_SPECS",
    "DEFENSES",
    "QUICK",
    "Defense",
    "ZooModel",
    "ZooSettings",
    "arch_of",
    "defense_names",
    "fingerprint",
    "get_defense",
    "group_key",
    "load_self_ensemble",
    "load_zoo",
    "save_self_ensemble",
    "save_zoo_pool",
    "self_ensemble_config",
    "train_defenses",
    "zoo_pool",
]
