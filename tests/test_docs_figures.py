"""No hand-typed measurement in the guides, and every quoted result carries provenance (issues 42
item 4, 43 item 3).

A measured figure (a time, a speed, a ratio, a rate, an accuracy a benchmark measured) reaches
README.md or a guide in docs/ only through a generated block (``<!-- KIND:begin ... -->`` ...
``<!-- KIND:end -->``, filled by a script and compared with a re-render by a test: :data:`GENERATED`)
or as a link to its section of the generated results page (docs/results.md, whose dated notes hold
the prose reading of each run). :func:`figures` finds the candidates: numbers followed by ``x``,
``s``, ``ms``, ``%``, ``pp`` or a ``/s`` rate, outside generated blocks, ```python blocks (which CI
runs: their outputs are known answers) and inline code. What is not a measurement (a tolerance a
test asserts, an algorithm's constant, a default) is listed in :data:`ALLOWED` with its reason;
an entry that no longer matches anything fails, so the list stays small.

Every results file the guides, the dated notes or the headline table quote records its
provenance (command, commit, machine, date, load), or waits in :data:`RERUN` for the lead to rerun
it with the command given there (an entry whose file has provenance now, or that nothing quotes,
fails: take it out).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NOTES = RESULTS / "notes"
GUIDES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "results.md")]

# Generated blocks: their kind, and the test that re-renders and compares each.
GENERATED = {
    "scale-table": "tests/experiments/test_scale_page.py (benchmarks/scale_table.py --render)",
    "results": "tests/test_docs_figures.py (scripts/render_results.py --docs)",
}
BLOCK = re.compile(r"<!--\s*([a-z][a-z0-9-]*):begin\b.*?-->(.*?)<!--\s*\1:end\s*-->", re.S)

FIGURE = re.compile(
    r"(?<![\w.])("
    r"x\d+\.\d+\b"  # x10.5 (not a name such as x0)
    r"|\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?\s?x\b(?!\s?\d)"  # 1.5x, 2-3x (not 5 x 5)
    r"|\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?\s?(?:ms|us|µs|s|min|minutes|h|hours|seconds|pp|CPU s|CPU seconds)\b"  # 3 s, 12 ms, 3 minutes
    r"|\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?\s?%"  # 72.0%, 26-32 %
    r"|\d[\d,]*(?:\.\d+)?\s?(?:[A-Za-z]+)/s\b"  # 5.39 images/s, 41 GFLOP/s
    r")"
)

# (page, pattern the figure's line matches, why it is not a measurement)
ALLOWED: list[tuple[str, str, str]] = [
    (
        "docs/attacks.md",
        r"batch size 1-5 x member",
        "a dimension of the property test's draws (batch size x member mask)",
    ),
    (
        "docs/autoattack.md",
        r"30 / 30 / 40 % of the",
        "AutoAttack's constant: the share of iterations of each use_largereps phase",
    ),
    ("docs/cover.md", r"heartbeat timeout \(100 s\)", "the distributed runtime's default timeout"),
    (
        "docs/cover.md",
        r"compile in under 1 s are not written",
        "the cache's threshold (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS)",
    ),
    (
        "docs/exact_optima.md",
        r"test accuracy|\(seed 1, 91\.6%\)",
        "the committed fixture nets' accuracies (tests/frontier/fixtures/exact_optima.json), fixed with the weights",
    ),
    ("docs/exact_optima.md", r"The radius `r`: 1\.01x", "the script's setting: the radius's margin over FMN's norm"),
    ("docs/exact_optima.md", r"shrinks by 1%", "the script's setting: when the bounds are recomputed"),
    ("docs/exact_optima.md", r"the count within 1\.02x", "score()'s threshold (issue 17's goal)"),
    (
        "docs/frontier.md",
        r"stays at 1\.033x for this reason|12k tier within 1\.02x|measured 1\.0006x|l1 1\.0053x",
        "ratios of the committed exact-optima fixtures, asserted (bounds) by tests/frontier/test_exact_optima_frontier.py",
    ),
    (
        "docs/frontier.md",
        r"exact on 80% of 40|on 76\.4% of 500|50/90/99/100% of",
        "deterministic outputs of the seeded allocation test (tests/frontier/test_frontier_allocation.py prints them)",
    ),
    ("docs/llm.md", r"20% quantile", "the ranking key of the SAR paper's AutoDAN search (an algorithm constant)"),
    ("docs/llm.md", r"60-100% of the behaviors", "the llm-demo members' data mixes (settings)"),
    ("docs/llm.md", r"meshes pool=2 x model=2 x data=2", "mesh shapes (pool x model x data)"),
    (
        "docs/minnorm.md",
        r"known-answer tested \(|tested at|ALMA's reach at its",
        "tolerances the known-answer tests assert (tests/minnorm/), not measurements",
    ),
    (
        "docs/minnorm.md",
        r"^\| (ALMA|PDGD|APGD-min) \| ",
        "the table of defaults and their sources (decay factors, checkpoints)",
    ),
    (
        "docs/scale.md",
        r"bytes accessed to 5%",
        "the tolerance tests/experiments asserts for the layer-extrapolated cost",
    ),
]


# Results files quoted (by a guide, a dated note, the headline table or a results block) that do not
# record their provenance yet: the lead reruns each with this command (ZOO: a `sarjax train-defenses`
# directory; DEMO: a `sarjax demo` output; OUT: a fresh output folder), then deletes its entry.
RERUN: dict[str, str] = {
    "adv_training_throughput.json": (
        "python benchmarks/adv_training_throughput.py --out benchmarks/results/adv_training_throughput.json"
    ),
    "autoattack_vs_torch.json": (
        "python benchmarks/autoattack_vs_torch.py --pgd-at --train-eps 0.1 --epochs 2 --samples 200 --eps 0.1 --iters 10 --repeats 1 --batch-size 50 --threads 2 --out benchmarks/results/autoattack_vs_torch.json"
    ),
    "autoattack_vs_torch_pgd-at-l2-1.5.json": (
        "python benchmarks/autoattack_vs_torch.py --zoo ZOO --defense pgd-at-l2-1.5 --norm l2 --eps 2.0 --samples 200 --iters 10 --repeats 0 --batch-size 250 --threads 2 --arbiter --out benchmarks/results/autoattack_vs_torch_pgd-at-l2-1.5.json"
    ),
    "autoattack_vs_torch_pgd-at-linf-0.3.json": (
        "python benchmarks/autoattack_vs_torch.py --zoo ZOO --defense pgd-at-linf-0.3 --eps 0.3 --samples 200 --iters 10 --repeats 1 --batch-size 250 --threads 2 --out benchmarks/results/autoattack_vs_torch_pgd-at-linf-0.3.json"
    ),
    "autoattack_vs_torch_pgd-at-linf-0.3_quiet.json": (
        "python benchmarks/autoattack_vs_torch.py --zoo ZOO --defense pgd-at-linf-0.3 --eps 0.3 --samples 200 --iters 10 --repeats 3 --batch-size 250 --threads 1 2 --out benchmarks/results/autoattack_vs_torch_pgd-at-linf-0.3_quiet.json"
    ),
    "autoattack_vs_torch_trades-linf-0.1.json": (
        "python benchmarks/autoattack_vs_torch.py --zoo ZOO --defense trades-linf-0.1 --eps 0.1 --samples 200 --iters 10 --repeats 0 --batch-size 250 --threads 2 --arbiter --out benchmarks/results/autoattack_vs_torch_trades-linf-0.1.json"
    ),
    "beast_call.json": (
        "sarjax llm-demo --out OUT && python benchmarks/beast_call.py --pool-dir OUT/pool_before --out benchmarks/results/beast_call.json"
    ),
    "defense_zoo_table_autoattack.json": (
        "sarjax train-defenses --out ZOO && python benchmarks/defense_zoo_table.py --zoo ZOO --attack autoattack --samples 100 --out benchmarks/results/defense_zoo_table_autoattack.json"
    ),
    "eot_noise_defense.json": (
        "python benchmarks/eot_noise_defense.py --out benchmarks/results/eot_noise_defense.json"
    ),
    "exact_optima_frontier.json": ("PYTHONPATH=. python scripts/exact_optima_frontier.py"),
    "fab_projection_speed_32.json": (
        "python benchmarks/fab_projection_speed.py --samples 32 --reps 2 --norms linf --out benchmarks/results/fab_projection_speed_32.json"
    ),
    "frontier_run_zoo_l1_fullaa12.json": (
        "python benchmarks/frontier_run.py --from OUT_L1_FULLAA --json benchmarks/results/frontier_run_zoo_l1_fullaa12.json (OUT_L1_FULLAA: the run of frontier_zoo_l1_fullaa12.json)"
    ),
    "frontier_run_zoo_l2_fullpool12.json": (
        "python benchmarks/frontier_run.py --from OUT_L2_FULLPOOL --json benchmarks/results/frontier_run_zoo_l2_fullpool12.json (OUT_L2_FULLPOOL: the run of frontier_zoo_l2_fullpool12.json)"
    ),
    "frontier_run_zoo_linf.json": (
        "python benchmarks/frontier_run.py --from OUT_LINF30 --markdown --budgets 1000 2000 3000 4000 6000 8000 10000 12000 15000 --json benchmarks/results/frontier_run_zoo_linf.json (OUT_LINF30: the run of frontier_zoo_linf.json)"
    ),
    "frontier_run_zoo_linf_100_quiet.json": (
        "python benchmarks/frontier_run.py --from OUT_LINF100 --json benchmarks/results/frontier_run_zoo_linf_100_quiet.json (OUT_LINF100: the run of frontier_zoo_linf_100_quiet.json)"
    ),
    "frontier_run_zoo_linf_30_quiet.json": (
        "python benchmarks/frontier_run.py --from OUT_LINF30 --json benchmarks/results/frontier_run_zoo_linf_30_quiet.json (OUT_LINF30: the 30-image run of frontier_zoo_linf.json)"
    ),
    "frontier_zoo_l1_apgdce12.json": (
        "sarjax frontier --models /work/zoo/mnist --norm l1 --attacks fmn,alma,pdpgd,apgd_min_ce,apgd_min_dlr,fab --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 10 --aa-attacks apgd-ce --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_l1_apgdce12.json"
    ),
    "frontier_zoo_l1_fullaa12.json": (
        "sarjax frontier --models /work/zoo/mnist --norm l1 --attacks fmn,alma,pdpgd,apgd_min_ce,apgd_min_dlr,fab --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 10 --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_l1_fullaa12.json"
    ),
    "frontier_zoo_l2_autoattack12.json": (
        "sarjax frontier --models /work/zoo/mnist --norm l2 --attacks fmn,ddn,fab --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 2.0 --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_l2_autoattack12.json"
    ),
    "frontier_zoo_l2_fullpool12.json": (
        "sarjax frontier --models /work/zoo/mnist --norm l2 --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 2.0 --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_l2_fullpool12.json"
    ),
    "frontier_zoo_linf.json": (
        "sarjax frontier --models /work/zoo/mnist --norm linf --attacks fmn,apgd_min_ce,fab --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 0.1 --aa-attacks apgd-ce --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_linf.json"
    ),
    "frontier_zoo_linf_100_quiet.json": (
        "sarjax frontier --models /work/zoo/mnist --norm linf --attacks fmn,apgd_min_ce,fab --restarts 1 --targeted 3 --samples 100 --batch 100 --autoattack --eps-ref 0.1 --aa-attacks apgd-ce --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_linf_100_quiet.json"
    ),
    "frontier_zoo_linf_autoattack.json": (
        "sarjax frontier --models /work/zoo/mnist --defenses standard-cnn,pgd-at-linf-0.1 --norm linf --attacks fmn,apgd_min_ce,fab --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 0.1 --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_linf_autoattack.json"
    ),
    "frontier_zoo_linf_autoattack12.json": (
        "sarjax frontier --models /work/zoo/mnist --norm linf --attacks fmn,apgd_min_ce,fab --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 0.1 --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_linf_autoattack12.json"
    ),
    "frontier_zoo_linf_autoattack3.json": (
        "sarjax frontier --models /work/zoo/mnist --defenses standard-cnn,pgd-at-linf-0.1,pgd-at-linf-0.3 --norm linf --attacks fmn,apgd_min_ce,fab --restarts 1 --targeted 3 --samples 30 --batch 30 --autoattack --eps-ref 0.1 --out OUT; then cp OUT/frontier.json benchmarks/results/frontier_zoo_linf_autoattack3.json"
    ),
    "gemm_roofline.json": ("python benchmarks/gemm_roofline.py --out benchmarks/results/gemm_roofline.json"),
    "joint_attack_throughput_intel.json": (
        "python benchmarks/joint_attack_throughput.py --families mlp cnn --conv-impls fused --steps 10 --reps 3 --out benchmarks/results/joint_attack_throughput_intel.json (on a 2-core Intel Xeon with AVX-512)"
    ),
    "llm_demo.json": ("sarjax llm-demo --out OUT; then cp OUT/demo.json benchmarks/results/llm_demo.json"),
    "minnorm_vs_advlib.json": (
        "python benchmarks/minnorm_vs_advlib.py --n 32 --queries 400 --out benchmarks/results/minnorm_vs_advlib.json"
    ),
    "minnorm_vs_advlib_l0_nosort.json": (
        "python benchmarks/minnorm_vs_advlib.py --n 32 --queries 400 --attacks fmn,pdpgd,sigma_zero --out benchmarks/results/minnorm_vs_advlib_l0_nosort.json"
    ),
    "minnorm_vs_advlib_quick.json": (
        "python benchmarks/minnorm_vs_advlib.py --quick --out benchmarks/results/minnorm_vs_advlib_quick.json"
    ),
    "note_chained_rounds_stronger.json": (
        "python benchmarks/note_chained_rounds.py --zoo ZOO/se --samples 100 --eps 0.1 --stronger-only --out benchmarks/results/note_chained_rounds_stronger.json"
    ),
    "pdpgd_prox_speed.json": (
        "python benchmarks/pdpgd_prox_speed.py --quick --out benchmarks/results/pdpgd_prox_speed.json"
    ),
    "pdpgd_prox_speed_32.json": (
        "python benchmarks/pdpgd_prox_speed.py --samples 32 --reps 2 --out benchmarks/results/pdpgd_prox_speed_32.json"
    ),
    "projection_speed.json": (
        "PYTHONPATH=. python benchmarks/projection_speed.py --reps 5 --inner 10 --out benchmarks/results/projection_speed.json"
    ),
    "projection_speed_h200.json": (
        "PYTHONPATH=. python benchmarks/projection_speed.py --batch 256 4096 --reps 5 --inner 20 --out benchmarks/results/projection_speed_h200.json (on an H200)"
    ),
    "projection_speed_l0_nosort.json": (
        "PYTHONPATH=. python benchmarks/projection_speed.py --reps 3 --inner 10 --out benchmarks/results/projection_speed_l0_nosort.json"
    ),
    "sar_distillation_cpu": (
        "python benchmarks/sar_distillation.py --samples 60 --transfer 12000 --distill-epochs 3 --eps 0.1 --out benchmarks/results/sar_distillation_cpu"
    ),
    "sar_diversity_cpu100": (
        "python benchmarks/sar_diversity.py --samples 100 --eps 0.2 0.15 0.02 --budget-s 1080 --out benchmarks/results/sar_diversity_cpu100"
    ),
    "sar_diversity_gpu": (
        "bash benchmarks/device_run.sh (on a GPU; its sar_diversity.py run writes benchmarks/results/sar_diversity_gpu)"
    ),
    "sar_torch_reference_eps0.2_packed.json": (
        "python benchmarks/sar_torch_reference.py --pool DEMO/pools/high-... --images 16 --eps 0.2 --steps 10 --restarts 1 --out benchmarks/results/sar_torch_reference_eps0.2_packed.json"
    ),
    "sar_torch_reference_members_quiet.json": (
        "python benchmarks/sar_torch_reference.py --pool DEMO/pools/high-... --images 16 --eps 0.2 --steps 10 --restarts 1 --no-agreement --no-sarjax-unpacked --reps 3 --out benchmarks/results/sar_torch_reference_members_quiet.json (with member gating, commit 5b137c2: a removed option)"
    ),
    "sar_torch_reference_quiet.json": (
        "python benchmarks/sar_torch_reference.py --pool DEMO/pools/high-... --images 16 --eps 0.2 --steps 10 --restarts 1 --no-agreement --no-sarjax-unpacked --reps 3 --out benchmarks/results/sar_torch_reference_quiet.json"
    ),
    "sar_torch_reference_quiet_epyc.json": (
        "python benchmarks/sar_torch_reference.py --pool DEMO/pools/high-... --images 16 --eps 0.2 --steps 10 --restarts 1 --reps 3 --out benchmarks/results/sar_torch_reference_quiet_epyc.json (on a 2-core AMD EPYC)"
    ),
    "window_max_cost.json": (
        "python benchmarks/window_max_cost.py --reps 5 --out benchmarks/results/window_max_cost.json"
    ),
}


def _strip(text: str) -> str:
    """``text`` with generated blocks, ```python blocks and inline code blanked (line breaks kept,
    so line numbers stay right)."""

    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    text = BLOCK.sub(blank, text)
    text = re.sub(r"^([ \t]*)```python[ \t]*\n.*?^\1```[ \t]*$", blank, text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", blank, text)


def figures(text: str) -> list[tuple[int, str, str]]:
    """``(line number, figure, line)`` of every candidate hand-typed figure of a page's text."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(_strip(text).splitlines()):
        for m in FIGURE.finditer(line):
            found.append((i + 1, m.group(1), lines[i]))
    return found


def _allowed(page: str, line: str) -> int | None:
    for k, (name, pattern, _) in enumerate(ALLOWED):
        if name == page and re.search(pattern, line):
            return k
    return None


def test_the_detector_finds_typed_figures_and_skips_generated_ones():
    page = (
        "sarjax ran **1.50x** the fastest PyTorch (93.2 ms vs 139.9 ms per step); 5.39 images/s, 72.0%\n"
        "robust, +0.4 pp, x10.5 on the H200, 26-32 % compiling, 2,700 pairs, 20 steps, eps 0.1, ~3 minutes.\n"
        "`--timeout 100s` is code.\n"
        "<!-- some-table:begin (a script) -->\n| 2.04x | 3 s |\n<!-- some-table:end -->\n"
        "```python\nprint(f'{1.5}x')  # 3 s\n```\n"
    )
    found = [(n, f) for n, f, _ in figures(page)]
    assert found == [
        (1, "1.50x"),
        (1, "93.2 ms"),
        (1, "139.9 ms"),
        (1, "5.39 images/s"),
        (1, "72.0%"),
        (2, "0.4 pp"),
        (2, "x10.5"),
        (2, "26-32 %"),
        (2, "3 minutes"),
    ]


def test_generated_blocks_are_of_known_kinds():
    """A block only counts as generated when a script fills it and a test re-renders it."""
    unknown = [
        f"{page.name}: {m.group(1)}"
        for page in GUIDES
        for m in BLOCK.finditer(page.read_text())
        if m.group(1) not in GENERATED
    ]
    assert not unknown, f"generated blocks no test re-renders (add one to GENERATED with its test): {unknown}"
    for test in GENERATED.values():
        assert (ROOT / test.split()[0]).is_file(), test


def test_no_hand_typed_figures_in_the_guides():
    typed, used = [], set()
    for page in GUIDES:
        rel = str(page.relative_to(ROOT))
        for number, figure, line in figures(page.read_text()):
            k = _allowed(rel, line)
            if k is None:
                typed.append(f"{rel}:{number}: {figure!r} in {line.strip()[:120]!r}")
            else:
                used.add(k)
    assert not typed, (
        f"{len(typed)} hand-typed figures: render them from a results file (a generated block) or link "
        "their section of docs/results.md (the reading goes into a dated note, benchmarks/results/notes/); "
        "a figure that is not a measurement goes into ALLOWED with its reason:\n" + "\n".join(typed)
    )
    stale = [ALLOWED[k][:2] for k in range(len(ALLOWED)) if k not in used]
    assert not stale, f"ALLOWED entries that match nothing any more (remove them): {stale}"


def _render_results():
    """scripts/render_results.py as a module (loaded from its file: no ``sys.path`` edit)."""
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "scripts" / "render_results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_results"] = module
    spec.loader.exec_module(module)
    return module


def quoted_files(text: str, names: list[str], anchors: dict[str, str]) -> set[str]:
    """The results files (and folders) of ``names`` that ``text`` quotes: by a link to their section
    of the results page (``results.md#ANCHOR``), by path (``benchmarks/results/NAME``), by file name
    (``NAME.json``, a glob with a prefix such as ``autoattack_vs_torch*.json``) or as a folder
    (``NAME/``)."""
    found = {anchors[a] for a in re.findall(r"results\.md#([A-Za-z0-9_-]+)", text) if a in anchors}
    found |= {n for n in re.findall(r"benchmarks/results/([A-Za-z0-9_.-]+)", text) if n in names}
    for token in re.findall(r"(?<![\w.*-])([A-Za-z0-9_.-]{3,}\*?[A-Za-z0-9_.-]*\.json|[A-Za-z0-9_.-]{3,}/)", text):
        found |= {n for n in names if fnmatch.fnmatchcase(n, token.rstrip("/"))}
    return found


def _quotes() -> dict[str, set[str]]:
    """``{results file or folder: the guides, notes and tables that quote it}``."""
    rr = _render_results()
    names = sorted(p.name for p in RESULTS.iterdir() if p.name != "notes" and (p.is_dir() or p.suffix == ".json"))
    anchors = {rr._anchor(n): n for n in names}
    quotes: dict[str, set[str]] = {}
    for page in [*GUIDES, *sorted(NOTES.glob("*.md"))]:
        for name in quoted_files(page.read_text(), names, anchors):
            quotes.setdefault(name, set()).add(str(page.relative_to(ROOT)))
    for h in rr.HEADLINES:
        quotes.setdefault(h.file, set()).add("the headline table (render_results.HEADLINES)")
    for block, (file, _) in rr.DOC_BLOCKS.items():
        quotes.setdefault(file, set()).add(f"the results block {block!r} (render_results.DOC_BLOCKS)")
    return quotes


def _missing(name: str) -> list[str]:
    """What a results file or folder does not record of its provenance (a folder: what any of its
    JSON files lacks; a folder without JSON lacks everything)."""
    rr = _render_results()
    path = RESULTS / name
    files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
    missing = {c for f in files for c in rr.missing_provenance(f)} if files else set(rr.PROVENANCE)
    return [c for c in rr.PROVENANCE if c in missing]


def test_quoted_detector():
    names = ["a_speed.json", "a_speed_quiet.json", "b.json", "runs"]
    anchors = {"a_speedjson": "a_speed.json"}
    text = (
        "see [x](results.md#a_speedjson), `benchmarks/results/b.json`, `a_speed*.json` and `runs/`; "
        "`benchmarks/results/*.json` names none in particular"
    )
    assert quoted_files(text, names, anchors) == {"a_speed.json", "a_speed_quiet.json", "b.json", "runs"}
    assert quoted_files("benchmarks/results/*.json and *.json", names, anchors) == set()


def test_every_quoted_result_records_its_provenance_or_waits_for_a_rerun():
    """Issue 43, item 3: every figure the guides, the dated notes, the headline table and the
    results blocks quote comes from a results file with provenance (command, commit, machine, date,
    load), or the file is listed in RERUN with the command that will give it one."""
    quotes = _quotes()
    lacking = {name: _missing(name) for name in quotes if (RESULTS / name).exists()}
    lacking = {name: miss for name, miss in lacking.items() if miss}
    unlisted = {name: (miss, sorted(quotes[name])) for name, miss in lacking.items() if name not in RERUN}
    assert not unlisted, f"quoted results files without provenance (rerun them, or list them in RERUN): {unlisted}"
    gone = sorted(set(quotes) - {p.name for p in RESULTS.iterdir()})
    assert not gone, f"quoted results files that do not exist: {gone} (quoted by {[sorted(quotes[g]) for g in gone]})"
    done = sorted(name for name in RERUN if name in quotes and name not in lacking)
    assert not done, f"RERUN entries whose files now record their provenance (remove them): {done}"
    unquoted = sorted(name for name in RERUN if name not in quotes)
    assert not unquoted, f"RERUN entries nothing quotes (retire the file with git rm, and the entry): {unquoted}"
    for name, command in RERUN.items():
        assert "benchmarks/" in command or command.startswith(("sarjax ", "PYTHONPATH")), (name, command)


def test_results_blocks_match_a_re_render():
    """The ``results`` blocks of the guides equal what scripts/render_results.py --docs writes."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_results.py"), "--docs", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr + " (run: python scripts/render_results.py --docs)"


def test_results_block_renders_its_file(tmp_path):
    """A block is filled from its file and names it; an unknown block name raises."""
    rr = _render_results()
    data = json.loads((RESULTS / "llm_demo.json").read_text())
    text = "before\n<!-- results:begin llm-demo-sar (x) -->\nstale\n<!-- results:end -->\nafter\n"
    out = rr.render_doc_blocks(text)
    assert out.startswith("before\n<!-- results:begin llm-demo-sar (x) -->\n*Rendered from [llm_demo.json]")
    assert "stale" not in out and out.endswith("<!-- results:end -->\nafter\n")
    first = data["sar"][0]
    assert f"| {first['delta']:g} | {first['sar_before']:.3f} | {first['sar_after']:.3f} |" in out
    assert f"{data['one_minus_asr']['before']:.3f} before" in out
    with pytest.raises(ValueError, match="results block named"):
        rr.render_doc_blocks("<!-- results:begin nope (x) -->\n<!-- results:end -->")
