"""sarjax.runtime.provenance: the record every results document carries (issue 43)."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import sarjax
from sarjax.runtime.provenance import command_line, provenance

ROOT = Path(sarjax.__file__).resolve().parent.parent


def test_record_fields_and_values():
    rec = provenance(["/usr/local/bin/sarjax", "demo", "--quick"])
    assert rec["command"] == "sarjax demo --quick"  # the program's name, not its install path
    assert set(rec["machine"]) == {"platform", "processor", "cpus", "backend", "jax"}
    assert rec["machine"]["backend"] == "cpu"
    assert rec["sarjax"] == sarjax.__version__
    when = datetime.datetime.fromisoformat(rec["date"])
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 60
    assert len(rec["load"]) == 3 and all(v >= 0 for v in rec["load"])


def test_script_command_names_the_interpreter():
    rec = provenance(["benchmarks/x.py", "--reps", "3"])
    assert rec["command"].split()[1:] == ["benchmarks/x.py", "--reps", "3"]
    assert rec["command"].split()[0].startswith("python")


def test_commit_is_the_checkouts_head():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    rec = provenance([])
    if head.returncode != 0:  # an installed copy outside a checkout
        assert rec["commit"] is None
    else:
        assert rec["commit"].split("+")[0] == head.stdout.strip()


def test_command_line_overrides_sys_argv_inside_its_block():
    outside = provenance()["command"]
    with command_line(["sarjax", "sar", "--eps", "0.1"]):
        assert provenance()["command"] == "sarjax sar --eps 0.1"
        assert provenance(["x.py"])["command"].endswith("x.py")  # an explicit argv still wins
    assert provenance()["command"] == outside
