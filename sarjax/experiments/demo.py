"""The main job: SAR of the three MNIST diversity pools (``sarjax demo``) and SAR of a saved
pool (``sarjax sar``).

the SAR paper, "Vision pools": low / medium / high diversity pools of M=20 models, joint PGD of its
Table 1 (40 steps, step eps/16, 3 restarts), the safe region = each member's own clean
prediction, SAR_{1-delta} for 1-delta in {0.5, 0.75, 0.85, 1.0} at eps = 0.05.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

from sarjax.attacks.joint import make_joint_pgd
from sarjax.attacks.members import attack_members
from sarjax.attacks.pgd import make_pgd
from sarjax.cover.metrics import asr as asr_metric
from sarjax.cover.plots import plot_sar
from sarjax.cover.result import SARResult, rederive
from sarjax.data.cifar import cifar_kind, load_cifar
from sarjax.data.images import load_images
from sarjax.data.mnist import Split, load_mnist
from sarjax.models.builders import load_model
from sarjax.models.checkpoint import CheckpointError, load_pool, save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.presets import PRESETS, preset_members, preset_names
from sarjax.models.sharding import ShardedPool, make_mesh
from sarjax.models.train import TrainConfig, train_pool
from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.distributed import process_checkpoint_dir
from sarjax.sar import distributed
from sarjax.sar.settings import SARSettings
from sarjax.sar.vision import default_sar_attack, run_sar

COVERAGES = (0.5, 0.75, 0.85, 1.0)  # 1 - delta

_COMPILE = [0.0]  # JAX compile seconds of this process (jax.monitoring), from the first PhaseClock on


def _on_duration(event: str, duration_secs: float, **_: str | int) -> None:
    if event.startswith("/jax/core/compile/"):  # tracing, lowering, backend compile
        _COMPILE[0] += duration_secs


class PhaseClock:
    """Wall seconds and JAX compile seconds spent in named phases (the demo's time split).

    ``with clock("train", "low"): ...`` adds the block's wall time and the compile time JAX
    reports inside it (``jax.monitoring`` events ``/jax/core/compile/*``: tracing, lowering to
    MLIR, backend compilation) to the phase ``train`` of ``low``. :meth:`split` sums per phase.
    """

    _listening = False

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        if not PhaseClock._listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            PhaseClock._listening = True

    @contextmanager
    def __call__(self, phase: str, pool: str = "") -> Iterator[None]:
        t0, c0 = time.perf_counter(), _COMPILE[0]
        try:
            yield
        finally:
            self.rows.append(
                {"phase": phase, "pool": pool, "seconds": time.perf_counter() - t0, "compile_seconds": _COMPILE[0] - c0}
            )

    def split(self) -> dict[str, dict[str, float]]:
        """{phase: {"seconds", "compile_seconds"}} summed over pools, in first-seen order."""
        out: dict[str, dict[str, float]] = {}
        for r in self.rows:
            acc = out.setdefault(r["phase"], {"seconds": 0.0, "compile_seconds": 0.0})
            acc["seconds"] += r["seconds"]
            acc["compile_seconds"] += r["compile_seconds"]
        return out


@dataclass(frozen=True)
class DemoSettings:
    """What one demo run does (the defaults are the paper's; ``quick_settings()`` is the 3-minute run).

    Attributes:
      members: pool size M (the SAR paper: 20).
      epochs: maximum training epochs (early stopping, patience 3; the paper: Adam and early
        stopping, its Appendix A.3.1).
      samples: test images attacked (50: the standard error of a SAR cell is then about 0.03).
      eps: linf radius (the SAR paper: 0.05 on MNIST).
      steps, restarts: joint PGD (the SAR paper Table 1: 40 steps of eps/16, 3 restarts).
      seed: seed of the pools and the attacks.
      quick: the 3-minute run.
      lr_schedule: :attr:`sarjax.models.train.TrainConfig.lr_schedule` of the pools (constant:
        cosine decay over 5 epochs lost 0.8 points of accuracy against 10 constant-rate epochs).
      attack_conv_impl: convolution formulation of the attacked copies of the CNN stacks
        (``"fused"``: the fastest joint attack on CPU, docs/models.md; the trained and cached
        pools keep theirs).
    """

    members: int = 20
    epochs: int = 10
    samples: int = 50
    eps: float = 0.05
    steps: int = 40
    restarts: int = 3
    seed: int = 0
    quick: bool = False
    lr_schedule: str = "constant"
    attack_conv_impl: str = "fused"

    @classmethod
    def quick_settings(cls, seed: int = 0) -> DemoSettings:
        return cls(members=6, epochs=2, samples=12, steps=20, restarts=1, seed=seed, quick=True)


OUT_HINT = "pass --overwrite to discard it or choose another --out"


def validate_sar_args(eps: float, deltas: Sequence[float]) -> None:
    """Raise ValueError for an eps that is not a finite float > 0 (inf, nan, <= 0) or a delta
    outside [0, 1)."""
    if not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite float > 0, got {eps}")
    for d in deltas:
        if not 0.0 <= d < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {d}")


def pool_settings(preset: str, data: Split, s: DemoSettings) -> dict[str, Any]:
    """What a cached demo pool must have been trained with (checked on every cache hit)."""
    return {
        "preset": preset,
        "members": s.members,
        "epochs": s.epochs,
        "lr_schedule": s.lr_schedule,
        "seed": s.seed,
        "data": data.source,
        "sarjax_version": fingerprints.sarjax_version(),
    }


def get_pool(
    preset: str,
    data: Split,
    s: DemoSettings,
    cache_dir: Path | None,
    progress: bool = True,
    *,
    retrain_on_mismatch: bool = False,
) -> tuple[Pool, dict]:
    """Load a preset pool from the cache directory, or train it (and cache it).

    A cached pool is used only when the settings it was trained with (:func:`pool_settings`:
    preset, members, epochs, seed, data source, sarjax version) equal this run's. Otherwise a
    ValueError names the settings that differ, or, with ``retrain_on_mismatch`` (the demo's
    default cache), the pool is retrained and the reason printed. An unreadable cache entry is
    retrained either way.
    """
    digest = hashlib.sha1(data.source.encode()).hexdigest()[:8]
    sched = "" if s.lr_schedule == "constant" else f"-{s.lr_schedule}"
    tag = f"{preset}-m{s.members}-e{s.epochs}{sched}-s{s.seed}-{digest}"
    path = cache_dir / tag if cache_dir is not None else None
    want = pool_settings(preset, data, s)
    if path is not None and (path / "pool.json").exists():
        try:
            pool, cfg = load_pool(path)
        except CheckpointError as e:
            print(f"[{preset}] cache unusable ({e}); retraining")
        else:
            got = {k: cfg[k] for k in want if k in cfg}
            got["members"] = pool.num_members  # what the cache holds, whatever its config says
            diff = fingerprints.differing_fields(got, want)
            if not diff:
                print(f"[{preset}] loaded cached pool {path}")
                return pool, cfg
            reason = fingerprints.mismatch_reason(f"cached pool {path}", got, want, diff).replace(
                "was written with", "was trained with", 1
            )
            if not retrain_on_mismatch:
                raise ValueError(f"{reason}; delete it or choose another --cache")
            print(f"[{preset}] {reason}; retraining")
    t0 = time.time()
    pool, info = train_pool(
        preset_members(preset, s.members, s.seed),
        data.x_train,
        data.y_train,
        config=TrainConfig(epochs=s.epochs, lr_schedule=s.lr_schedule),
        names=preset_names(preset, s.members),
        progress=progress,
    )
    cfg = {**want, "history": info, "train_seconds": time.time() - t0}
    if path is not None:
        try:
            save_pool(pool, path, cfg)
        except Exception as e:  # a cache that cannot be written must not lose the trained pool
            print(f"[{preset}] could not cache the pool in {path} ({type(e).__name__}: {e}); continuing")
    return pool, cfg


def evaluate_pool(
    pool: Pool,
    x: np.ndarray,
    eps: float,
    deltas: Sequence[float],
    *,
    steps: int,
    restarts: int,
    key: jax.Array,
    progress: bool = True,
    checkpoint_dir: Path | None = None,
    attack=None,
    overwrite: bool = False,
    clock: PhaseClock | None = None,
    label: str = "",
    sample_ids: np.ndarray | None = None,
) -> tuple[SARResult, np.ndarray]:
    """SAR (joint PGD greedy) and per-member ASR (the same PGD on each member alone).

    The per-member attacks double as Algorithm 1's single-member fallback (looked up, not rerun).
    Pass ``attack=make_joint_pgd(pool.apply, steps=..., restarts=...)`` built once per pool to
    reuse its compiled kernel across several eps (eps is a traced argument); the per-member
    kernel is memoised by :func:`sarjax.attacks.members.attack_members` already.

    ``pool`` may be a :class:`sarjax.models.sharding.ShardedPool`. Under JAX's distributed
    runtime (``jax.process_count() > 1``) each process attacks its block of the samples
    (:func:`sarjax.runtime.distributed.process_rows`, checkpoints under
    ``checkpoint_dir/process_<i>_of_<n>``) and every process gets the gathered result; sample
    ids are the rows of ``x``, so the result is the one-process result.

    ``clock`` (optional) times the per-member attacks (phase ``"member attacks"``) and the
    greedy (``"greedy rounds"``) under ``label``. ``sample_ids`` (default ``0 .. B-1``): the ids
    that seed each image's random streams (:mod:`sarjax.data.images`).

    Returns:
      (SAR result, per-member ASR [M]).
    """

    validate_sar_args(eps, deltas)
    rows = distributed.process_rows(len(x))  # all of them in one process
    x = np.asarray(x)[rows]
    ids = rows if sample_ids is None else np.asarray(sample_ids)[rows]
    clean = pool.predict(x)  # [M, B]
    members = (
        partial(pool.attack_members, attack_members) if isinstance(pool, ShardedPool) else partial(attack_members, pool)
    )
    clock = clock if clock is not None else PhaseClock()
    with clock("member attacks", label):
        single = _block(
            members(
                make_pgd,
                x,
                clean.T,
                key=jax.random.fold_in(key, 1),
                eps=eps,
                norm="linf",
                steps=steps,
                restarts=restarts,
                rel_step=1.0 / 16,
                sample_ids=ids,
            )
        )
    with clock("greedy rounds", label):
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
                progress=progress, checkpoint_dir=process_checkpoint_dir(checkpoint_dir), overwrite=overwrite
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


def plot_demo(records: dict[str, dict], out: Path) -> Path:
    """Mean SAR (solid) and singleton-completed SAR (dashed) per coverage target for each pool,
    with standard-error bars, and 1 - ASR as a dotted reference line."""
    import matplotlib  # heavy optional dependency: imported only to plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use("Agg")

    def err(rec: dict, key: str) -> list[float] | None:
        return [0.0 if v is None else v for v in rec.get(key, {}).values()] or None

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, rec in records.items():
        cov = [float(c) for c in rec["sar"]]
        line = ax.errorbar(
            cov, list(rec["sar"].values()), yerr=err(rec, "sar_se"), marker="o", capsize=3, label=f"{name} SAR"
        )[0]
        if "sar_singleton" in rec:
            ax.errorbar(
                cov,
                list(rec["sar_singleton"].values()),
                yerr=err(rec, "sar_singleton_se"),
                marker="s",
                ls="--",
                capsize=3,
                color=line.get_color(),
                label=f"{name} singleton-completed",
            )
        ax.axhline(1 - rec["asr"], ls=":", color=line.get_color(), label=f"{name} 1-ASR")
    ax.set_xlabel("coverage target 1 - delta")
    ax.set_ylabel("mean SAR (k_hat / M) ± standard error")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "sar_by_pool.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_table(records: dict[str, dict], eps: float) -> None:
    def cell(r: dict, key: str, c: float) -> str:
        mean = r.get(key, {}).get(f"{c:g}")
        if mean is None:
            return "-"
        se = r.get(f"{key}_se", {}).get(f"{c:g}")
        return f"{mean:.3f}±{se:.3f}" if se is not None else f"{mean:.3f}"

    t = Table(
        title=f"SAR at eps={eps:g} (joint PGD, safe region = own clean prediction)",
        caption="mean ± standard error over the images; SAR_sc = singleton-completed SAR (members still "
        "missing when the target is out of reach cost one input each; docs/cover.md)",
    )
    t.add_column("pool")
    t.add_column("M", justify="right")
    t.add_column("test acc", justify="right")
    t.add_column("mean ASR", justify="right")
    for c in COVERAGES:
        t.add_column(f"SAR {c:g}", justify="right")
    for c in COVERAGES:
        t.add_column(f"SAR_sc {c:g}", justify="right")
    t.add_column("k_hat at 1-delta=0.85 (k:images)")
    for name, r in records.items():
        hist = r["k_hat_histogram"].get("0.85", {})
        t.add_row(
            name,
            str(r["members"]),
            f"{r['accuracy']:.4f}",
            f"{r['asr']:.3f}",
            *[cell(r, "sar", c) for c in COVERAGES],
            *[cell(r, "sar_singleton", c) for c in COVERAGES],
            " ".join(f"{k}:{v}" for k, v in hist.items()),
        )
    Console(width=200).print(t)


def attack_copy(pool: Pool, conv_impl: str) -> Pool:
    """``pool`` with its ``cnn`` stacks re-wrapped to ``conv_impl`` (same params), other stacks as they are.

    Only the zoo's ``cnn`` family has a fused kernel (:func:`sarjax.models.fused_members.supports`);
    :meth:`Pool.with_conv_impl` would turn a residual CNN's convolutions into XLA's, whose
    gradients are slow on CPU (docs/design.md), so those keep their own formulation.
    """

    stacks = [
        st.with_conv_impl(conv_impl) if isinstance(st, Stack) and st.arch.family == "cnn" else st for st in pool.stacks
    ]
    return Pool(stacks)


def shared_joint_pgd(cache: dict[Any, Any], pool: Pool, *, steps: int, restarts: int) -> Any:
    """The joint PGD of the SAR paper Table 1 for ``pool``, one per pool structure in ``cache``.

    Pools whose stacks have equal architectures and member counts (the low and the medium preset)
    get the same attack, built on the first one's ``apply``: it computes from the ``params`` it is
    called with, so the attack's compiled kernel is reused (eps, masks and keys are traced).
    """

    key = (tuple((type(st), getattr(st, "arch", None), st.size) for st in pool.stacks), steps, restarts)
    if key not in cache:
        cache[key] = make_joint_pgd(pool.apply, steps=steps, restarts=restarts)
    return cache[key]


def print_time_split(clock: PhaseClock, total: float) -> None:
    """The closing time split: wall seconds per phase, their JAX compile seconds, and the rest."""
    split = clock.split()
    parts = [f"{name} {v['seconds']:.0f}s (compile {v['compile_seconds']:.0f}s)" for name, v in split.items()]
    rest = total - sum(v["seconds"] for v in split.values())
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"time split: {'; '.join(parts)}; other {rest:.0f}s; total {total:.0f}s (load average {load})")


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


DEMO_OUTPUTS = (fingerprints.FINGERPRINT_FILE, "results.json", "sar_*", "checkpoint")  # not pools/: a cache


def run_demo(
    out: str | Path | None = None,
    *,
    quick: bool = False,
    cache_dir: str | Path | None = None,
    samples: int | None = None,
    seed: int = 0,
    data_dir: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Train (or load) the three diversity pools, measure SAR and ASR, write results.json and plots.

    ``out/fingerprint.json`` records the settings (members, epochs, samples, eps, steps, restarts,
    seed, data, the attacked images, sarjax version); each pool's SAR greedy checkpoints every
    round under ``out/checkpoint/<preset>`` (with its own fingerprint, the pool's content hash
    included), so an interrupted demo resumes, and a rerun with other settings into the same
    ``out`` stops with an error naming them instead of mixing two runs.

    Args:
      out: output directory (results.json, sar_by_pool.png, sar_<pool>.png); default
        ``sarjax-demo``, or ``sarjax-demo-quick`` with ``quick`` (so the quick and the full run
        never collide in one directory, which the fingerprint check would refuse).
      quick: the 3-minute version (6 members, 2 epochs, 12 samples, 20 steps, 1 restart).
        Without it: :class:`DemoSettings` (20 members, 10 epochs, 50 images, Table 1's PGD).
      cache_dir: where trained pools are cached (default ``<out>/pools``). A cached pool trained
        with other settings is retrained (default cache, the reason printed) or refused (a cache
        given here; :func:`get_pool`).
      samples: override the number of test images attacked (at most the test images available).
      seed: seed of the pools and the attacks.
      data_dir: MNIST IDX directory (default: the embedded 5,000 digits).
      overwrite: delete an earlier run's results, plots, checkpoints and fingerprint in ``out``
        first (the pool cache is kept: it is checked per pool).

    The closing line is the time split (:class:`PhaseClock`): wall and JAX compile seconds of
    training or loading the pools, their test accuracy, the per-member attacks and the greedy
    rounds, with the load average; ``results.json`` keeps it per pool (``time_split``). The low and
    medium pools (one architecture, 20 members) share one compiled joint attack
    (:func:`shared_joint_pgd`).

    Returns:
      The results dict written to ``results.json``.
    """
    compiles = count_compiles()  # the JSON records what this run compiled (the command's stderr line too)
    s = DemoSettings.quick_settings(seed) if quick else DemoSettings(seed=seed)
    if samples is not None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        s = DemoSettings(**{**s.__dict__, "samples": samples})
    out = Path(out if out is not None else ("sarjax-demo-quick" if quick else "sarjax-demo"))
    cache = Path(cache_dir) if cache_dir is not None else out / "pools"
    t0 = time.time()
    data = load_mnist(data_dir)
    check_samples(s.samples, data)
    x = data.x_test[: s.samples]
    deltas = [round(1.0 - c, 10) for c in COVERAGES]
    fingerprint = {
        "kind": "demo",
        "sarjax_version": fingerprints.sarjax_version(),
        **s.__dict__,
        "coverages": list(COVERAGES),
        "data": data.source,
        "images": fingerprints.array_digest(x),
    }
    open_output(out, fingerprint, overwrite, DEMO_OUTPUTS)
    if s.quick:
        print(
            f"QUICK MODE: {s.members} members per pool, {s.epochs} epochs, {s.samples} test images, "
            f"{s.steps} PGD steps x {s.restarts} restart(s) (the paper: 20 members, 40 steps x 3 restarts)"
        )
    print(f"data: {data.summary()}; attacking the first {s.samples} test images at eps={s.eps}")
    records, results = {}, {}
    clock = PhaseClock()
    attacks: dict[Any, Any] = {}  # one joint attack (one compiled kernel) per pool structure
    for preset in PRESETS:
        with clock("train or load", preset):
            pool, _ = get_pool(preset, data, s, cache, progress, retrain_on_mismatch=cache_dir is None)
        with clock("test accuracy", preset):
            acc = pool.accuracy(data.x_test, data.y_test)
        print(f"[{preset}] {pool}: mean test accuracy {acc.mean():.4f}")
        attacked = attack_copy(pool, s.attack_conv_impl)
        try:
            res, member_asr = evaluate_pool(
                attacked,
                x,
                s.eps,
                deltas,
                steps=s.steps,
                restarts=s.restarts,
                key=jax.random.key(s.seed),
                progress=progress,
                checkpoint_dir=out / "checkpoint" / preset,
                attack=shared_joint_pgd(attacks, attacked, steps=s.steps, restarts=s.restarts),
                clock=clock,
                label=preset,
            )
        except fingerprints.FingerprintMismatch as e:  # e.g. the pool was retrained to other floats
            raise ValueError(f"{e.reason}; {OUT_HINT}") from None
        records[preset] = pool_record(pool, acc, member_asr, res)
        results[preset] = res
        res.save(out / f"sar_{preset}")
        plot_sar(res, out / f"sar_{preset}.png", title=f"{preset} diversity pool, eps={s.eps}")
    doc = {
        "eps": s.eps,
        "coverages": list(COVERAGES),
        "settings": s.__dict__,
        "data": data.source,
        "samples": s.samples,
        "attack": {
            "name": "joint PGD (the SAR paper Table 1)",
            "steps": s.steps,
            "step_size": "eps/16",
            "restarts": s.restarts,
        },
        "pools": records,
        "seconds": time.time() - t0,
        "time_split": {"phases": clock.split(), "per_pool": clock.rows},
        "load_average": list(os.getloadavg()),
        "compile": compiles.stop().to_json(),
    }
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    plot_demo(records, out)
    print_table(records, s.eps)
    print_time_split(clock, doc["seconds"])
    print(f"wrote {out / 'results.json'} and plots in {out} ({time.time() - t0:.0f}s)")
    return doc


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
    samples: int | None = None,
    out: str = "sarjax-sar",
    data_dir: str | None = None,
    steps: int = 40,
    restarts: int = 3,
    seed: int = 0,
    progress: bool = True,
    conv_impl: str | None = None,
    overwrite: bool = False,
    devices: tuple[int, int] | None = None,
    model: str | None = None,
    images: str | None = None,
) -> dict:
    """SAR_{1-delta} of a saved pool on the first ``samples`` test images; writes OUT/results.json.

    ``samples`` defaults to every image of ``images``, else to :data:`SAR_DEFAULT_SAMPLES` (100)
    test images (:func:`sar_samples`).

    The pool: the directory ``pool_dir``, or ``model="PKG.MODULE:FUNCTION"`` (a function returning
    a Pool, :func:`sarjax.models.builders.load_model`; exactly one of the two). The images: the
    embedded MNIST (default), ``data_dir`` holding MNIST IDX files or CIFAR-10 / CIFAR-100 python
    batches (:func:`sarjax.data.cifar.cifar_kind` tells which), or ``images``, an ``.npz`` of the
    user's images (:func:`sarjax.data.images.load_images`: the first ``samples`` of it are
    attacked, each seeded by its id; the accuracy is measured on the whole file).

    ``devices=(P, D)`` shards the pool over a ``P x D`` mesh of this process's devices
    (:class:`sarjax.models.sharding.ShardedPool`: members on ``pool``, each attack's batch on
    ``data``); the result is the one-device result. Under JAX's distributed runtime
    (``sarjax sar --coordinator ...``) every process runs this function with the same arguments:
    each attacks its block of the images (:mod:`sarjax.sar.distributed`), the results are
    gathered, and process 0 alone checks and writes OUT (the others write only their checkpoints,
    ``OUT/checkpoint/process_<i>_of_<n>``).

    ``conv_impl`` (e.g. ``"fused"``, the fastest joint attack on CPU) re-wraps the pool's
    convolutional stacks before the attack (:meth:`Pool.with_conv_impl`); None keeps the saved one.

    ``OUT/fingerprint.json`` records what changes the result (pool content hash, conv impl, data
    source, the attacked images, eps, delta, steps, restarts, seed, sarjax version). A rerun into
    the same OUT resumes the checkpoint (``OUT/checkpoint``) only when they match; otherwise a
    ValueError names the settings that differ. Another ``delta`` on a finished OUT is read off
    the stored coverage order when it determines it (:func:`sarjax.cover.result.rederive`), else
    the error names the samples. ``overwrite`` deletes OUT's results, checkpoint and fingerprint
    first.
    """
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
            steps=steps,
            restarts=restarts,
            key=jax.random.key(seed),
            progress=progress and lead,
            checkpoint_dir=outp / "checkpoint",
            overwrite=overwrite and not lead,  # process 0's output check cleared OUT already
            sample_ids=ids,
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
