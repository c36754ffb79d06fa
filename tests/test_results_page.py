"""docs/results.md is generated from benchmarks/results/*.json by scripts/render_results.py.

The script runs as a subprocess (as CI runs it), so the test needs no ``sys.path`` edit.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "render_results.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_renders_tables_and_provenance(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "b_speed.json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/b_speed.py --out x.json",
                "commit": "0123abc",
                "machine": "Linux-x86_64",
                "date": "2026-12-04T22:00:00Z",
                "load_before": [1.5, 1.0, 0.5],
                "ratio": 2.5,
                "robust_accuracy": {"sarjax": 0.72, "torch": 0.71},
                "rows": [{"n": 1, "acc": 0.5}, {"n": 2}],
                "grid": [[1, 2], [3, 4]],
            }
        )
    )
    (results / "a_old.json").write_text(json.dumps({"seconds": 12.0, "note": "a | b"}))
    page = tmp_path / "results.md"
    proc = _run("--results", str(results), "--out", str(page))
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "generated" in text and "scripts/render_results.py" in text
    # sorted by file name, one section each
    assert text.index("## a_old.json") < text.index("## b_speed.json")
    a = text[text.index("## a_old.json") : text.index("## b_speed.json")]
    b = text[text.index("## b_speed.json") :]
    assert "**Provenance not recorded (written before the scripts recorded it).**" in a
    assert "not in the repository's history yet" in a  # a folder outside the checkout has no history
    assert "| `seconds` | 12 |" in a
    assert "a \\| b" in a  # a pipe in a value does not break the table
    assert "- command (`command`): python benchmarks/b_speed.py --out x.json" in b
    assert "- commit (`commit`): 0123abc" in b
    assert "- machine (`machine`): Linux-x86_64" in b
    assert "- date (`date`): 2026-12-04T22:00:00Z" in b
    assert "- load (`load_before`): [1.5, 1.0, 0.5]" in b
    assert "not recorded" not in b and "written before" not in b
    assert "1 of 2 files carry the provenance their script wrote" in text
    assert "| `ratio` | 2.5 |" in b
    assert "| `robust_accuracy.sarjax` | 0.72 |" in b
    # a list of flat records renders as a table; other lists are named
    assert "`rows` (2 rows):\n\n| n | acc |\n|---|---|\n| 1 | 0.5 |\n| 2 |  |\n" in b
    assert "`grid` (list of 2)" in b
    # --check: up to date now, stale after a results file changes
    assert _run("--results", str(results), "--out", str(page), "--check").returncode == 0
    (results / "a_old.json").write_text(json.dumps({"seconds": 13.0}))
    stale = _run("--results", str(results), "--out", str(page), "--check")
    assert stale.returncode == 1
    assert "stale" in stale.stderr


def test_committed_results_page_is_up_to_date():
    proc = _run("--check")
    assert proc.returncode == 0, proc.stderr + " (run: python scripts/render_results.py)"


def test_dated_notes_are_copied_in_under_their_dates(tmp_path):
    results = tmp_path / "results"
    (results / "notes").mkdir(parents=True)
    (results / "r.json").write_text(json.dumps({"x": 1}))
    (results / "notes" / "2026-12-04-a-run.md").write_text(
        "# A run on the zoo\n\nMeasured at load 2.\n\n## Detail\n\n```bash\n# a comment, not a heading\n```\n"
    )
    (results / "notes" / "2026-11-30-older.md").write_text("# Older\n\nText.\n")
    page = tmp_path / "results.md"
    proc = _run("--results", str(results), "--out", str(page))
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    # oldest first, before the results files; the title under its date, headings one level down
    assert text.index("## 2026-11-30: Older") < text.index("## 2026-12-04: A run on the zoo") < text.index("## r.json")
    assert "*From `benchmarks/results/notes/2026-12-04-a-run.md`.*" in text
    assert "\n### Detail\n" in text and "\n# a comment, not a heading\n" in text
    assert "[2026-12-04: A run on the zoo](#2026-12-04-a-run-on-the-zoo)" in text
    (results / "notes" / "run.md").write_text("# Undated\n")
    bad = _run("--results", str(results), "--out", str(page))
    assert bad.returncode != 0 and "YYYY-MM-DD" in bad.stderr


def test_committed_results_without_provenance_are_marked_with_their_commit():
    text = (ROOT / "docs" / "results.md").read_text()
    section = text[text.index("## frontier_zoo_linf.json") :]
    section = section[: section.index("\n## ", 1)]
    assert "**Provenance not recorded (written before the scripts recorded it).**" in section
    assert "added to the repository in commit `b01f294" in section


def test_links_into_the_results_page_resolve():
    """Every ``results.md#anchor`` link of README.md and docs/*.md names a heading of the page
    (GitHub's anchors: lower case, punctuation but - and _ dropped, spaces to -)."""
    page = (ROOT / "docs" / "results.md").read_text()
    anchors = set()
    for line in page.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip().lower()
            anchors.add("".join(c for c in heading if c.isalnum() or c in "-_ ").replace(" ", "-"))
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for anchor in re.findall(r"results\.md#([A-Za-z0-9_-]+)", doc.read_text()):
            if anchor not in anchors:
                broken.append(f"{doc.name}: #{anchor}")
    assert not broken, broken


def test_check_in_a_shallow_clone_skips_only_the_commits(tmp_path):
    """CI may check out one commit: the page's "added in commit" lines cannot be recomputed there,
    everything else is still checked."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and this checkout's history")
    clone = tmp_path / "clone"
    proc = subprocess.run(
        ["git", "clone", "-q", "--depth", "1", ROOT.as_uri(), str(clone)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    # the working tree's script, page and results (they may be ahead of the last commit)
    shutil.copy2(SCRIPT, clone / "scripts" / "render_results.py")
    shutil.copy2(ROOT / "docs" / "results.md", clone / "docs" / "results.md")
    shutil.rmtree(clone / "benchmarks" / "results")
    shutil.copytree(ROOT / "benchmarks" / "results", clone / "benchmarks" / "results")
    script = clone / "scripts" / "render_results.py"

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)

    ok = check()
    assert ok.returncode == 0, ok.stderr
    assert "not compared" in ok.stderr
    page = clone / "docs" / "results.md"
    page.write_text(page.read_text().replace("| `samples` | 30 |", "| `samples` | 31 |", 1))
    assert check().returncode == 1


def _module():
    """scripts/render_results.py as a module (loaded from its file: no ``sys.path`` edit)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_results", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_results"] = module  # dataclass / NamedTuple machinery looks the module up
    spec.loader.exec_module(module)
    return module


def test_headline_table_opens_the_committed_page():
    """docs/results.md opens (under its title) with the headline table re-rendered from
    today's results files, one row per comparison, each ratio the file's own figure."""
    rr = _module()
    text = (ROOT / "docs" / "results.md").read_text()
    table = rr.render_headlines(rr.RESULTS, rr.added_commits(rr.RESULTS))
    opening = rr.TITLE + "\n" + table + "\n" + rr.HEADER  # the title, then the table, then the prose
    assert text.startswith(opening) or rr._without_commits(text).startswith(rr._without_commits(opening))
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| work ")]
    assert len(rows) == len(rr.HEADLINES) >= 10
    # known answers read straight from two files, not through the script's path lookup
    gcg = json.loads((rr.RESULTS / "gcg_throughput.json").read_text())["speedup_jax_vs_fastest_torch"]
    assert f"**{gcg:.2f}x**" in next(r for r in rows if "gcg_throughput.json" in r)
    cnn = next(
        r
        for r in json.loads((rr.RESULTS / "joint_attack_throughput.json").read_text())["results"]
        if r["family"] == "cnn" and r["B"] == 64
    )
    row = next(r for r in rows if "(#joint_attack_throughputjson)" in r)
    assert f"**{cnn['ratio_vs_faster_torch']['sarjax[fused]']:.2f}x**" in row


def test_headline_rows_read_their_files(tmp_path):
    """A row's path picks list entries by their fields, a reducer turns a list into the ratio, the
    machine and date come from the file's provenance, and a missing file or figure raises."""
    rr = _module()
    (tmp_path / "a.json").write_text(
        json.dumps(
            {
                "rows": [{"B": 64, "ratio": 1.5}, {"B": 256, "ratio": 2.25}],
                "speedups": [{"speedup": 1.0}, {"speedup": 3.0}, {"speedup": 2.0}],
                "machine": {"processor": "x86_64", "cpus": 2, "backend": "cpu"},
                "date": "2026-12-07T21:00:00+00:00",
                "load": [1.0, 1.0, 1.0],
            }
        )
    )
    (tmp_path / "b.json").write_text(json.dumps({"ratio": 0.5}))
    rr.HEADLINES = (
        rr.Headline("work a", "peer a", "a.json", ("rows", {"B": 256}, "ratio"), "`ratio`"),
        rr.Headline("work m", "peer m", "a.json", ("speedups",), "median", rr._median_speedup),
        rr.Headline("work b", "peer b", "b.json", ("ratio",), "`ratio`"),
    )
    table = rr.render_headlines(tmp_path, {"b.json": ("abc", "2026-11-30")})
    assert (
        "| work a | peer a | **2.25x** (`ratio`) | x86_64, 2 cpus | 2026-12-07 | recorded | [a.json](#ajson) |" in table
    )
    assert "| work m | peer m | **2.00x** (median) |" in table
    assert (
        "| work b | peer b | **0.50x** (`ratio`) | not recorded | not recorded (file added 2026-11-30) | not recorded |"
        in table
    )
    rr.HEADLINES = (rr.Headline("w", "p", "a.json", ("rows", {"B": 32}, "ratio"), "`ratio`"),)
    with pytest.raises(ValueError, match="one list entry"):
        rr.render_headlines(tmp_path)
    rr.HEADLINES = (rr.Headline("w", "p", "gone.json", ("ratio",), "`ratio`"),)
    with pytest.raises(ValueError, match="gone.json"):
        rr.render_headlines(tmp_path)
