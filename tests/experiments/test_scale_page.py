"""docs/scale.md's table is what benchmarks/results/scale_table.json and plan_validation.json render
(``benchmarks/scale_table.py --render ... --check``, run as a subprocess as a user runs it), and a
changed figure makes the check fail."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scale_table.py"
RESULTS = ROOT / "benchmarks" / "results"


def _check(table: Path, validation: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--render", str(table), "--validation", str(validation), "--check"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_scale_page_is_up_to_date(tmp_path):
    table, validation = RESULTS / "scale_table.json", RESULTS / "plan_validation.json"
    r = _check(table, validation)
    assert r.returncode == 0, r.stderr + " (run: python benchmarks/scale_table.py --render " + str(table) + ")"
    page = (ROOT / "docs" / "scale.md").read_text()
    assert "projection" in page and "time measured / projected" in page
    # a changed figure is caught
    data = json.loads(table.read_text())
    row = next(iter(data["rows"].values()))
    row["plan"]["run_seconds"]["seconds"] *= 2
    stale = tmp_path / "scale_table.json"
    stale.write_text(json.dumps(data))
    assert _check(stale, validation).returncode == 1
    val = json.loads(validation.read_text())
    next(iter(val["rows"].values()))["ratios"]["time_ratio"] += 1
    shutil.copy(table, tmp_path / "t.json")
    (tmp_path / "v.json").write_text(json.dumps(val))
    assert _check(tmp_path / "t.json", tmp_path / "v.json").returncode == 1
