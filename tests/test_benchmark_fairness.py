"""Benchmarks that time PyTorch at several thread counts compare fairly (issue 43).

OpenMP's default ACTIVE wait policy makes PyTorch's worker threads spin between parallel regions;
on a shared 2-core machine that collapses the 2-thread rows and hands sarjax a baseline slower than
a careful user would get. Every benchmark that sets PyTorch's thread count must therefore default
``OMP_WAIT_POLICY`` to ``PASSIVE`` at module level, before its first ``import torch``
(``joint_attack_throughput.py`` left it unset until issue 43).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _torch_thread_benchmarks() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if "set_num_threads" in p.read_text())


def _sets_passive_before_torch(path: Path) -> tuple[bool, str]:
    """Whether a module-level ``os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")`` (or an
    assignment of ``"PASSIVE"``) comes before the first ``import torch`` anywhere in the file."""
    tree = ast.parse(path.read_text())
    first_torch = min(
        (
            n.lineno
            for n in ast.walk(tree)
            if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch")
        ),
        default=None,
    )
    for node in tree.body:  # module-level statements only: a function body runs too late or not at all
        if not isinstance(node, (ast.Expr, ast.Assign)):
            continue
        src = ast.unparse(node)
        if "OMP_WAIT_POLICY" in src and "PASSIVE" in src and "environ" in src:
            if first_torch is None or node.lineno < first_torch:
                return True, ""
            return False, f"set at line {node.lineno}, after `import torch` at line {first_torch}"
    return False, "never set at module level"


def test_some_benchmarks_time_torch_threads():
    # the check below must have something to check
    names = {p.name for p in _torch_thread_benchmarks()}
    assert {"joint_attack_throughput.py", "llm_throughput.py", "sar_torch_reference.py"} <= names


@pytest.mark.parametrize("path", _torch_thread_benchmarks(), ids=lambda p: p.name)
def test_torch_thread_benchmarks_set_passive_wait_policy(path):
    ok, why = _sets_passive_before_torch(path)
    assert ok, f"{path.name}: OMP_WAIT_POLICY=PASSIVE must be defaulted before torch is imported ({why})"


def test_check_catches_a_late_or_missing_policy(tmp_path):
    late = tmp_path / "late.py"
    late.write_text('import os\nimport torch\nos.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")\n')
    assert not _sets_passive_before_torch(late)[0]
    missing = tmp_path / "missing.py"
    missing.write_text("import torch\ntorch.set_num_threads(2)\n")
    assert not _sets_passive_before_torch(missing)[0]
    inside = tmp_path / "inside.py"
    inside.write_text('import os\ndef f():\n    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"\n    import torch\n')
    assert not _sets_passive_before_torch(inside)[0]
    good = tmp_path / "good.py"
    good.write_text('import os\nos.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")\ndef f():\n    import torch\n')
    assert _sets_passive_before_torch(good)[0]
