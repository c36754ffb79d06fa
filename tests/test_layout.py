"""The package layout (issue 36): no module at the package root but ``__init__.py`` /
``__main__.py``, and no private name imported from another sarjax module (names used across
modules are public). The layer contracts themselves are checked by import-linter in .ci/run."""

import ast
from pathlib import Path

import sarjax

ROOT = Path(sarjax.__file__).parent


def test_no_module_at_the_package_root():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules at the package root: {loose}"


def test_no_private_name_is_imported_across_modules():
    hits = []
    for f in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sarjax"):
                hits += [
                    f"{f.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not hits, hits
