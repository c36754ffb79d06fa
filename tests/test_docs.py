"""Every ```python block of README.md and docs/*.md runs as printed (issue 35, item 4).

The blocks of one page run in order in one namespace (a page may build a pool once and use it in
later blocks), in a temporary working directory, with tracebacks naming the page and its line.
Blocks that are not Python (shell, output, signature sketches) use another fence language
(```bash, ```text).  A block that needs what CI does not have (downloaded weights, several hosts)
is preceded by the line ``<!-- docs-test: skip REASON -->`` and is still checked to compile.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*skip\s+(\S.*?)\s*-->\s*$")
OPEN = re.compile(r"^(\s*)```python\s*$")


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """(first code line, 1-based; dedented code; skip reason or None) of each ```python block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = m.group(1), i + 1
        j = start
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: a ```python block is never closed")
        code = "\n".join(ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[start:j])
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.match(prev)
        blocks.append((start + 1, code, skip.group(1) if skip else None))
        i = j + 1
    return blocks


def test_readme_has_python_blocks():
    assert python_blocks(ROOT / "README.md"), "README.md has no ```python block to run"


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_page_python_blocks_run(page, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page.stem}"}
    for line, code, skip in python_blocks(page):
        # padded so a traceback names the page's own line numbers
        compiled = compile("\n" * (line - 1) + code, str(page.relative_to(ROOT)), "exec")
        if skip is None:
            exec(compiled, namespace)
