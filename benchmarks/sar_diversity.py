"""SAR of the low / medium / high diversity pools over eps (the SAR paper, Figure 2).

Joint PGD per Table 1 (40 steps, eps/16, 3 restarts), safe region = own clean prediction,
SAR_{1-delta} for 1-delta in {0.5, 0.75, 0.85, 1.0} over eps in {0.02, 0.05, 0.1, 0.15, 0.2}, next to
the individual robustness 1 - ASR (the same PGD on each member alone). The paper's claim: at
eps = 0.05 the high-diversity pool has higher SAR than the other two, and the gap persists as eps
grows.

    python benchmarks/sar_diversity.py --samples 100 --out benchmarks/results/sar_diversity
    python benchmarks/sar_diversity.py --quick     # 6 members, 16 images, 2 eps, 10 steps

On a shared 2-core machine, one process per pool (``--presets low``, ... into separate ``--out``
directories) and ``--merge`` of their JSONs; ``--coverages 0.85`` runs the greedy only as far as
SAR_0.85 needs (the paper's Figure 3 target: a sample stops once 17 of 20 members are covered or 4
are unbreakable, instead of 11 for SAR_0.5). The JSON records each pool's member accuracies per
architecture (``accuracy_by_arch``: mean, min, max, count) and the load average.

Writes OUT/sar_diversity.json (with the run's provenance: command, commit, machine, date, load),
OUT/sar_vs_eps.png and OUT/sar_distribution.png; ``--out OUT`` (default: a temporary folder, never
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import numpy as np
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

from sarjax.data.mnist import load_mnist
from sarjax.experiments.demo import COVERAGES, DemoSettings, attack_copy, get_pool, shared_joint_pgd
from sarjax.experiments.sar import PoolSARSettings, evaluate_pool
from sarjax.models.presets import PRESETS
from sarjax.models.train import LR_SCHEDULES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument(
        "--eps",
        type=float,
        nargs="+",
        default=[0.05, 0.1, 0.2, 0.02, 0.15],
        help="radii, run in this order (0.05, the paper's headline, first)",
    )
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    ap.add_argument(
        "--coverages",
        type=float,
        nargs="+",
        default=list(COVERAGES),
        help="coverage targets 1 - delta (default the demo's four; the greedy runs as far as the strictest needs)",
    )
    ap.add_argument("--lr-schedule", default=DemoSettings.lr_schedule, choices=LR_SCHEDULES)
    ap.add_argument(
        "--conv-impl",
        default=DemoSettings.attack_conv_impl,
        choices=["im2col", "xla", "fused"],
        help="convolution formulation of the attacked CNN stacks (the demo's default)",
    )
    ap.add_argument(
        "--pool-dir",
        nargs="+",
        default=[],
        metavar="PRESET=DIR",
        help="attack the saved pool DIR (sarjax.models.checkpoint) as PRESET instead of training or loading the cache",
    )
    ap.add_argument(
        "--drop-family",
        default=None,
        choices=["mlp", "cnn", "resnet"],
        help="accuracy-matched sub-pools: drop every member of this architecture family from every pool, then keep "
        "the first M' members of each pool, M' the smallest pool left (so that every pool has M' members)",
    )
    ap.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint every greedy round under DIR/<preset>/eps<e> (a rerun with the same settings resumes)",
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--cache", default="sarjax-demo/pools", help="trained-pool cache (shared with sarjax demo)")
    ap.add_argument("--no-cache", action="store_true", help="train the pools in memory, write no cache")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no new eps after this many seconds (the JSON is rewritten after every pool x eps)",
    )
    ap.add_argument(
        "--precision",
        default=None,
        choices=["default", "high", "highest"],
        help="jax_default_matmul_precision (on GPUs 'default' may use TF32)",
    )
    ap.add_argument(
        "--out", default=None, help="output folder (default: a temporary folder, never benchmarks/results/)"
    )
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="merge the eps results of several runs' sar_diversity.json (same pools and samples) "
        "into OUT/sar_diversity.json and redraw OUT/sar_vs_eps.png; runs nothing",
    )
    ap.add_argument(
        "--matched-members",
        type=int,
        default=13,
        help="with --drop-family: M' (13 = the high pool's 20 members less its 7 MLPs)",
    )
    a = ap.parse_args()
    a.out = str(results_path("sar_diversity", a.out, quick=a.quick))
    if a.merge:
        merge(a.merge, Path(a.out))
        return
    if a.quick:
        a.samples, a.members, a.epochs, a.eps, a.steps, a.restarts = 16, 6, 2, [0.05, 0.15], 10, 1
    if a.precision:
        jax.config.update("jax_default_matmul_precision", a.precision)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_mnist(a.data_dir)
    x = data.x_test[: a.samples]
    s = DemoSettings(members=a.members, epochs=a.epochs, samples=a.samples, seed=a.seed, lr_schedule=a.lr_schedule)
    coverages = tuple(float(c) for c in a.coverages)
    deltas = [round(1 - c, 10) for c in coverages]
    doc = {
        "settings": vars(a),
        "provenance": provenance(),  # command, commit, machine, date, load (at the start)
        "data": data.source,
        "samples": int(len(x)),
        "coverages": list(coverages),
        "load_average_start": list(os.getloadavg()),
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
        "pools": {},
        "complete": False,
    }
    t0 = time.time()
    pools, attacks, shared = {}, {}, {}
    dirs = dict(kv.split("=", 1) for kv in a.pool_dir)
    for preset in a.presets:
        t1 = time.time()
        if preset in dirs:
            from sarjax.models.checkpoint import load_pool

            pool, cfg = load_pool(dirs[preset])
        else:
            pool, cfg = get_pool(preset, data, s, None if a.no_cache else Path(a.cache))
        if a.drop_family is not None:
            pool = matched_subpool(pool, a.drop_family, a.matched_members)
        acc = pool.accuracy(data.x_test, data.y_test)
        by_arch = {}
        for i, st in enumerate(stack for stack in pool.stacks for _ in range(stack.size)):
            by_arch.setdefault(st.arch.name, []).append(float(acc[i]))
        pool = attack_copy(pool, a.conv_impl)
        pools[preset] = pool
        attacks[preset] = shared_joint_pgd(shared, pool, steps=a.steps, restarts=a.restarts)
        doc["pools"][preset] = {
            "accuracy": float(acc.mean()),
            "member_accuracy": acc.tolist(),
            "accuracy_by_arch": {
                k: {"mean": float(np.mean(v)), "min": min(v), "max": max(v), "count": len(v)}
                for k, v in by_arch.items()
            },
            "train_seconds": cfg.get("train_seconds", time.time() - t1),
            "eps": {},
        }
        print(
            f"{preset:6s} M={pool.num_members} mean test accuracy {acc.mean():.4f} ({time.time() - t0:.0f}s)",
            flush=True,
        )
    per_sample = {}
    done_eps = []
    for eps in a.eps:
        if a.budget_s is not None and time.time() - t0 > a.budget_s:
            print(f"budget of {a.budget_s:.0f}s spent: skipping eps >= this one ({eps:g})", flush=True)
            break
        for preset, pool in pools.items():
            t1 = time.time()
            res, member_asr = evaluate_pool(
                pool,
                x,
                eps,
                deltas,
                key=jax.random.key(a.seed),
                attack=attacks[preset],
                settings=PoolSARSettings(
                    steps=a.steps,
                    restarts=a.restarts,
                    progress=False,
                    checkpoint_dir=None if a.checkpoint is None else Path(a.checkpoint) / preset / f"eps{eps:g}",
                ),
            )
            v = res.valid
            rec = {
                "asr": float(member_asr.mean()),
                "member_asr": member_asr.tolist(),
                "sar": {f"{c:g}": float(res.sar[v, j].mean()) for j, c in enumerate(coverages)},
                "sar_sem": {
                    f"{c:g}": float(res.sar[v, j].std(ddof=1) / np.sqrt(v.sum())) if v.sum() > 1 else None
                    for j, c in enumerate(coverages)
                },
                "share_sar_one": {f"{c:g}": float((res.sar[v, j] >= 1).mean()) for j, c in enumerate(coverages)},
                "rounds": int(res.num_rounds),
                "load_average": list(os.getloadavg()),
                "share_fallback": float(res.fallback_fired[v].mean()),
                "mean_queries_per_sample": float(res.queries[v].mean()),
                "seconds": time.time() - t1,
            }
            doc["pools"][preset]["eps"][f"{eps:g}"] = rec
            per_sample[(preset, eps)] = res.sar[v]
            rec["per_sample_sar"] = np.round(res.sar[v], 4).tolist()  # [N, 4]: the distribution plot's data
            print(
                f"{preset:6s} eps={eps:<5g} ASR={member_asr.mean():.3f} "
                + " ".join(
                    f"SAR{c:g}={rec['sar'][f'{c:g}']:.3f}+-{rec['sar_sem'][f'{c:g}'] or 0:.3f}" for c in coverages
                )
                + f"  ({rec['seconds']:.0f}s, total {time.time() - t0:.0f}s)",
                flush=True,
            )
            doc["seconds"] = time.time() - t0
            (out / "sar_diversity.json").write_text(json.dumps(doc, indent=2))
        done_eps.append(eps)
    doc["complete"] = len(done_eps) == len(a.eps)
    doc["eps_done"] = sorted(done_eps)
    doc["claim_check"] = claim_check(doc, sorted(done_eps))
    doc["seconds"] = time.time() - t0
    doc["load_average_end"] = list(os.getloadavg())
    (out / "sar_diversity.json").write_text(json.dumps(doc, indent=2))
    plot(doc, per_sample, sorted(done_eps), out)
    print(json.dumps(doc["claim_check"], indent=1))
    print(f"wrote {out}/sar_diversity.json and plots ({doc['seconds']:.0f}s)")


def matched_subpool(pool, family: str, members: int):
    """The first ``members`` members of ``pool`` (in member order) that are not of ``family``."""
    keep = [i for i, st in enumerate(st for st in pool.stacks for _ in range(st.size)) if st.arch.family != family]
    if len(keep) < members:
        raise ValueError(f"{len(keep)} members left after dropping {family}, fewer than {members}")
    return pool.select(keep[:members])


def claim_check(doc: dict, eps_done: list[float]) -> dict:
    """SAR(high) - SAR(low|medium) per coverage at eps = 0.05 (or the first eps done), with the
    standard error of the difference of two independent means; {} unless all three pools ran."""
    if not eps_done or any(p not in doc["pools"] for p in PRESETS):
        return {}
    e = "0.05" if 0.05 in eps_done else f"{eps_done[0]:g}"
    hi = doc["pools"]["high"]["eps"][e]["sar"]
    hse = doc["pools"]["high"]["eps"][e].get("sar_sem", {})

    def se(p: str, c: str) -> float | None:
        a, b = hse.get(c), doc["pools"][p]["eps"][e].get("sar_sem", {}).get(c)
        return None if a is None or b is None else float(np.hypot(a, b))

    return {
        f"high_minus_{p}_at_eps_{e}": {
            c: {"diff": hi[c] - doc["pools"][p]["eps"][e]["sar"][c], "se": se(p, c)} for c in hi
        }
        for p in ("low", "medium")
    }


def merge(paths: list[str], out: Path) -> None:
    """Merge the per-eps results of several runs (e.g. GPU sessions cut by a time budget)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    base = docs[0]
    for d in docs[1:]:
        if d["samples"] != base["samples"] or d["settings"]["members"] != base["settings"]["members"]:
            raise ValueError(f"runs differ in samples or members: {d['samples']} vs {base['samples']}")
        if d.get("coverages", list(COVERAGES)) != base.get("coverages", list(COVERAGES)):
            raise ValueError(f"runs differ in coverages: {d.get('coverages')} vs {base.get('coverages')}")
        for preset, rec in d["pools"].items():
            if preset not in base["pools"]:  # another process's pool (one process per pool)
                base["pools"][preset] = rec
                continue
            if abs(rec["accuracy"] - base["pools"][preset]["accuracy"]) > 1e-6:
                raise ValueError(
                    f"pool {preset} differs between runs (accuracy {rec['accuracy']} vs "
                    f"{base['pools'][preset]['accuracy']}): not the same trained pool"
                )
            base["pools"][preset]["eps"].update(rec["eps"])
    eps_done = sorted({float(e) for rec in base["pools"].values() for e in rec["eps"]})
    base["eps_done"] = eps_done
    base["merged_from"] = [str(p) for p in paths]
    base["provenance"] = provenance()  # the merge's command, commit, machine, date, load
    base["seconds"] = sum(d.get("seconds", 0.0) for d in docs)
    base["complete"] = len(eps_done) == 5
    base["claim_check"] = claim_check(base, eps_done)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sar_diversity.json").write_text(json.dumps(base, indent=2))
    per_sample = {
        (p, float(e)): np.asarray(r["per_sample_sar"])
        for p, rec in base["pools"].items()
        for e, r in rec["eps"].items()
        if "per_sample_sar" in r
    }
    plot(base, per_sample, eps_done, out)
    print(json.dumps(base["claim_check"], indent=1))
    print(f"merged {len(paths)} runs (eps {eps_done}) into {out}/sar_diversity.json")


def plot(doc: dict, per_sample: dict, eps_list: list[float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coverages = [float(c) for c in doc.get("coverages", COVERAGES)]
    fig, axes = plt.subplots(1, len(coverages), figsize=(4 * len(coverages), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, c in zip(axes, coverages):
        for preset, rec in doc["pools"].items():
            sar = [rec["eps"][f"{e:g}"]["sar"][f"{c:g}"] for e in eps_list]
            rob = [1 - rec["eps"][f"{e:g}"]["asr"] for e in eps_list]
            line = ax.plot(eps_list, sar, marker="o", label=f"{preset} SAR")[0]
            ax.plot(eps_list, rob, ls=":", color=line.get_color(), label=f"{preset} 1-ASR")
        ax.set_title(f"1-delta = {c:g}")
        ax.set_xlabel("eps (linf)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean SAR  /  1 - ASR")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sar_vs_eps.png", dpi=120)
    plt.close(fig)

    e = 0.05 if 0.05 in eps_list else eps_list[0]
    if not all((preset, e) in per_sample for preset in doc["pools"]):
        return  # per-sample SAR not recorded (older runs): no distribution plot
    fig, ax = plt.subplots(figsize=(5, 3.6))
    if 0.85 not in coverages:
        return
    j = coverages.index(0.85)
    bins = np.linspace(0, 1, 21)
    for preset in doc["pools"]:
        ax.hist(per_sample[(preset, e)][:, j], bins=bins, alpha=0.5, label=preset)
    ax.set_xlabel(f"per-sample SAR_0.85 at eps={e:g}")
    ax.set_ylabel("samples")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "sar_distribution.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
