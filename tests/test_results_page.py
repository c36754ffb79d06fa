"""docs/results.md is generated from benchmarks/results/*.json by scripts/render_results.py.

The script runs as a subprocess (as CI runs it), so the test needs no ``sys.path`` edit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
                "rows": [{"n": 1}, {"n": 2}],
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
    assert "Provenance not recorded." in a
    assert "| `seconds` | 12 |" in a
    assert "a \\| b" in a  # a pipe in a value does not break the table
    assert "- command (`command`): python benchmarks/b_speed.py --out x.json" in b
    assert "- commit (`commit`): 0123abc" in b
    assert "- machine (`machine`): Linux-x86_64" in b
    assert "- date (`date`): 2026-12-04T22:00:00Z" in b
    assert "- load (`load_before`): [1.5, 1.0, 0.5]" in b
    assert "not recorded" not in b
    assert "| `ratio` | 2.5 |" in b
    assert "| `robust_accuracy.sarjax` | 0.72 |" in b
    assert "`rows` (list of 2)" in b
    # --check: up to date now, stale after a results file changes
    assert _run("--results", str(results), "--out", str(page), "--check").returncode == 0
    (results / "a_old.json").write_text(json.dumps({"seconds": 13.0}))
    stale = _run("--results", str(results), "--out", str(page), "--check")
    assert stale.returncode == 1
    assert "stale" in stale.stderr


def test_committed_results_page_is_up_to_date():
    proc = _run("--check")
    assert proc.returncode == 0, proc.stderr + " (run: python scripts/render_results.py)"
