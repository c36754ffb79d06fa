"""Training the defense zoo (:mod:`sarjax.defenses.zoo`) with sarjax's own loop.

:func:`train_defenses` trains the defenses asked for into a directory
(``sarjax train-defenses``): defenses that share an architecture and an objective train as ONE
vmapped stack (:func:`sarjax.models.train.train_stack`, per-member ``objective_hp``: the two
PGD-AT linf radii, the two TRADES radii, and the standard CNN with the noise-trained CNN, which
is Gaussian augmentation at sigma 0 and 0.25); each defense is saved on its own, a zoo
architecture as a pool checkpoint (:func:`sarjax.models.checkpoint.save_pool`: ``DIR/<name>/``,
loadable by every ``--pool`` command), the self-ensemble as ``DIR/<name>/params.npz`` +
``model.json`` (:func:`sarjax.defenses.zoo_io.save_self_ensemble`) and, in the same directory, as
a pool checkpoint of its :class:`~sarjax.defenses.self_ensemble.SelfEnsembleStack` (noise off;
zoos trained before that: :func:`sarjax.defenses.zoo_io.save_zoo_pool`); ``DIR/zoo.json``
indexes them with each one's fingerprint, clean accuracy and training time. A rerun skips the
defenses whose fingerprint (the entry, the training settings, the data, the teacher, the sarjax
version) is unchanged and refuses the stale ones unless ``overwrite`` is given (as
:mod:`sarjax.runtime.fingerprint` does for runs).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from sarjax.attacks.eot import with_input_noise
from sarjax.data.mnist import load_mnist
from sarjax.defenses import self_ensemble as se
from sarjax.defenses.objectives import pgd_at, trades
from sarjax.defenses.zoo import DEFENSES, Defense, arch_of, defense_names, get_defense, self_ensemble_config
from sarjax.defenses.zoo_io import ZOO_FORMAT, read_zoo_index, save_self_ensemble, write_zoo_index
from sarjax.defenses.zoo_objectives import distillation, gaussian_augmentation, l1_apgd_at
from sarjax.models.checkpoint import load_pool, save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.train import MemberConfig, TrainConfig, TrainMonitor, teacher_targets, train_stack
from sarjax.runtime.fingerprint import array_digest, sarjax_version

N_HEAD = 8  # zoo.json keeps each defense's deterministic logits on the first N_HEAD test images


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


# ----------------------------------------------------------------------------- training


def _eval_acc(fn: Callable, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    preds = [np.asarray(fn(x[i : i + batch], i)).argmax(-1) for i in range(0, len(x), batch)]
    return float((np.concatenate(preds) == y).mean())


def _train_group(members: list[Defense], settings: ZooSettings, x, y, teacher_pool, progress: bool, log):
    """Train one group of zoo-architecture defenses as one stack; returns the stack."""
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
            monitor=TrainMonitor(progress=progress, label=f"{'+'.join(names)} ramp {e}"),
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
        monitor=TrainMonitor(progress=progress, label="+".join(names)),
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
    idx = read_zoo_index(out)
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
        write_zoo_index(out, idx)
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


__all__ = [
    "N_HEAD",
    "QUICK",
    "ZooSettings",
    "fingerprint",
    "group_key",
    "train_defenses",
]
