"""The scale table of docs/scale.md: ``sarjax plan`` on four runs at full size (projections).

Each row is one ``sarjax plan`` command in its own process (its own fake CPU devices, no
persistent compilation cache: cold compiles), with the plan's JSON kept whole; ``--render`` writes the table into docs/scale.md between its markers,
``--render --check`` fails when the page is not what the JSON renders (a test runs it).

Rows (docs/scale.md says what each models):

- SAR of 20 x WRN-28-10 (RobustBench's DMWideResNet shape) on 10,000 CIFAR-10 images, eps 8/255,
  joint PGD 40 steps x 3 restarts (the demo's, the SAR paper's Table 1), greedy rounds up to 20;
- the frontier paper's linf pool (FMN, PDPGD, APGD-min CE / DLR, FAB: 1 + 5 restarts + 9
  targets each, 75 entries, a cap of 1,000 queries) on 12 WRN-28-10 x 1,000 images, as 500
  gradient steps per entry (a forward and a backward are 2 queries) of every member;
- AutoAttack standard (linf 8/255) on one WRN-28-10 x 10,000 images (every sample through every
  stage: an upper bound);
- LLM SAR, joint GCG on 4 x Llama-3-8B-shaped members (bf16), 100 behaviors, 20 steps per round,
  up to 4 rounds.

Usage:
  python benchmarks/scale_table.py [--rows sar frontier autoattack llm] [--out FILE]
  python benchmarks/scale_table.py --render benchmarks/results/scale_table.json [--check]   # docs/scale.md
  (``--render`` also renders benchmarks/results/plan_validation.json's ratios: ``--validation``)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "scale.md"
BEGIN, END = "<!-- scale-table:begin (benchmarks/scale_table.py --render) -->", "<!-- scale-table:end -->"

# Llama-3-8B's shape (Meta's config.json for meta-llama/Meta-Llama-3-8B)
LLAMA3_8B = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip

ROWS = {
    "sar": ("SAR, joint PGD: 20 x WRN-28-10, 10,000 CIFAR-10 images",
            ["--zoo", "wrn-28-10:20", "--attack", "joint-pgd", "--steps", "40", "--restarts", "3", "--samples", "10000",
             "--rounds", "20", "--batch", "256", "--device", "h100-80gb", "--devices", "8", "--mesh", "pool=4,data=2"]),
    "frontier": ("Frontier linf pool: 12 x WRN-28-10, 1,000 images",
                 ["--zoo", "wrn-28-10:12", "--attack", "joint-pgd", "--steps", "500", "--restarts", "75",
                  "--samples", "1000", "--rounds", "1", "--batch", "256", "--device", "h100-80gb", "--devices", "8",
                  "--mesh", "pool=4,data=2"]),
    "autoattack": ("AutoAttack standard: 1 x WRN-28-10, 10,000 images",
                   ["--zoo", "wrn-28-10:1", "--attack", "autoattack", "--samples", "10000", "--batch", "512",
                    "--device", "h100-80gb", "--devices", "8", "--mesh", "data=8"]),
    "llm": ("LLM SAR, joint GCG: 4 x Llama-3-8B (bf16), 100 behaviors",
            ["--attack", "joint-gcg", "--samples", "100", "--rounds", "4", "--batch", "4", "--device", "h100-80gb",
             "--devices", "8", "--mesh", "pool=4,model=2,data=1", "--dtype", "bfloat16"]),
}  # fmt: skip

RECIPE = {
    "sar": "sarjax sar --model PKG.MODULE:FUNCTION --devices pool=4,data=2 --coordinator HOST:PORT "
    "--num-processes N --process-id I ...",
    "frontier": "sarjax frontier --model PKG.MODULE:FUNCTION --coordinator HOST:PORT --num-processes N "
    "--process-id I ...",
    "autoattack": "sarjax autoattack --model PKG.MODULE:FUNCTION --coordinator HOST:PORT --num-processes N "
    "--process-id I ...",
    "llm": "sarjax llm-sar --pool DIR DIR DIR DIR --attack gcg --coordinator HOST:PORT --num-processes N "
    "--process-id I ...",
}


def run_rows(names: list[str], work: Path) -> dict:
    rows = {}
    cfg_dir = work / "llama3-8b"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    (cfg_dir / "config.json").write_text(json.dumps(LLAMA3_8B))
    for name in names:
        title, argv = ROWS[name]
        shown = argv
        if name == "llm":  # the page shows a folder name: Meta's config.json (LLAMA3_8B) in llama3-8b/
            shown = ["--llm-config", *["llama3-8b"] * 4, *argv]
            argv = ["--llm-config", *[str(cfg_dir)] * 4, *argv]
        out = work / f"{name}.json"
        cmd = [sys.executable, "-m", "sarjax.cli", "plan", *argv, "--out", str(out), "--overwrite"]
        t0 = time.perf_counter()
        # no persistent compilation cache: each plan's compile times are cold, as on a fresh machine
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "SARJAX_NO_COMPILE_CACHE": "1"}
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        secs = time.perf_counter() - t0
        print(r.stdout, flush=True)
        if r.returncode != 0:
            raise SystemExit(f"row {name} failed:\n{r.stderr[-3000:]}")
        rows[name] = {"title": title, "argv": ["sarjax", "plan", *shown], "seconds_to_plan": secs,
                      "plan": json.loads(out.read_text())}  # fmt: skip
    return rows


def _h(sec: float) -> str:
    return f"{sec / 3600:.3g} h" if sec >= 3600 else f"{sec / 60:.3g} min" if sec >= 60 else f"{sec:.3g} s"


def render(data: dict, validation: dict | None = None) -> str:
    """The table, the commands, the validation ratios (from ``validation``, plan_validation.py's
    JSON) and the multi-host recipes, between the page's markers."""
    lines = [
        BEGIN,
        "",
        "| run | devices | mesh | memory per device (projection) | largest batch (projection) | time (projection) "
        "| bound | FLOPs per device and step (projection) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"].values():
        p = row["plan"]
        dev = p["device"]["label"]
        bounds = sorted({r["roofline_step"]["bound"] for r in p["programs"]})
        lb = p.get("largest_batch", {}).get("batch")
        flops = ", ".join(f"{r['name']}: {r['flops']:.3g}" for r in p["programs"])
        lines.append(
            f"| {row['title']} | {p['settings']['devices']} x {dev} | {p['mesh_label']} | "
            f"{p['memory_per_device'] / 1e9:.3g} GB at batch {p['settings']['batch']} "
            f"({'fits' if p['fits'] else 'does not fit'}) | {lb} | {_h(p['run_seconds']['seconds'])} | "
            f"{', '.join(bounds)} | {flops} |"
        )
    prov = data["provenance"]
    lines += [
        "",
        f"Generated from `benchmarks/results/scale_table.json` (commit {prov['commit']}, {prov['date']}, "
        f"{prov['machine']['processor']}, load average {', '.join(f'{x:.1f}' for x in prov['load'])}); every "
        "figure in the table is a projection. The commands, the time each plan took here (all its compiles, "
        "in a fresh process) and how each step's cost was counted:",
        "",
    ]
    for row in data["rows"].values():
        how = "; ".join(sorted({r["cost_from"] for r in row["plan"]["programs"]}))
        compiles = sum(r["compile_seconds"] for r in row["plan"]["programs"])
        lines.append(
            f"- {row['title']}: `{' '.join(row['argv'])}` (planned in {row['seconds_to_plan']:.0f} s, of which "
            f"{compiles:.0f} s analysing the step at the planned batch; cost: {how})"
        )
    if validation is not None:
        vp = validation["provenance"]
        lines += [
            "",
            "How good is the method? `benchmarks/plan_validation.py` builds three step programs as `sarjax plan` "
            "does (one CPU device) and runs them here: measured / projected. Memory: XLA's `memory_analysis` "
            "against the arguments' bytes plus the resident-memory rise of the step's first run (and that rise against "
            "output + temp - alias); time: the roofline with this CPU's peak and bandwidth measured around the "
            "timed steps (a float32 matmul, an in-place update) against the median warm step. From "
            f"`benchmarks/results/plan_validation.json` (commit {vp['commit']}, {vp['date']}, load average at the "
            f"end {', '.join(f'{x:.1f}' for x in vp['load'])}: a shared 2-core machine, so the timings are under "
            "load):",
            "",
            "| step | memory measured / projected | step's rise measured / projected | step time measured "
            "| this CPU (calibrated) | roofline (projection) | time measured / projected |",
            "|---|---|---|---|---|---|---|",
        ]
        for v in validation["rows"].values():
            r, m, c = v["ratios"], v["measured"], v["cpu"]
            rise = "n/a" if r["rise_ratio"] is None else f"{r['rise_ratio']:.2f}"
            lines.append(
                f"| {v['description']} | {r['memory_ratio']:.2f} | {rise} | {m['step_seconds_median'] * 1e3:.1f} ms "
                f"| {c['peak_flops'] / 1e9:.0f} GFLOP/s, {c['bandwidth'] / 1e9:.1f} GB/s "
                f"| {r['roofline']['seconds'] * 1e3:.2f} ms ({r['roofline']['bound']}-bound) | {r['time_ratio']:.1f} |"
            )
    lines += ["", "Multi-host recipes (every host runs the same command with its own `--process-id`):", ""]
    for name, row in data["rows"].items():
        lines.append(f"- {row['title']}: `{RECIPE[name]}`")
    lines += ["", END]
    return "\n".join(lines)


def render_page(source: str, check: bool, validation: str | None = None) -> int:
    data = json.loads(Path(source).read_text())
    val = json.loads(Path(validation).read_text()) if validation else None
    page = PAGE.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{PAGE}: the markers {BEGIN!r} and {END!r} are missing")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + render(data, val) + tail
    if check:
        if new != page:
            print(f"{PAGE} is out of date: run python benchmarks/scale_table.py --render JSON", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    print(f"wrote {PAGE}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    ap.add_argument(
        "--render",
        default=None,
        metavar="JSON",
        help="write docs/scale.md's table from this JSON (the committed one: benchmarks/results/scale_table.json)",
    )
    ap.add_argument("--check", action="store_true", help="with --render: fail if docs/scale.md is out of date")
    ap.add_argument(
        "--validation",
        default=None,
        metavar="JSON",
        help="with --render: benchmarks/plan_validation.py's JSON, its ratios rendered under the table (default: "
        "plan_validation.json beside the --render JSON; '' for none)",
    )
    args = ap.parse_args()
    if args.render:
        validation = (
            str(Path(args.render).with_name("plan_validation.json")) if args.validation is None else args.validation
        )
        return render_page(args.render, args.check, validation or None)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _timing import provenance, results_path

    out = results_path("scale_table.json", args.out)
    rows = run_rows(args.rows, Path(tempfile.mkdtemp(prefix="sarjax-scale-")))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "provenance": provenance()}, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
