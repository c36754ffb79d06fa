"""The main job: SAR of the three MNIST diversity pools (``sarjax demo``; the measurement of each
pool is :func:`sarjax.experiments.sar.evaluate_pool`, ``sarjax sar``'s engine).

the SAR paper, "Vision pools": low / medium / high diversity pools of M=20 models, joint PGD of its
Table 1 (40 steps, step eps/16, 3 restarts), the safe region = each member's own clean
prediction, SAR_{1-delta} for 1-delta in {0.5, 0.75, 0.85, 1.0} at eps = 0.05.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
from rich.console import Console
from rich.table import Table

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.cover.plots import plot_sar
from sarjax.data.mnist import Split, load_mnist
from sarjax.experiments.sar import OUT_HINT, PoolSARSettings, check_samples, evaluate_pool, open_output, pool_record
from sarjax.models.checkpoint import CheckpointError, load_pool, save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.presets import PRESETS, preset_members, preset_names
from sarjax.models.train import TrainConfig, train_pool
from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.compile_stats import count_compiles
from sarjax.runtime.provenance import provenance

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
        cache[key] = make_joint_pgd(pool.apply, steps=steps, step=JointPGDStep(restarts=restarts))
    return cache[key]


def print_time_split(clock: PhaseClock, total: float) -> None:
    """The closing time split: wall seconds per phase, their JAX compile seconds, and the rest."""
    split = clock.split()
    parts = [f"{name} {v['seconds']:.0f}s (compile {v['compile_seconds']:.0f}s)" for name, v in split.items()]
    rest = total - sum(v["seconds"] for v in split.values())
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"time split: {'; '.join(parts)}; other {rest:.0f}s; total {total:.0f}s (load average {load})")


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
                key=jax.random.key(s.seed),
                attack=shared_joint_pgd(attacks, attacked, steps=s.steps, restarts=s.restarts),
                settings=PoolSARSettings(
                    steps=s.steps, restarts=s.restarts, progress=progress, checkpoint_dir=out / "checkpoint" / preset
                ),
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
        "provenance": provenance(),  # command, commit, machine, date, load
    }
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    plot_demo(records, out)
    print_table(records, s.eps)
    print_time_split(clock, doc["seconds"])
    print(f"wrote {out / 'results.json'} and plots in {out} ({time.time() - t0:.0f}s)")
    return doc
