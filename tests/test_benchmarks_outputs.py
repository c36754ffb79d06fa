"""No benchmark writes under benchmarks/results/ unless asked to (issue 36, item 4).

A committed result is replaced only on purpose (``--out benchmarks/results/NAME``): without
``--out`` every script writes to a temporary folder (``_timing.results_path``), and every script
that writes a file records its provenance (``_timing.provenance``: command, commit, machine, date,
load). The scripts' sources are read (``ast``) and ``_timing`` runs in a subprocess, so the test
needs no ``sys.path`` edit.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "_timing.py")


def _names_results_folder(node: ast.AST) -> bool:
    """Whether an expression names the results folder: ``"results"`` as a path part, a string
    starting with ``benchmarks/results``, or a name ``RESULTS``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            text = sub.value.replace("\\", "/")
            if text == "results" or text.startswith(("results/", "benchmarks/results")):
                return True
        if isinstance(sub, ast.Name) and sub.id == "RESULTS":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "RESULTS":
            return True
    return False


def _default_outputs_in_results(source: str) -> list[str]:
    """Where a script's source points a default output at benchmarks/results/: an argparse
    ``default=``, an assignment, a ``/`` or ``os.path.join`` path. Help strings and docstrings
    (which may show ``--out benchmarks/results/X.json`` as a command) are not defaults."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "default" and _names_results_folder(kw.value):
                    found.append(f"line {node.lineno}: default={ast.unparse(kw.value)}")
            func = ast.unparse(node.func)
            if func in ("os.path.join", "Path", "pathlib.Path") and any(_names_results_folder(a) for a in node.args):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _names_results_folder(node):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "RESULTS" for t in targets):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _imports_from_timing(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "_timing":
            names.update(a.name for a in node.names)
    return names


def _writes_output(source: str) -> bool:
    """Whether the script takes an ``--out`` / ``--json`` output option."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
            if any(isinstance(a, ast.Constant) and a.value in ("--out", "--json") for a in node.args):
                return True
    return False


def test_there_are_benchmark_scripts():
    assert len(SCRIPTS) >= 20, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_default_output_under_results(script):
    found = _default_outputs_in_results(script.read_text())
    assert not found, (
        f"{script.name} writes under benchmarks/results/ by default ({'; '.join(found)}): "
        "use _timing.results_path(name, args.out) (a temporary folder unless --out is given)"
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_output_records_provenance(script):
    source = script.read_text()
    if not _writes_output(source):
        pytest.skip(f"{script.name} takes no --out / --json")
    assert "provenance" in _imports_from_timing(source), (
        f"{script.name} writes a results file but does not import _timing.provenance "
        "(command, commit, machine, date, load): record it in the file it writes"
    )


def test_detector_sees_the_old_defaults():
    """The checks above can fail: the forms today's scripts replaced are caught."""
    old = [
        'ap.add_argument("--out", default="benchmarks/results/x.json")',
        'ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "x.json"))',
        'RESULTS = Path(__file__).resolve().parent / "results"',
        'out = Path(a.out) if a.out else RESULTS / "x.json"',
        'a.out = str(Path(__file__).parent / "results" / name)',
    ]
    for line in old:
        assert _default_outputs_in_results(line), line
    fine = [
        'ap.add_argument("--out", default=None, help="JSON (--out benchmarks/results/x.json to commit)")',
        '"""python benchmarks/x.py --out benchmarks/results/x.json"""',
        'a.out = str(results_path("x.json", a.out, quick=a.quick))',
    ]
    for line in fine:
        assert not _default_outputs_in_results(line), line


def test_results_path_defaults_to_a_temporary_folder(tmp_path):
    code = (
        "import json; from _timing import results_path; "
        "print(json.dumps([str(results_path('x.json', None)), str(results_path('x.json', None, quick=True)), "
        f"str(results_path('x.json', {str(tmp_path / 'y.json')!r}))]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    full, quick, given = (Path(p) for p in json.loads(proc.stdout.strip().splitlines()[-1]))
    results = (BENCHMARKS / "results").resolve()
    for p in (full, quick):
        assert results not in p.resolve().parents, p
        assert p.name == "x.json" and p.parent.is_dir()
        p.parent.rmdir()
    assert given == tmp_path / "y.json"
