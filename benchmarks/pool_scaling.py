"""Pool-size scaling: joint PGD and the SAR greedy (``run_sar``) on M = 20, 64, 128, 256 members.

For an MLP stack and a CNN stack (small widths, random init: the cost of a step does not depend on
the weights' values) and each pool size M, on one fixed batch of B MNIST test images:

* **joint PGD** (``make_joint_pgd``, every member selected): member-sample-steps per second
  (``M * B * steps * restarts / seconds``, median of ``--reps`` calls after a compiling first
  call, reported separately) and the process's peak resident memory during the timed calls
  (``VmHWM`` after resetting it through ``/proc/self/clear_refs``, Linux; XLA's CPU buffers are
  not seen by tracemalloc) and that peak minus the resident size at the block's start
  (``peak_delta_mib``: the block's own working set; the process keeps every compiled kernel, so
  the absolute peak grows with the number of M already run), plus the host-side Python peak (tracemalloc) and JAX's device memory
  statistics where the backend has them (GPU);
* **the greedy** (``run_sar`` with a short joint PGD, ``--greedy-steps``): wall time, rounds,
  the time inside the attack kernel (the attack is wrapped and timed: its outputs are made
  ready inside the wrapper) vs the host's greedy bookkeeping (the rest), the member-sample-steps
  the kernel calls ran (``M * steps`` times each call's batch: ``run_sar`` packs the active
  samples, ``pack_levels``; an untimed first run compiles every batch size, ``first_run_s``) and
  their rate, and the same memory figures; ``--unpacked`` also times ``pack_levels=0`` (every call
  on the whole batch, as before);
* **the demo's fallback lookup** (``precomputed_single``): building it and one lookup with every
  sample active (``B`` inputs through ``M`` members; it used to evaluate all ``M * B`` member
  attacks through ``M`` members up front, ``O(M^2 B)``).

What grows worse than linearly in M is read off the per-M columns: ``seconds`` per unit of
``M`` (``*_per_member``) should stay flat for linear work; the JSON lists each quantity's
growth exponent between the smallest and the largest M (``log(t_max / t_min) / log(M_max /
M_min)``: 1 = linear).

Writes JSON and a PNG (matplotlib) with the load average (the machine may be shared) and the run's
provenance (command, commit, machine, date, load), to ``--out`` (default: a temporary folder, never
``benchmarks/results/``).

Results (results/pool_scaling_cnn_packed.json / .png: ``--families cnn --sizes 20 40 64 --batch 16
--steps 5 --greedy-steps 2 --reps 1 --unpacked``, load falling from 42 to 25 during the run, so the
wall-time exponents mostly measure the load: the joint PGD's own came out 0.48): the greedy's
kernel work (member-sample-steps its calls ran, deterministic) grows as M^1.73 packed and M^1.95
unpacked (M = 20 -> 64: 19,280 -> 143,744 and 22,400 -> 217,088); the rounds grow as M^0.94 (18,
33, 54: random-init members have independent weaknesses, so the greedy's answer k_hat, and its
rounds, grow with M) and each round's work is linear in M (every member runs in every call). What
is worse than linear is therefore the rounds times M, the algorithm's own cost; packing trims the
rounds' batches as samples finish (packed / unpacked wall time 1.09x, 1.05x, 1.27x at M = 20, 40,
64, alternated per M). The host bookkeeping stays flat (2-3 s per greedy). The fallback lookup
(``precomputed_single``) no longer evaluates all M x B member attacks up front (it grew as M^2.39
in results/pool_scaling.json): one lookup for every sample took 0.21 / 0.13 / 0.22 s.

Usage:
  python benchmarks/pool_scaling.py --quick                  # M = 4, 8, 16, a test of the script
  python benchmarks/pool_scaling.py                          # M = 20, 64, 128, 256
  python benchmarks/pool_scaling.py --sizes 20 256 --families mlp
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # sarjax from this checkout

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import provenance, results_path  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd  # noqa: E402
from sarjax.models import zoo  # noqa: E402
from sarjax.models.pool import Pool, Stack  # noqa: E402

ARCHS = {"mlp": zoo.mlp((64,)), "cnn": zoo.cnn((4, 8), dense=32)}


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib(field: str = "VmHWM") -> float | None:
    """``VmHWM`` (peak) or ``VmRSS`` (current) of this process in MiB (None where /proc is missing)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def device_peak_mib() -> float | None:
    stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
    if not stats:
        return None
    return stats.get("peak_bytes_in_use", 0) / 2**20


class Measure:
    """Context manager: wall seconds, peak RSS, tracemalloc peak and JAX's device peak of a block."""

    def __enter__(self):
        self.rss_reset = reset_peak_rss()
        self.rss_start_mib = peak_rss_mib("VmRSS")
        tracemalloc.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.host_python_peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        self.peak_rss_mib = peak_rss_mib() if self.rss_reset else None
        # what the block added on top of the process (compiled kernels and earlier M's buffers stay)
        self.peak_delta_mib = (
            self.peak_rss_mib - self.rss_start_mib if self.peak_rss_mib and self.rss_start_mib else None
        )
        self.device_peak_mib = device_peak_mib()
        return False


def build_pool(family: str, m: int) -> Pool:
    return Pool((Stack.from_keys(ARCHS[family], jax.random.split(jax.random.PRNGKey(m), m)),))


def growth(ms: list[int], values: list[float]) -> float | None:
    """Exponent of ``value ~ M^k`` between the smallest and the largest M."""
    pairs = [(m, v) for m, v in zip(ms, values) if v is not None and v > 0]
    if len(pairs) < 2:
        return None
    (m0, v0), (m1, v1) = pairs[0], pairs[-1]
    return math.log(v1 / v0) / math.log(m1 / m0)


def bench_joint(pool: Pool, x, steps: int, reps: int, eps: float) -> dict:
    m, b = pool.num_members, len(x)
    attack = make_joint_pgd(pool.apply, eps=eps, steps=steps, step=JointPGDStep(restarts=1))
    ref = jnp.asarray(pool.predict(x).T)
    mask = jnp.ones((b, m), jnp.float32)
    key = jax.random.PRNGKey(1)

    def call():
        return jax.block_until_ready(attack(pool.params, x, ref, key=key, mask=mask).x_adv)

    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    times = []
    with Measure() as mem:
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {
        "first_call_s": first,
        "seconds": times,
        "median_s": t,
        "member_sample_steps_per_s": m * b * steps / t,
        "seconds_per_member": t / m,
        "peak_rss_mib": mem.peak_rss_mib,
        "peak_delta_mib": mem.peak_delta_mib,
        "host_python_peak_mib": mem.host_python_peak_mib,
        "device_peak_mib": mem.device_peak_mib,
    }


def bench_greedy(pool: Pool, x, steps: int, eps: float, deltas, pack: bool = True) -> dict:
    """``run_sar`` timed with its kernel calls (packed unless ``pack=False``), after an untimed first run."""
    from sarjax.sar import SARSettings
    from sarjax.sar.vision import PACK_LEVELS, run_sar

    m = pool.num_members
    inner = make_joint_pgd(pool.apply, eps=eps, steps=steps, step=JointPGDStep(restarts=1))
    calls: list[float] = []
    rows: list[int] = []  # each call's batch (run_sar packs the active samples, pack_levels)

    def attack(*a, **k):
        t0 = time.perf_counter()
        res = jax.block_until_ready(inner(*a, **k))
        calls.append(time.perf_counter() - t0)
        rows.append(int(a[1].shape[0]))
        return res

    key = jax.random.PRNGKey(2)
    settings = SARSettings(store_inputs=False, pack_levels=PACK_LEVELS if pack else 0)
    t0 = time.perf_counter()  # an untimed first run compiles every batch size the timed run calls
    run_sar(pool, x, eps, deltas, key=key, attack=attack, settings=settings)
    first_s = time.perf_counter() - t0
    calls.clear()
    rows.clear()
    with Measure() as mem:
        res = run_sar(pool, x, eps, deltas, key=key, attack=attack, settings=settings)
    attack_s = sum(calls)
    host_s = mem.seconds - attack_s
    rounds = int(res.num_rounds)
    work = sum(rows) * m * steps  # member-sample-steps the kernel calls ran
    return {
        "pack_levels": settings.pack_levels,
        "first_run_s": first_s,
        "seconds": mem.seconds,
        "rounds": rounds,
        "attack_calls": len(calls),
        "call_batches": rows,
        "attack_s": attack_s,
        "host_s": host_s,
        "host_s_per_round": host_s / max(rounds, 1),
        "attack_s_per_call": attack_s / max(len(calls), 1),
        "seconds_per_round": mem.seconds / max(rounds, 1),
        "kernel_member_sample_steps": work,
        "kernel_member_sample_steps_per_s": work / attack_s if attack_s > 0 else None,
        "seconds_per_member": mem.seconds / m,
        "mean_sar": res.sar.mean(0).tolist(),
        "mean_active_per_round": [float(a.mean()) for a in res.active],
        "peak_rss_mib": mem.peak_rss_mib,
        "peak_delta_mib": mem.peak_delta_mib,
        "host_python_peak_mib": mem.host_python_peak_mib,
        "device_peak_mib": mem.device_peak_mib,
    }


def bench_fallback_table(pool: Pool, x) -> dict:
    """``precomputed_single`` on stand-in member attacks (the clean inputs): built and looked up once
    for every sample (``B`` inputs through ``M`` members)."""
    from sarjax.sar.vision import precomputed_single

    m, b = pool.num_members, len(x)
    x_adv = np.broadcast_to(np.asarray(x)[None], (m, *x.shape)).copy()
    queries = np.zeros((m, b), np.int64)
    ref = pool.predict(x).T
    target, active = np.arange(b) % m, np.ones(b, bool)
    precomputed_single(pool, x_adv, queries, ref)(target, active, 0)  # compile outside (pool.predict's shape)
    with Measure() as mem:
        precomputed_single(pool, x_adv, queries, ref)(target, active, 0)
    return {
        "seconds": mem.seconds,
        "seconds_per_member": mem.seconds / m,
        "peak_rss_mib": mem.peak_rss_mib,
        "peak_delta_mib": mem.peak_delta_mib,
    }


def bench_host_greedy(m: int, b: int, p: float, store_inputs: bool) -> dict:
    """The greedy's host side alone (``greedy_sar`` with synthetic numpy oracles, no JAX).

    Each round the joint oracle covers every uncovered member with probability ``p`` and the
    fallback always breaks its target, so every active sample loses at least one member per round
    and a small ``p`` makes the rounds grow like M (as for robust samples). Seconds and the peak of
    numpy's allocations (tracemalloc sees them) isolate the bookkeeping: its per-round logs are
    ``[R, B, M]`` (and ``[R, B, *S]`` inputs with ``store_inputs``).
    """
    from sarjax.cover.greedy import GreedySettings, greedy_sar
    from sarjax.cover.types import Candidates

    rng = np.random.default_rng(m)
    x = np.zeros((b, 28, 28, 1), np.float32)
    q = np.zeros(b, np.int64)

    def joint(unc, r):
        return Candidates(x, rng.random((b, m)) < p, q, rng.random((b, m)))

    def single(target, active, r):
        cov = np.zeros((b, m), bool)
        cov[np.arange(b), target] = active
        return Candidates(x, cov, q, np.zeros((b, m)))

    with Measure() as mem:
        res = greedy_sar(
            joint, single, np.zeros((b, m), bool), (0.0, 0.15, 0.5), settings=GreedySettings(store_inputs=store_inputs)
        )
    return {
        "seconds": mem.seconds,
        "rounds": int(res.num_rounds),
        "seconds_per_round": mem.seconds / max(int(res.num_rounds), 1),
        "host_python_peak_mib": mem.host_python_peak_mib,
        "store_inputs": store_inputs,
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for fam, rows in report["families"].items():
        ms = [r["M"] for r in rows]
        axes[0].plot(ms, [r["joint"]["member_sample_steps_per_s"] for r in rows], "o-", label=f"{fam} joint PGD")
        gr = [r for r in rows if r.get("greedy")]
        if gr:
            gm = [r["M"] for r in gr]
            axes[0].plot(
                gm,
                [r["greedy"]["kernel_member_sample_steps_per_s"] for r in gr],
                "s--",
                label=f"{fam} greedy kernel calls",
            )
            axes[1].plot(gm, [r["greedy"]["seconds_per_member"] for r in gr], "s-", label=f"{fam} greedy total")
            axes[1].plot(gm, [r["greedy"]["host_s"] / r["M"] for r in gr], "x:", label=f"{fam} greedy host part")
            gu = [r for r in gr if r.get("greedy_unpacked")]
            if gu:
                axes[1].plot(
                    [r["M"] for r in gu],
                    [r["greedy_unpacked"]["seconds_per_member"] for r in gu],
                    "d--",
                    label=f"{fam} greedy, unpacked",
                )
        fs = [r.get("fallback_table", {}).get("seconds_per_member") for r in rows]
        if any(v is not None for v in fs):
            axes[1].plot(ms, fs, "^-.", label=f"{fam} precomputed_single")
        axes[2].plot(ms, [r["joint"]["peak_rss_mib"] for r in rows], "o-", label=f"{fam} joint PGD")
        if gr:
            axes[2].plot([r["M"] for r in gr], [r["greedy"]["peak_rss_mib"] for r in gr], "s--", label=f"{fam} greedy")
    axes[0].set(xlabel="members M", ylabel="member-sample-steps / s", title="throughput", xscale="log", yscale="log")
    axes[1].set(xlabel="members M", ylabel="seconds / M", title="time per member (flat = linear)", xscale="log")
    axes[2].set(xlabel="members M", ylabel="peak RSS (MiB)", title="peak resident memory", xscale="log")
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(f"pool scaling, B={report['batch']}, {report['platform']}, load {report['load_avg_before'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 64, 128, 256])
    ap.add_argument("--families", nargs="+", default=["mlp", "cnn"], choices=sorted(ARCHS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="joint PGD steps per timed call")
    ap.add_argument("--greedy-steps", type=int, default=5, help="joint PGD steps inside the greedy")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--greedy-max-m", type=int, default=None, help="run the greedy only up to this M")
    ap.add_argument("--no-fallback-table", action="store_true")
    ap.add_argument(
        "--unpacked",
        action="store_true",
        help="also time the greedy with pack_levels=0 (every call on the whole batch)",
    )
    ap.add_argument("--host-batch", type=int, default=256, help="B of the host-only greedy (synthetic oracles)")
    ap.add_argument("--host-p", type=float, default=0.02, help="per-round cover probability of the synthetic oracle")
    ap.add_argument("--quick", action="store_true", help="M = 4, 8, 16; B = 8; 2 steps; 1 rep")
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path, the PNG beside it (default: a temporary folder, never benchmarks/results/)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.batch, args.steps, args.greedy_steps, args.reps = [4, 8, 16], 8, 2, 2, 1
    out = results_path("pool_scaling_quick.json" if args.quick else "pool_scaling.json", args.out, quick=args.quick)
    from sarjax.data.mnist import load_mnist

    x = jnp.asarray(load_mnist().x_test[: args.batch])
    deltas = (0.5, 0.15, 0.0)
    report: dict = {
        "benchmark": "pool_scaling",
        "batch": args.batch,
        "steps": args.steps,
        "greedy_steps": args.greedy_steps,
        "eps": args.eps,
        "deltas": list(deltas),
        "archs": {k: v.spec() for k, v in ARCHS.items()},
        "platform": jax.devices()[0].platform,
        "device": str(jax.devices()[0]),
        "versions": {"jax": jax.__version__, "python": platform.python_version()},
        "cpu_count": os.cpu_count(),
        "load_avg_before": list(os.getloadavg()),
        "families": {},
        "provenance": provenance(),  # command, commit, machine, date, load (at the start)
    }

    def save():
        report["load_avg_after"] = list(os.getloadavg())
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))

    host = report["host_greedy"] = []
    for m in args.sizes:  # the greedy's own bookkeeping first: no JAX, seconds
        for store in (False, True):
            host.append({"M": m, "B": args.host_batch, **bench_host_greedy(m, args.host_batch, args.host_p, store)})
            h = host[-1]
            print(
                f"host greedy M={m} store_inputs={store}: {h['rounds']} rounds, {h['seconds']:.2f}s "
                f"({h['seconds_per_round'] * 1e3:.1f} ms/round), numpy peak {h['host_python_peak_mib']:.1f} MiB",
                flush=True,
            )
    hs = [h for h in host if not h["store_inputs"]]
    report["growth_exponents"] = {
        "host_greedy": {
            "seconds": growth([h["M"] for h in hs], [h["seconds"] for h in hs]),
            "rounds": growth([h["M"] for h in hs], [h["rounds"] for h in hs]),
            "numpy_peak": growth([h["M"] for h in hs], [h["host_python_peak_mib"] for h in hs]),
        }
    }
    save()
    for fam in args.families:
        rows = report["families"].setdefault(fam, [])
        for m in args.sizes:
            pool = build_pool(fam, m)
            row: dict = {"M": m, "joint": bench_joint(pool, x, args.steps, args.reps, args.eps)}
            j = row["joint"]
            print(
                f"{fam} M={m}: joint {j['median_s']:.3f}s ({j['member_sample_steps_per_s']:.3g} member-sample-steps/s,"
                f" first call {j['first_call_s']:.1f}s, peak RSS {j['peak_rss_mib']} MiB)",
                flush=True,
            )
            if not args.no_greedy and (args.greedy_max_m is None or m <= args.greedy_max_m):
                variants = [("greedy", True)] + ([("greedy_unpacked", False)] if args.unpacked else [])
                for name, pack in variants:
                    g = row[name] = bench_greedy(pool, x, args.greedy_steps, args.eps, deltas, pack=pack)
                    print(
                        f"  {name} {g['seconds']:.2f}s: {g['rounds']} rounds, {g['attack_calls']} kernel calls "
                        f"{g['attack_s']:.2f}s on {sum(g['call_batches'])} sample-calls, host {g['host_s']:.2f}s "
                        f"({g['host_s_per_round'] * 1e3:.1f} ms/round); first run (compiles) {g['first_run_s']:.1f}s",
                        flush=True,
                    )
            if not args.no_fallback_table:
                f = row["fallback_table"] = bench_fallback_table(pool, np.asarray(x))
                print(f"  precomputed_single {f['seconds']:.3f}s", flush=True)
            rows.append(row)
            save()
        ms = [r["M"] for r in rows]
        report["growth_exponents"][fam] = {
            "joint_seconds": growth(ms, [r["joint"]["median_s"] for r in rows]),
            "joint_peak_rss": growth(ms, [r["joint"]["peak_rss_mib"] for r in rows]),
            "joint_peak_delta": growth(ms, [r["joint"]["peak_delta_mib"] for r in rows]),
            "greedy_seconds": growth(ms, [r.get("greedy", {}).get("seconds") for r in rows]),
            "greedy_attack_seconds": growth(ms, [r.get("greedy", {}).get("attack_s") for r in rows]),
            "greedy_host_seconds": growth(ms, [r.get("greedy", {}).get("host_s") for r in rows]),
            "greedy_rounds": growth(ms, [r.get("greedy", {}).get("rounds") for r in rows]),
            "greedy_seconds_per_round": growth(ms, [r.get("greedy", {}).get("seconds_per_round") for r in rows]),
            "greedy_kernel_work": growth(ms, [r.get("greedy", {}).get("kernel_member_sample_steps") for r in rows]),
            "greedy_unpacked_seconds": growth(ms, [r.get("greedy_unpacked", {}).get("seconds") for r in rows]),
            "greedy_unpacked_kernel_work": growth(
                ms, [r.get("greedy_unpacked", {}).get("kernel_member_sample_steps") for r in rows]
            ),
            "fallback_table_seconds": growth(ms, [r.get("fallback_table", {}).get("seconds") for r in rows]),
        }
        save()
    plot(report, out.with_suffix(".png"))
    print(json.dumps(report["growth_exponents"], indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
