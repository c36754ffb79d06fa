"""The whole ``sarjax frontier`` run: where its time goes, per attack, per kind of entry, per model.

Issue 17, item 5: "the whole frontier run (attack pool on 12 models x 1,000 images) on CPU
[...] with the time split per attack".  ``sarjax frontier`` records the wall time of every
(model, entry) run in ``OUT/frontier.json`` (``extra.attack_seconds``, kept for entries read
back from its cache).  This script either summarises such a run (``--from OUT``) or runs one
first (``--models ... --out OUT``, the CLI's options) and then summarises it:

* seconds per attack, per kind (base run, random restart, targeted run) and per model;
* per attack the median seconds of one (model, entry) run and ``median x runs``, a
  steady-state estimate; the rest of the total (``total - estimate``) is mostly compilation,
  paid by the first run of each (attack, targeted or not, architecture) in a process;
* microseconds per query at the median (queries = cap x images x members per run).

There is no baseline to alternate with (the run is the measurement); the load average before
and after is recorded, since the machine is shared, with the run's provenance (command, commit,
machine, date, load). The summary JSON goes to ``--json PATH`` (default: a temporary folder,
never ``benchmarks/results/``).

Usage::

    PYTHONPATH=. python benchmarks/frontier_run.py --from /work/zoo/h6-frontier-linf
    PYTHONPATH=. python benchmarks/frontier_run.py --quick --models /work/zoo/mnist --out /tmp/fr
    PYTHONPATH=. python benchmarks/frontier_run.py --models DIR... --norm linf --samples 1000 --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script


def _kind(entry: str) -> str:
    tail = entry.split("/", 1)[1] if "/" in entry else ""
    return "restart" if tail.startswith("r") else "targeted" if tail.startswith("t") else "base"


def summarise(report: dict) -> dict:
    """The time split of a ``frontier.json`` (as a dict)."""
    secs: dict[str, float] = report["extra"]["attack_seconds"]
    samples, cap = int(report["samples"]), int(report["cap"])
    by_attack: dict[str, list[float]] = {}
    by_kind: dict[str, float] = {}
    by_model: dict[str, float] = {}
    for k, v in secs.items():
        model, entry = k.split(":", 1)
        a = entry.split("/", 1)[0]
        by_attack.setdefault(a, []).append(v)
        by_kind[_kind(entry)] = by_kind.get(_kind(entry), 0.0) + v
        by_model[model] = by_model.get(model, 0.0) + v
    total = float(sum(secs.values()))
    members = len(report["models"]) / max(1, len(by_model))  # members per cached model folder
    attacks = {}
    for a, vs in sorted(by_attack.items()):
        med = statistics.median(vs)
        attacks[a] = dict(
            runs=len(vs),
            seconds=float(sum(vs)),
            share=float(sum(vs)) / total if total else 0.0,
            median_run_seconds=med,
            steady_estimate_seconds=med * len(vs),
            first_call_overhead_seconds=float(sum(vs)) - med * len(vs),
            us_per_query_at_median=1e6 * med / (cap * samples * members),
        )
    return dict(
        norm=report["norm"],
        models=len(report["models"]),
        samples=samples,
        cap=cap,
        entries=len(report["entries"]),
        total_attack_seconds=total,
        by_attack=attacks,
        by_kind=by_kind,
        by_model=by_model,
    )


def aoi_vs_budget(src: Path, report: dict, budgets) -> list[dict]:
    """Figure 2's curve at more budgets than the report's tiers: Algorithm 1 fitted on the
    report's train models at every budget (nested), the train and held-out AOI, rebuilt from
    the run's cached trajectories (no attack runs)."""
    import numpy as np

    from sarjax.experiments.frontier_io import load_models, safe_name
    from sarjax.frontier import PoolEntry, TrajectoryPool, nested_allocations

    entries = report["entries"]
    pe = tuple(PoolEntry(e["name"], e["kind"], e["base"], e["rank"]) for e in entries)
    trajs = []
    if "pools" in report["extra"]:  # the run's pools in order, with their cache folders (--models and --model alike)
        tags = [p["cache"] for p in report["extra"]["pools"].values()]
    else:  # a report written before "pools": its --models directories (a zoo may have grown: the run's models)
        names = set(report["models"])
        tags = [m.tag for m in load_models(report["extra"]["models_dirs"]) if set(m.member_names) <= names]
    for tag in tags:
        c = src / "cache" / tag
        t = np.stack([np.load(c / f"{safe_name(e['name'])}.npz")["trajectory"] for e in entries])  # [A, B, M, L]
        trajs.append(np.transpose(t, (2, 0, 1, 3)))
    pool = TrajectoryPool(np.concatenate(trajs), pe, cap=int(report["cap"]), every=int(report["every"]))
    train, held = np.asarray(report["train"]), np.asarray(report["heldout"])
    rows = []
    for al in nested_allocations(pool, budgets, models=train, chains=bool(report.get("chains", False))):
        rows.append(
            dict(
                budget=al.budget,
                used=al.used,
                train_aoi=float(pool.aoi(al.q, train)),
                heldout_aoi=float(pool.aoi(al.q, held)) if len(held) else None,
                entries=len(al.ensemble),
            )
        )
    return rows


def markdown(report: dict) -> str:
    """The reproduction tables of the frontier paper from a ``frontier.json``: Figure 2's train / held-out
    AOI per tier, Tables 4 and 6 (per model AOI and robust accuracy at ``eps_ref``, ensemble
    vs the fixed-eps attack scored as a curve), Table 7 (DOI per tier), Figure 5's rank changes."""
    tiers = report["tiers"]
    held = set(report["heldout"])
    names = report["models"]
    aa = report["extra"].get("autoattack")
    out = ["| tier | used | train AOI (%) | held-out AOI (%) |", "|---|---|---|---|"]
    for t in tiers:
        h = "-" if t["heldout_aoi"] is None else f"{100 * t['heldout_aoi']:.2f}"
        out.append(f"| {t['budget']} | {t['used']} | {100 * t['train_aoi']:.2f} | {h} |")
    out.append("")
    head = " | ".join(f"AOI {t['budget'] // 1000}k" for t in tiers)
    acc_head = " | ".join(f"rob. acc. {t['budget'] // 1000}k" for t in tiers)
    cols = f"| model | split | clean | eps_min | {head} |"
    if aa:
        cols += f" fixed-eps AOI | {acc_head} | fixed-eps rob. acc. | its queries at eps_ref |"
    out.append(cols)
    out.append("|" + "---|" * (cols.count("|") - 1))
    for i, n in enumerate(names):
        row = f"| {n} | {'held-out' if i in held else 'train'} | {100 * report['clean_accuracy'][i]:.1f} | "
        row += f"{report['eps_min'][i]:.4f} | " + " | ".join(f"{100 * t['model_aoi'][i]:.2f}" for t in tiers) + " |"
        if aa:
            a = aa["models"][n]
            ref = aa["eps_ref"]
            k = min(range(len(a["eps"])), key=lambda j: abs(a["eps"][j] - ref))
            accs = " | ".join(f"{100 * r['ensemble_accuracy_at_ref'][i]:.1f}" for r in aa["tiers"])
            row += f" {100 * a['aoi']:.2f} | {accs} | {100 * a['accuracy'][k]:.1f} | {a['cost_ref']:.0f} |"
        out.append(row)
    if aa:
        out.append("")
        for r in aa["tiers"]:
            out.append(
                f"- tier {r['budget']}: ensemble AOI >= the fixed-eps attack's on {r['aoi_matches_or_exceeds']} of "
                f"{len(names)} models ({r['heldout_aoi_matches_or_exceeds']} of {len(held)} held-out); robust accuracy "
                f"at eps_ref {aa['eps_ref']} <= its on {r.get('accuracy_matches_or_exceeds', '-')} of {len(names)}"
            )
        secs = aa.get("seconds") or {}
        if secs:
            out.append(
                "- AutoAttack wall time per model (its whole eps grid, as measured when it ran): "
                + ", ".join(f"{k}: {v:.0f} s" if v is not None else f"{k}: -" for k, v in secs.items())
            )
    out.append("")
    out.append("| model | " + " | ".join(f"DOI {t['budget'] // 1000}k (rank)" for t in tiers) + " |")
    out.append("|---|" + "---|" * len(tiers))
    ranks = []
    for t in tiers:
        order = sorted(range(len(names)), key=lambda j: -t["doi"][j])
        ranks.append({j: r + 1 for r, j in enumerate(order)})
    for i, n in enumerate(names):
        out.append(f"| {n} | " + " | ".join(f"{t['doi'][i]:.3f} ({rk[i]})" for t, rk in zip(tiers, ranks)) + " |")
    tau = report["doi_tau"]
    out.append("")
    out.append(f"- DOI ranking, Kendall tau between the first and the last tier: {tau[0][-1]:.3f}")
    rk = report.get("rank")
    if rk:
        taus = [v for i, row in enumerate(rk["tau"]) for j, v in enumerate(row) if j > i and v == v]
        out.append(
            f"- single-eps rankings ({rk['source']}) at {len(rk['eps'])} eps from {rk['eps'][0]:.3f} to "
            f"{rk['eps'][-1]:.3f}: per-model largest rank change {dict(zip(names, rk['shift']))}; "
            f"{sum(s >= 2 for s in rk['shift'])} models move by >= 2 ranks; smallest Kendall tau between two grid "
            f"points {min(taus) if taus else float('nan'):.3f}"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", default=None, help="summarise OUT/frontier.json of an earlier run")
    ap.add_argument("--quick", action="store_true", help="a tiny run: 4 images, cap 100, FMN, 1 restart, 1 target")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--norm", default="linf")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--out", default=None, help="the frontier run's output directory (with --models)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `sarjax frontier` options")
    ap.add_argument("--budgets", type=int, nargs="*", default=None, help="also the AOI vs budget curve (Figure 2)")
    ap.add_argument("--markdown", action="store_true", help="also print the reproduction tables (markdown)")
    ap.add_argument(
        "--json", default=None, help="summary JSON path (default: a temporary folder, never benchmarks/results/)"
    )
    args = ap.parse_args(argv)
    args.json = str(results_path("frontier_run.json", args.json, quick=args.quick))
    load0 = os.getloadavg()
    t0 = time.time()
    if args.src is None:
        if not args.models or not args.out:
            ap.error("give --from OUT, or --models DIR... and --out OUT")
        from sarjax.cli import main as cli

        cmd = ["frontier", "--models", *args.models, "--norm", args.norm, "--out", args.out, "--no-progress"]
        if args.quick:
            cmd += ["--samples", "4", "--cap", "100", "--attacks", "fmn", "--restarts", "1", "--targeted", "1"]
            cmd += ["--tiers", "100", "200"]
        else:
            cmd += ["--samples", str(args.samples)]
        cli(cmd + list(args.extra))
        src = Path(args.out)
    else:
        src = Path(args.src)
    report = json.loads((src / "frontier.json").read_text())
    out = dict(
        command="python benchmarks/frontier_run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        source=str(src),
        wall_seconds_this_call=time.time() - t0,
        load_before=load0,
        load_after=os.getloadavg(),
        **summarise(report),
        provenance=provenance(),  # command, commit, machine, date, load
    )
    for a, r in out["by_attack"].items():
        print(
            f"{a:>14}: {r['seconds']:8.1f} s ({100 * r['share']:4.1f}%), {r['runs']} runs, median {r['median_run_seconds']:.1f} s, "
            f"first-call overhead {r['first_call_overhead_seconds']:.0f} s, {r['us_per_query_at_median']:.1f} us/query"
        )
    print(
        f"by kind: { {k: round(v, 1) for k, v in out['by_kind'].items()} }; total {out['total_attack_seconds']:.0f} s"
    )
    if args.budgets:
        out["aoi_vs_budget"] = aoi_vs_budget(src, report, sorted(args.budgets))
        for r in out["aoi_vs_budget"]:
            h = "-" if r["heldout_aoi"] is None else f"{r['heldout_aoi']:.4f}"
            print(f"budget {r['budget']:>6}: used {r['used']:>6}, train AOI {r['train_aoi']:.4f}, held-out AOI {h}")
    if args.markdown:
        print(markdown(report))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"load {load0} -> {out['load_after']}; wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
