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
