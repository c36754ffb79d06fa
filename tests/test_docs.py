"""Every ```python block of README.md and docs/*.md runs as printed (issue 35, item 4).

The blocks of one page run in order in one namespace (a page may build a pool once and use it in
later blocks), in a temporary working directory, with tracebacks naming the page and its line.
Blocks that are not Python (shell, output, signature sketches) use another fence language
(```bash, ```text).  A block that needs what CI does not have (downloaded weights, several hosts)
is preceded by the line ``<!-- docs-test: skip REASON -->`` and is still checked to compile and
for undefined names: it may use the names the page's earlier blocks define, Python's builtins, and
the names the reader brings, listed at the end of the reason as ``given: a, b, c`` (a checkpoint's
``stack``, the user's ``tok``); any other name must be imported or defined by the block.
"""

import ast
import builtins
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*skip\s+(\S.*?)\s*-->\s*$")
GIVEN = re.compile(r"\bgiven:\s*([\w\s,]+?)\s*\)?\s*$")
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
        else:  # not run: its names must still resolve (issue 42: docs/llm.md used an unimported name)
            given = GIVEN.search(skip)
            names = {n.strip() for n in given.group(1).split(",")} if given else set()
            missing = undefined_names(code, {**namespace, **dict.fromkeys(names)})
            assert not missing, f"{page.name}:{line}: the skipped block uses undefined names {missing}"


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name a block binds anywhere (assignments, imports, defs, arguments, loop and with
    targets, exception names, comprehension variables, match captures): scopes are not told
    apart, so a name bound in any scope of the block counts as bound in all of them."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return bound


def undefined_names(code: str, namespace: dict) -> list[str]:
    """The names ``code`` reads that neither it, the page's earlier blocks (``namespace``) nor
    Python's builtins define, sorted."""
    tree = ast.parse(code)
    known = _bound_names(tree) | set(namespace) | set(dir(builtins))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(used - known)


def test_undefined_names_finds_an_unimported_name():
    """The skipped blocks' check: the docs/llm.md case (a name used, never imported) is caught;
    names bound by the block itself, by earlier blocks or by Python are not reported."""
    block = (
        "from sarjax.attacks import make_beast\n"
        "attack = make_beast(vocab=allowed_vocab(tok), steps=n)\n"
        "def f(a, *, b=1):\n    return [a + b + c for c in range(3)]\n"
        "try:\n    pass\nexcept ValueError as err:\n    print(err)\n"
    )
    assert undefined_names(block, {"n": 3}) == ["allowed_vocab", "tok"]
    assert undefined_names(block, {"n": 3, "tok": None, "allowed_vocab": len}) == []


def test_skip_marker_given_names():
    """``given: a, b`` at the end of a skip reason names what the reader brings."""
    m = SKIP.match("<!-- docs-test: skip needs a checkpoint (given: stack, tok) -->")
    assert m is not None and m.group(1) == "needs a checkpoint (given: stack, tok)"
    given = GIVEN.search(m.group(1))
    assert given is not None and [n.strip() for n in given.group(1).split(",")] == ["stack", "tok"]
    assert GIVEN.search("needs robustbench and a checkpoint file") is None
