"""The defense zoo's table: clean accuracy and AutoAttack robust accuracy at MNIST's standard radii.

Loads a zoo trained by ``sarjax train-defenses --out DIR`` (:func:`sarjax.defenses.zoo_io.load_zoo`)
and runs :func:`sarjax.attacks.autoattack.autoattack` on ``--samples`` test images (a seeded random subset) of the
embedded MNIST split at linf 0.3, linf 0.1, l2 2.0 and l1 10 (the issue's radii):

* the deterministic zoo-architecture defenses one by one (each a one-member stack,
  ``stacked=True``; defenses of one architecture share the compiled kernels), version
  ``standard``: a pool call would vmap every member over every image still robust for ANY
  member, so a defense broken early would keep paying for the robust ones' Square queries;
* the randomized defenses (Gaussian noise at inference, the self-ensemble's stochastic views) with
  version ``rand`` (APGD-CE + APGD-DLR, EOT over 20 draws; clean and robust accuracy by the
  majority over the draws, as AutoAttack's rand version).

``--attack apgd-ce`` runs APGD-CE alone (AutoAttack's first stage; an upper bound on AutoAttack's
robust accuracy), labelled as such. ``--quick``: 20 images, 10 iterations, 200 Square queries.
Writes JSON (with the run's provenance: command, commit, machine, date, load) and a markdown table:
``OUT.{json,md}`` for ``--out OUT`` (default: ``defense_zoo_table`` in a temporary folder, never
``benchmarks/results/``), rewritten after every (radius, defense) run, so an interrupted run leaves the rows it finished. ``--compile-cache DIR``: XLA's
persistent compilation cache (a rerun skips the compilations).

    python benchmarks/defense_zoo_table.py --zoo DIR [--samples 100] [--attack autoattack|apgd-ce]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's sarjax

from _timing import provenance, results_path  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

POINTS = (("linf", 0.3), ("linf", 0.1), ("l2", 2.0), ("l1", 10.0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zoo", nargs="+", default=None, help="directories written by sarjax train-defenses")
    ap.add_argument(
        "--merge", nargs="+", default=None, metavar="JSON", help="combine earlier runs' JSON files into one table"
    )
    ap.add_argument("--samples", type=int, default=100, help="test images (default 100)")
    ap.add_argument("--attack", choices=["autoattack", "apgd-ce"], default="autoattack")
    ap.add_argument("--quick", action="store_true", help="20 images, 10 iterations, 200 Square queries")
    ap.add_argument("--only", nargs="+", default=None, help="defenses to evaluate (default: all trained)")
    ap.add_argument("--points", nargs="+", default=None, help="e.g. linf:0.3 l2:2 (default: the four radii)")
    ap.add_argument(
        "--out", default=None, help="output stem (.json, .md; default: a temporary folder, never benchmarks/results/)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=None, help="rows per compiled call (default: autoattack's)")
    ap.add_argument("--compile-cache", default=None, help="XLA persistent compilation cache directory")
    args = ap.parse_args(argv)
    args.out = str(results_path("defense_zoo_table", args.out, quick=args.quick))
    if args.merge:
        return merge(args.merge, Path(args.out))
    if not args.zoo:
        ap.error("--zoo is required (or --merge)")

    import jax

    if args.compile_cache:
        jax.config.update("jax_compilation_cache_dir", str(Path(args.compile_cache).absolute()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

    from sarjax.attacks.autoattack import AutoAttackSettings, autoattack, autoattack_config
    from sarjax.data.mnist import load_mnist
    from sarjax.defenses.zoo import defense_names
    from sarjax.defenses.zoo_io import load_zoo

    load_before = os.getloadavg()
    n = 20 if args.quick else args.samples
    kw = {"n_iter": 10, "fab_iter": 10, "square_queries": 200} if args.quick else {}
    if args.attack == "apgd-ce":
        kw["attacks"] = ("apgd-ce",)
    if args.batch_size:
        kw["batch_size"] = args.batch_size
    points = POINTS
    if args.points:
        points = tuple((p.split(":")[0], float(p.split(":")[1])) for p in args.points)
    data = load_mnist()
    # a seeded random subset: the embedded test split is sorted by class
    idx = np.sort(np.random.default_rng(args.seed).permutation(len(data.x_test))[:n])
    x, y = data.x_test[idx], data.y_test[idx]
    models = {}
    for zd in args.zoo:
        avail = set(json.loads((Path(zd) / "zoo.json").read_text())["defenses"])
        order = args.only or [k for k in defense_names() if k in avail]  # the zoo's order (avail is a set)
        want = [k for k in order if k in avail and k not in models]
        models.update(load_zoo(zd, [k for k in want if k in set(defense_names())]))
    det = [k for k, m in models.items() if m.pool is not None and not m.stochastic]
    rand = [k for k, m in models.items() if m.stochastic]
    key = jax.random.key(args.seed)
    rows: dict[str, dict] = {k: {"clean_acc_zoo": m.info.get("clean_acc"), "robust": {}} for k, m in models.items()}
    runs = []
    t_all = time.perf_counter()
    what = "AutoAttack" if args.attack == "autoattack" else "APGD-CE only (AutoAttack's first stage)"
    cmd = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    stem = Path(args.out)
    stem.parent.mkdir(parents=True, exist_ok=True)

    def write(done: bool) -> dict:
        out = {
            "attack": what,
            "samples": n,
            "quick": args.quick,
            "settings": kw,
            "points": [f"{a} {b:g}" for a, b in points],
            "rows": rows,
            "runs": runs,
            "complete": done,
            "total_seconds": time.perf_counter() - t_all,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "command": cmd,
            "randomized": rand,
            "provenance": provenance(),  # command, commit, machine, date, load
        }
        stem.with_suffix(".json").write_text(json.dumps(out, indent=1, default=float))
        stem.with_suffix(".md").write_text(_markdown([out]))
        return out

    # the deterministic defenses at every radius first, then the randomized ones (EOT: 20x the cost)
    for pi, (norm, eps) in enumerate(points):
        label = f"{norm} {eps:g}"
        for j, k in enumerate(det):
            stack = models[k].pool.stacks[0]
            t0 = time.perf_counter()
            res = autoattack(
                stack.arch.apply,
                stack.params,
                x,
                y,
                attack=autoattack_config(norm, eps, **{kk: v for kk, v in kw.items() if kk != "batch_size"}),
                key=jax.random.fold_in(jax.random.fold_in(key, pi), j),
                settings=AutoAttackSettings(log=False, batch_size=kw.get("batch_size")),
                stacked=True,
                names=(k,),
            )
            dt = time.perf_counter() - t0
            runs.append({"point": label, "models": [k], "version": "standard", "seconds": dt, **res.to_json()})
            rows[k]["clean"] = float(res.clean_accuracy[0])
            rows[k]["robust"][label] = float(res.robust_accuracy[0])
            print(
                f"[{label}] {k}: clean {100 * res.clean_accuracy[0]:.1f}% robust {100 * res.robust_accuracy[0]:.1f}% "
                f"({dt:.0f} s; " + ", ".join(f"{s.name} {s.seconds:.0f} s" for s in res.log) + f"; load "
                f"{os.getloadavg()[0]:.1f})",
                flush=True,
            )
            write(False)
        print(f"[{label}] deterministic defenses done in {time.perf_counter() - t_all:.0f} s", flush=True)
        # drop this radius's compiled kernels: one process running all four radii on the 12 defenses
        # ran out of LLVM section memory (vm.max_map_count 65,530) in the l1 radius on 2026-12-02
        jax.clear_caches()
    for pi, (norm, eps) in enumerate(points):
        label = f"{norm} {eps:g}"
        for j, k in enumerate(rand):
            m = models[k]
            t0 = time.perf_counter()
            kw_r = {kk: v for kk, v in kw.items() if kk in ("n_iter", "batch_size")}
            if args.attack == "apgd-ce":
                kw_r["attacks"] = ("apgd-ce",)
            res = autoattack(
                m.stochastic_apply,
                m.params,
                x,
                y,
                attack=autoattack_config(norm, eps, "rand", **{kk: v for kk, v in kw_r.items() if kk != "batch_size"}),
                key=jax.random.fold_in(jax.random.fold_in(key, pi), 100 + j),
                settings=AutoAttackSettings(log=False, batch_size=kw_r.get("batch_size")),
                names=(k,),
            )
            dt = time.perf_counter() - t0
            runs.append({"point": label, "models": [k], "version": "rand", "seconds": dt, **res.to_json()})
            rows[k]["clean"] = float(res.clean_accuracy[0])
            rows[k]["robust"][label] = float(res.robust_accuracy[0])
            print(
                f"[{label}] {k} (rand): clean {100 * res.clean_accuracy[0]:.1f}% robust "
                f"{100 * res.robust_accuracy[0]:.1f}% ({dt:.0f} s; load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            write(False)
        print(f"[{label}] randomized defenses done in {time.perf_counter() - t_all:.0f} s", flush=True)
        jax.clear_caches()

    out = write(True)
    print(_markdown([out]))
    return 0


def _markdown(outs: list[dict]) -> str:
    """One table over several runs (rows and radii unioned; each run's command and load listed)."""
    labels = [f"{a} {b:g}" for a, b in POINTS]
    labels += [lb for o in outs for lb in o["points"] if lb not in labels]
    rows: dict[str, dict] = {}
    rand: set = set()
    for o in outs:
        rand |= set(o.get("randomized", []))
        for k, r in o["rows"].items():
            row = rows.setdefault(k, {"robust": {}})
            row["robust"].update(r["robust"])
            if "clean" in r:
                row["clean"] = r["clean"]
    o0 = outs[0]
    md = [
        f"{o0['attack']}, {o0['samples']} MNIST test images (seeded random subset of the embedded split); "
        "version standard, rand (EOT 20) for the randomized defenses; clean = the attack's clean accuracy on "
        "those images; robust accuracy in %.",
        "",
        "| defense | clean | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for k, r in rows.items():
        cells = [f"{100 * r['robust'][lb]:.1f}" if lb in r["robust"] else "-" for lb in labels]
        clean = f"{100 * r['clean']:.1f}" if "clean" in r else "-"
        md.append(f"| {k}{' (rand)' if k in rand else ''} | {clean} | " + " | ".join(cells) + " |")
    md.append("")
    for o in outs:
        md.append(
            f"- `{o['command']}`: {o['total_seconds']:.0f} s, load average {o['loadavg_before'][0]:.1f} before, "
            f"{o['loadavg_after'][0]:.1f} after"
        )
    return "\n".join(md) + "\n"


def merge(files: list[str], stem: Path) -> int:
    """Write ``stem.json`` / ``stem.md`` combining the JSON files of earlier runs."""
    outs = [json.loads(Path(f).read_text()) for f in files]
    stem.parent.mkdir(parents=True, exist_ok=True)
    merged = {"merged": files, "runs": outs, "provenance": provenance()}  # command, commit, machine, date, load
    stem.with_suffix(".json").write_text(json.dumps(merged, indent=1, default=float))
    md = _markdown(outs)
    stem.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
