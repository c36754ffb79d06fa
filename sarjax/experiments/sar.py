"""``sarjax sar``'s engine: SAR of a pool (joint PGD greedy plus the per-member attacks) and SAR
of a saved pool on test images or the user's images, with its resumable, fingerprinted output.

:func:`evaluate_pool` is the measurement both ``sarjax sar`` (:func:`run_sar_on_saved_pool`) and
``sarjax demo`` (:func:`sarjax.experiments.demo.run_demo`) run on each pool: the SAR of the SAR
paper (joint PGD of its Table 1, the safe region = each member's own clean prediction) and each
member's ASR under the same PGD. :func:`pool_record` turns its result into a ``results.json``
entry; :func:`open_output` checks a command's output directory against the run's fingerprint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np

from sarjax.attacks.members import attack_members
from sarjax.attacks.pgd import PGDStep, make_pgd
from sarjax.cover.metrics import asr as asr_metric
from sarjax.cover.plots import plot_sar
from sarjax.cover.result import SARResult, rederive
from sarjax.data.cifar import cifar_kind, load_cifar
from sarjax.data.images import load_images
from sarjax.data.mnist import Split, load_mnist
from sarjax.models.builders import load_model
from sarjax.models.checkpoint import load_pool
from sarjax.models.pool import Pool
from sarjax.models.sharding import ShardedPool, make_mesh
from sarjax.models.zoo import CONV_IMPLS
from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.distributed import process_checkpoint_dir
from sarjax.runtime.provenance import provenance
from sarjax.sar import distributed
from sarjax.sar.settings import SARSettings
from sarjax.sar.vision import default_sar_attack, run_sar


def _is_int(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


def _check_flags(owner: str, obj: Any, names: Sequence[str]) -> None:
    for name in names:
        v = getattr(obj, name)
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{owner}.{name} must be a bool, got {type(v).__name__} {v!r}")


def _check_budget(owner: str, steps: Any, restarts: Any) -> None:
    for name, v in (("steps", steps), ("restarts", restarts)):
        if not _is_int(v) or v < 1:
            raise ValueError(f"{owner}.{name} must be an int >= 1, got {v!r}")


@dataclass(frozen=True)
class PoolSARSettings:
    """How :func:`evaluate_pool` attacks and runs (the images, the key and the joint attack entry
    are its arguments).

    Attributes:
      steps: PGD steps per restart of the per-member attacks and of the default joint attack (the
        SAR paper Table 1: 40), an int ``>= 1``.
      restarts: PGD random restarts of both (Table 1: 3), an int ``>= 1``.
      progress: show the greedy's progress bar (default True).
      checkpoint_dir: where the greedy checkpoints every round and resumes from (default None: no
        checkpoint; :class:`sarjax.sar.settings.SARSettings`); under JAX's distributed runtime
        each process uses ``checkpoint_dir/process_<i>_of_<n>``.
      overwrite: discard an earlier run's checkpoint in ``checkpoint_dir`` (default False).

    Raises:
      ValueError: ``steps`` or ``restarts`` not an int ``>= 1``.
      TypeError: a flag that is not a bool; ``checkpoint_dir`` not None, a str or a path.
    """

    steps: int = 40
    restarts: int = 3
    progress: bool = True
    checkpoint_dir: str | os.PathLike | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        _check_budget("PoolSARSettings", self.steps, self.restarts)
        _check_flags("PoolSARSettings", self, ("progress", "overwrite"))
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, (str, os.PathLike)):
            raise TypeError(
                f"PoolSARSettings.checkpoint_dir must be None, a str or a path, got {type(self.checkpoint_dir).__name__}"
            )


@dataclass(frozen=True)
class SavedPoolSARSettings:
    """How :func:`run_sar_on_saved_pool` (``sarjax sar``) attacks and runs (the pool, the images,
    eps, delta and OUT are its arguments).

    Attributes:
      steps: PGD steps per restart (the SAR paper Table 1: 40), an int ``>= 1`` (``--steps``).
      restarts: PGD random restarts (Table 1: 3), an int ``>= 1`` (``--restarts``).
      seed: the attacks' key is ``jax.random.key(seed)``, an int (``--seed``).
      progress: show the greedy's progress bar (default True).
      conv_impl: re-wrap the pool's convolutional stacks to this formulation before the attack
        (one of :data:`sarjax.models.zoo.CONV_IMPLS`; ``"fused"`` is the fastest joint attack on
        CPU; :meth:`Pool.with_conv_impl`); None (default) keeps the saved one (``--conv-impl``).
      overwrite: delete OUT's results, checkpoint and fingerprint first (``--overwrite``).
      devices: ``(P, D)``: shard the pool over a ``P x D`` mesh of this process's devices
        (:class:`sarjax.models.sharding.ShardedPool`; ``--devices pool=P,data=D``), or None
        (default: one device).

    Raises:
      ValueError: ``steps`` or ``restarts`` not an int ``>= 1``, ``seed`` not an int, an unknown
        ``conv_impl``, ``devices`` not None or two ints ``>= 1``.
      TypeError: a flag that is not a bool.
    """

    steps: int = 40
    restarts: int = 3
    seed: int = 0
    progress: bool = True
    conv_impl: str | None = None
    overwrite: bool = False
    devices: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        _check_budget("SavedPoolSARSettings", self.steps, self.restarts)
        if not _is_int(self.seed):
            raise ValueError(f"SavedPoolSARSettings.seed must be an int, got {self.seed!r}")
        _check_flags("SavedPoolSARSettings", self, ("progress", "overwrite"))
        if self.conv_impl is not None and self.conv_impl not in CONV_IMPLS:
            raise ValueError(
                f"SavedPoolSARSettings.conv_impl must be None or one of {CONV_IMPLS}, got {self.conv_impl!r}"
            )
        d = self.devices
        if d is not None:
            if not isinstance(d, (tuple, list)) or len(d) != 2 or not all(_is_int(v) and v >= 1 for v in d):
                raise ValueError(f"SavedPoolSARSettings.devices must be None or (P, D), two ints >= 1, got {d!r}")
            object.__setattr__(self, "devices", (int(d[0]), int(d[1])))


OUT_HINT = "pass --overwrite to discard it or choose another --out"


def validate_sar_args(eps: float, deltas: Sequence[float]) -> None:
    """Raise ValueError for an eps that is not a finite float > 0 (inf, nan, <= 0) or a delta
    outside [0, 1)."""
    if not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite float > 0, got {eps}")
    for d in deltas:
        if not 0.0 <= d < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {d}")


def check_samples(samples: int, data: Split) -> None:
    """Raise ValueError unless ``1 <= samples <= `` the test images available in ``data``."""
    n = len(data.x_test)
    if samples < 1 or samples > n:
        raise ValueError(f"samples must be in [1, {n}] (the test images in {data.source}), got {samples}")


def open_output(
    out: Path, fingerprint: dict[str, Any], overwrite: bool, owned: Sequence[str], allow: Sequence[str] = ()
) -> dict[str, Any] | None:
    """Check (or write) ``out/fingerprint.json`` before a command reads or writes results there.

    Args:
      out: the command's output directory (created).
      fingerprint: this run's settings (:mod:`sarjax.runtime.fingerprint`).
      overwrite: first delete ``owned`` (the command's own files and folders, glob patterns).
      owned: what the command writes under ``out``; nothing else is ever deleted.
      allow: fingerprint fields the caller handles itself when they differ.

    Returns:
      The stored fingerprint, or None when ``out`` held no run (then this run's is written).

    Raises:
      ValueError: ``out`` holds a run with other settings (naming each) or results without a
        fingerprint; the message says ``--overwrite`` or another ``--out``.
    """
    if overwrite and out.is_dir():
        removed = fingerprints.remove_paths(out, owned)
        if removed:
            print(f"--overwrite: removed {', '.join(sorted(p.name for p in removed))} from {out}")
    out.mkdir(parents=True, exist_ok=True)
    holds = any(any(out.glob(n)) for n in owned if n != fingerprints.FINGERPRINT_FILE)
    stored = fingerprints.check_fingerprint(out, fingerprint, hint=OUT_HINT, holds_results=holds, allow=allow)
    if stored is None:
        fingerprints.write_fingerprint(out, fingerprint)
    return stored


def evaluate_pool(
    pool: Pool | ShardedPool,
    x: np.ndarray,
    eps: float,
    deltas: Sequence[float],
    *,
    key: jax.Array,
    attack: Callable | None = None,
    sample_ids: np.ndarray | None = None,
    settings: PoolSARSettings | None = None,
    clock: Callable[[str, str], AbstractContextManager[Any]] | None = None,
    label: str = "",
) -> tuple[SARResult, np.ndarray]:
    """SAR (joint PGD greedy) and per-member ASR (the same PGD on each member alone).

    The per-member attacks (linf PGD, ``settings.steps`` steps of ``eps/16``,
    ``settings.restarts`` restarts, each member against its own clean prediction) double as
    Algorithm 1's single-member fallback (looked up, not rerun).

    ``pool`` may be a :class:`sarjax.models.sharding.ShardedPool`. Under JAX's distributed
    runtime (``jax.process_count() > 1``) each process attacks its block of the samples
    (:func:`sarjax.runtime.distributed.process_rows`, checkpoints under
    ``checkpoint_dir/process_<i>_of_<n>``) and every process gets the gathered result; sample
    ids are the rows of ``x``, so the result is the one-process result.

    Args:
      pool: the pool (a :class:`~sarjax.models.pool.Pool` or a ``ShardedPool``), ``M`` members.
      x: ``[B, *input_shape]`` images in ``[0, 1]``.
      eps: linf radius, a finite float ``> 0``.
      deltas: the allowed uncovered shares, each in ``[0, 1)``.
      key: the run's PRNG key (the per-member attacks use ``fold_in(key, 1)``, the greedy
        ``fold_in(key, 2)``).
      attack: the joint attack entry of the greedy (default
        :func:`sarjax.sar.vision.default_sar_attack` with ``settings.steps`` and
        ``settings.restarts``). Pass one built once per pool (e.g. ``make_joint_pgd(pool.apply,
        steps=..., restarts=...)``) to reuse its compiled kernel across several eps (eps is a
        traced argument); the per-member kernel is memoised by
        :func:`sarjax.attacks.members.attack_members` already.
      sample_ids: ``[B]`` the ids that seed each image's random streams (default ``0 .. B-1``;
        :mod:`sarjax.data.images`).
      settings: the PGD budget, the progress bar and the checkpoint (:class:`PoolSARSettings`;
        default: Table 1's 40 steps x 3 restarts, no checkpoint).
      clock: optional ``clock(phase, label)`` context manager (e.g.
        :class:`sarjax.experiments.demo.PhaseClock`) timing the per-member attacks (phase
        ``"member attacks"``) and the greedy (``"greedy rounds"``) under ``label``.
      label: the clock's label for this pool.

    Returns:
      (SAR result, per-member ASR [M]).

    Raises:
      TypeError: ``settings`` not None or a :class:`PoolSARSettings`.
      ValueError: eps not a finite float ``> 0``, a delta outside ``[0, 1)``.
    """

    st = PoolSARSettings() if settings is None else settings
    if not isinstance(st, PoolSARSettings):
        raise TypeError(f"settings must be None or a PoolSARSettings, got {type(st).__name__}")
    steps, restarts = st.steps, st.restarts
    validate_sar_args(eps, deltas)
    rows = distributed.process_rows(len(x))  # all of them in one process
    x = np.asarray(x)[rows]
    ids = rows if sample_ids is None else np.asarray(sample_ids)[rows]
    clean = pool.predict(x)  # [M, B]
    members = (
        partial(pool.attack_members, attack_members) if isinstance(pool, ShardedPool) else partial(attack_members, pool)
    )
    timed = clock if clock is not None else (lambda phase, label: nullcontext())
    with timed("member attacks", label):
        single = _block(
            members(
                make_pgd,
                x,
                clean.T,
                key=jax.random.fold_in(key, 1),
                eps=eps,
                norm="linf",
                steps=steps,
                step=PGDStep(restarts=restarts, rel_step=1.0 / 16),
                sample_ids=ids,
            )
        )
    with timed("greedy rounds", label):
        result = run_sar(
            pool,
            x,
            eps,
            deltas,
            key=jax.random.fold_in(key, 2),
            attack=attack if attack is not None else default_sar_attack(pool, steps=steps, restarts=restarts),
            member_attacks=(np.swapaxes(np.asarray(single.x_adv), 0, 1), np.asarray(single.queries).T),  # [M, B]
            sample_ids=ids,
            settings=SARSettings(
                progress=st.progress, checkpoint_dir=process_checkpoint_dir(st.checkpoint_dir), overwrite=st.overwrite
            ),
        )
    result, per_sample = distributed.allgather_parts(result, {"member_success": np.asarray(single.success)})
    return result, asr_metric(per_sample["member_success"])


def _block(res: Any) -> Any:
    """``res`` once its arrays are computed (so that a clock around the call measures the work)."""
    return jax.block_until_ready(res)


def khat_histogram(result: SARResult, j: int) -> dict[str, int]:
    """{k: count} of k_hat over valid samples for delta index j ("SAR=1" for unreached)."""
    v = result.valid
    reached = result.reached[v, j]
    ks = result.k_hat[v, j][reached]
    hist = {str(int(k)): int((ks == k).sum()) for k in np.unique(ks)}
    if (~reached).any():
        hist["SAR=1"] = int((~reached).sum())
    return hist


def pool_record(pool: Pool, acc: np.ndarray, member_asr: np.ndarray, result: SARResult) -> dict[str, Any]:
    """One pool's results.json entry; every per-coverage dict is keyed by ``f"{1 - delta:g}"``.

    ``sar`` (mean SAR, kept for older readers), ``sar_se`` (its standard error over the valid
    samples), ``sar_singleton`` / ``sar_singleton_se`` (singleton-completed SAR, the SAR paper
    Figures 7-8, docs/cover.md) and ``singleton_unbreakable_share`` (the part of it resting on
    members the single-model attack could not break). A standard error is None for one sample.
    """
    keys = [f"{c:g}" for c in 1.0 - np.asarray(result.deltas)]
    stats = result.sar_stats()
    sar = {k: st["mean_sar"] for k, st in zip(keys, stats)}
    return {
        "members": pool.num_members,
        "names": list(pool.names),
        "accuracy": float(acc.mean()),
        "member_accuracy": acc.tolist(),
        "asr": float(member_asr.mean()),
        "member_asr": member_asr.tolist(),
        "sar": sar,
        "sar_se": {k: st["se_sar"] for k, st in zip(keys, stats)},
        "sar_singleton": {k: st["mean_sar_singleton"] for k, st in zip(keys, stats)},
        "sar_singleton_se": {k: st["se_sar_singleton"] for k, st in zip(keys, stats)},
        "singleton_unbreakable_share": {k: st["mean_singleton_unbreakable_share"] for k, st in zip(keys, stats)},
        "num_samples": int(result.valid.sum()),
        "k_hat_histogram": {f"{1 - d:g}": khat_histogram(result, j) for j, d in enumerate(result.deltas)},
        "share_fallback": float(result.fallback_fired[result.valid].mean()),
        "mean_queries_per_sample": float(result.queries[result.valid].mean()),
        "summary": result.summary(),
    }


SAR_OUTPUTS = (fingerprints.FINGERPRINT_FILE, "results.json", "sar", "sar.png", "checkpoint")
# recorded in ``sarjax sar``'s fingerprint but not compared: the data's source names a path, and the
# same images under another path are the same run (their content digests are compared)
SAR_INFO_FIELDS = ("data",)


def _open_sar_output(outp: Path, fingerprint: dict[str, Any], overwrite: bool, delta: float) -> None:
    """``sarjax sar``'s output check: the fingerprint, and another delta only off a finished run."""
    stored = open_output(outp, fingerprint, overwrite, SAR_OUTPUTS, allow=("delta", *SAR_INFO_FIELDS))
    if stored is not None and stored["delta"] != float(delta):  # read it off the finished run, or stop here
        if not ((outp / "results.json").exists() and (outp / "sar" / "result.json").exists()):
            raise ValueError(
                f"{fingerprints.mismatch_reason(outp, stored, fingerprint, ['delta'])}, and another delta is "
                f"read off a finished run only (rerun with --delta {stored['delta']:g} to finish it "
                f"first); {OUT_HINT}"
            )
        try:
            rederive(SARResult.load(outp / "sar"), [delta])
        except ValueError as e:
            raise ValueError(f"{outp}: {e}; {OUT_HINT}") from None
        print(f"{outp}: delta={delta:g} read off the finished run at delta={stored['delta']:g} (same coverage order)")


def _load_data(data_dir: str | None) -> Split:
    """The embedded MNIST, an MNIST IDX directory, or CIFAR-10 / CIFAR-100 python batches."""

    if data_dir is not None and cifar_kind(data_dir) is not None:
        return load_cifar(data_dir)
    return load_mnist(data_dir)


SAR_DEFAULT_SAMPLES = 100  # ``sarjax sar`` on MNIST / CIFAR test images without --samples


def sar_samples(samples: int | None, file_images: int | None) -> int:
    """The images ``sarjax sar`` attacks: ``samples`` when given, else every image of an
    ``--images`` file (``file_images`` of them) or :data:`SAR_DEFAULT_SAMPLES` test images."""
    if samples is not None:
        return samples
    return SAR_DEFAULT_SAMPLES if file_images is None else file_images


def run_sar_on_saved_pool(
    pool_dir: str | None,
    eps: float,
    delta: float,
    *,
    model: str | None = None,
    images: str | None = None,
    data_dir: str | None = None,
    samples: int | None = None,
    out: str = "sarjax-sar",
    settings: SavedPoolSARSettings | None = None,
) -> dict:
    """SAR_{1-delta} of a saved pool on the first ``samples`` test images; writes OUT/results.json.

    Args:
      pool_dir: the pool's directory (``sarjax train-pool``, :func:`sarjax.models.checkpoint.save_pool`),
        or None with ``model``.
      eps: linf radius, a finite float ``> 0``.
      delta: the allowed uncovered share, in ``[0, 1)``.
      model: ``"PKG.MODULE:FUNCTION"``, a function returning a Pool
        (:func:`sarjax.models.builders.load_model`); exactly one of ``pool_dir`` and ``model``.
      images: an ``.npz`` of the user's images (:func:`sarjax.data.images.load_images`: the first
        ``samples`` of it are attacked, each seeded by its id; the accuracy is measured on the
        whole file), or None.
      data_dir: a directory of MNIST IDX files or CIFAR-10 / CIFAR-100 python batches
        (:func:`sarjax.data.cifar.cifar_kind` tells which), or None: the embedded MNIST. At most
        one of ``images`` and ``data_dir``.
      samples: the images attacked, ``>= 1`` (default every image of ``images``, else
        :data:`SAR_DEFAULT_SAMPLES` (100) test images; :func:`sar_samples`).
      out: the output directory (``results.json``, ``sar/``, ``sar.png``, ``checkpoint/``,
        ``fingerprint.json``).
      settings: PGD steps and restarts, seed, progress bar, conv impl, overwrite, device mesh
        (:class:`SavedPoolSARSettings`; default: Table 1's 40 steps x 3 restarts, seed 0).

    ``settings.devices=(P, D)`` shards the pool over a ``P x D`` mesh of this process's devices
    (:class:`sarjax.models.sharding.ShardedPool`: members on ``pool``, each attack's batch on
    ``data``); the result is the one-device result. Under JAX's distributed runtime
    (``sarjax sar --coordinator ...``) every process runs this function with the same arguments:
    each attacks its block of the images (:mod:`sarjax.sar.distributed`), the results are
    gathered, and process 0 alone checks and writes OUT (the others write only their checkpoints,
    ``OUT/checkpoint/process_<i>_of_<n>``).

    ``settings.conv_impl`` (e.g. ``"fused"``, the fastest joint attack on CPU) re-wraps the pool's
    convolutional stacks before the attack (:meth:`Pool.with_conv_impl`); None keeps the saved one.

    ``OUT/fingerprint.json`` records what changes the result (pool content hash, conv impl, data
    source, the attacked images, eps, delta, steps, restarts, seed, sarjax version). A rerun into
    the same OUT resumes the checkpoint (``OUT/checkpoint``) only when they match; otherwise a
    ValueError names the settings that differ. Another ``delta`` on a finished OUT is read off
    the stored coverage order when it determines it (:func:`sarjax.cover.result.rederive`), else
    the error names the samples. ``settings.overwrite`` deletes OUT's results, checkpoint and
    fingerprint first.

    Returns:
      The ``results.json`` document (on every process).

    Raises:
      TypeError: ``settings`` not None or a :class:`SavedPoolSARSettings`.
      ValueError: bad eps, delta or samples, not exactly one of ``pool_dir`` / ``model``, both
        ``images`` and ``data_dir``, images of another shape than the pool's, an OUT written with
        other settings.
    """
    st = SavedPoolSARSettings() if settings is None else settings
    if not isinstance(st, SavedPoolSARSettings):
        raise TypeError(f"settings must be None or a SavedPoolSARSettings, got {type(st).__name__}")
    steps, restarts, seed, progress = st.steps, st.restarts, st.seed, st.progress
    conv_impl, overwrite, devices = st.conv_impl, st.overwrite, st.devices
    compiles = count_compiles()  # the JSON records what this run compiled (the command's stderr line too)
    validate_sar_args(eps, [delta])
    if samples is not None and samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if (pool_dir is None) == (model is None):
        raise ValueError(
            "give the pool as a directory (--pool DIR) or an import path (--model PKG.MODULE:FUNCTION), one of them"
        )
    if images is not None and data_dir is not None:
        raise ValueError("give --images FILE.npz or --data-dir DIR, not both")
    pool = load_model(model) if model is not None else load_pool(pool_dir)[0]
    if conv_impl is not None:
        pool = pool.with_conv_impl(conv_impl)
    ids = None
    if images is not None:
        mine = load_images(images, input_shape=tuple(pool.input_shape), num_classes=pool.num_classes)
        samples = sar_samples(samples, len(mine.x))
        if samples > len(mine.x):
            raise ValueError(f"samples must be at most {len(mine.x)} (the images in {images}), got {samples}")
        x_acc, y_acc, source = mine.x, mine.y, mine.source
        x, ids = mine.x[:samples], mine.ids[:samples]
    else:
        data = _load_data(data_dir)
        if tuple(pool.input_shape) != data.x_test.shape[1:]:
            raise ValueError(f"the pool takes inputs of shape {pool.input_shape}, the data has {data.x_test.shape[1:]}")
        samples = sar_samples(samples, None)
        check_samples(samples, data)
        x_acc, y_acc, source = data.x_test, data.y_test, data.source
        x = data.x_test[:samples]
    outp = Path(out)
    fingerprint = {
        "kind": "sar",
        "sarjax_version": fingerprints.sarjax_version(),
        **fingerprints.pool_fingerprint(pool),
        "data": source,  # for information only (SAR_INFO_FIELDS): the digests below are the identity
        "samples": samples,
        "images": fingerprints.array_digest(x) if ids is None else fingerprints.array_digest(x, ids),
        "accuracy_images": fingerprints.array_digest(x_acc, y_acc),  # the clean accuracy's images and labels
        "eps": float(eps),
        "delta": float(delta),
        "steps": steps,
        "restarts": restarts,
        "seed": seed,
    }

    lead = jax.process_index() == 0  # the one process that checks and writes OUT
    refusal = None
    if lead:
        try:
            _open_sar_output(outp, fingerprint, overwrite, delta)
        except ValueError as e:
            refusal = e
    if not distributed.all_ok(refusal is None):  # every process waits for process 0's check
        raise refusal or ValueError(f"process 0 refused the run in {outp} (its error says why)")
    run_pool: Any = pool  # a Pool, or a ShardedPool of it
    if devices is not None:
        run_pool = ShardedPool(pool, make_mesh(*devices, local=True))
    try:
        res, member_asr = evaluate_pool(
            run_pool,
            x,
            eps,
            [delta],
            key=jax.random.key(seed),
            sample_ids=ids,
            settings=PoolSARSettings(
                steps=steps,
                restarts=restarts,
                progress=progress and lead,
                checkpoint_dir=outp / "checkpoint",
                overwrite=overwrite and not lead,  # process 0's output check cleared OUT already
            ),
        )
    except fingerprints.FingerprintMismatch as e:
        raise ValueError(f"{e.reason}; {OUT_HINT}") from None
    acc = pool.accuracy(x_acc, y_acc)
    rec = pool_record(pool, acc, member_asr, res)
    label = str(pool_dir) if model is None else f"model {model}"
    doc = {
        "pool": label,
        "eps": eps,
        "delta": delta,
        "samples": samples,
        "steps": steps,
        "restarts": restarts,
        "conv_impl": conv_impl,
        "devices": None if devices is None else {"pool": devices[0], "data": devices[1]},
        "processes": jax.process_count(),
        **rec,
        "compile": compiles.stop().to_json(),
        "provenance": provenance(),  # command, commit, machine, date, load
    }
    if not lead:
        return doc
    res.save(outp / "sar")
    plot_sar(res, outp / "sar.png", title=f"{label}: eps={eps}, 1-delta={1 - delta:g}")
    (outp / "results.json").write_text(json.dumps(doc, indent=2))
    st = res.sar_stats()[0]

    def pm(mean: float, se: float | None) -> str:
        return f"{mean:.4f}" if se is None else f"{mean:.4f} ± {se:.4f}"

    print(
        f"{pool}: accuracy {acc.mean():.4f}, mean ASR {member_asr.mean():.3f}, "
        f"SAR_{1 - delta:g} = {pm(st['mean_sar'], st['se_sar'])}, singleton-completed "
        f"{pm(st['mean_sar_singleton'], st['se_sar_singleton'])} (mean ± standard error over {samples} "
        f"images); wrote {outp / 'results.json'}"
    )
    return doc
