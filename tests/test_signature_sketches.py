"""The call sketches in docstrings and docs use the current argument order (issue 42, item 4).

Every entry is called ``fn(params, inputs, ref, *, key, mask=None, ...)``: the key is keyword-only
and comes first after ``*``. A sketch ``fn(...)`` in a docstring or a page that names ``key`` must
put it after a bare ``*`` (or pass it as ``key=``), never before ``mask`` as a positional argument.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [*sorted((ROOT / "sarjax").rglob("*.py")), ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CALL = re.compile(r"\b(?:fn|fn\.jit|attack)\(")


def sketches(text: str) -> list[tuple[int, str]]:
    """(line, argument text) of each ``fn(...)`` / ``attack(...)`` whose parentheses close."""
    out = []
    for m in CALL.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append((text.count("\n", 0, m.start()) + 1, text[m.end() : i - 1]))
    return out


def misplaced_key(args: str) -> bool:
    """True when ``key`` is a positional parameter of the sketch: named bare (not ``key=``) before
    a bare ``*``, or ``mask=None`` followed by ``key``."""
    flat = " ".join(args.split())
    if re.search(r"\bmask=None,\s*key\b", flat):
        return True
    parts = [p.strip() for p in flat.split(",")]
    star = next((i for i, p in enumerate(parts) if p == "*"), None)
    for i, p in enumerate(parts):
        if re.fullmatch(r"key(?:=\.\.\.)?", p) and (star is None or i < star):
            return True
    return False


def test_misplaced_key_detects_the_old_order():
    assert misplaced_key("params, x0, ref, mask=None, key, *, eps=None")
    assert misplaced_key("params, x0, ref, mask=None, key=..., *, max_queries=None")
    assert misplaced_key("params, x0, ref, key, *, mask=None")
    assert not misplaced_key("params, x0, ref, *, key, mask=None, max_queries=None")
    assert not misplaced_key("pool.params, x0, ref, key=jax.random.key(0), mask=None")


def test_no_sketch_shows_the_old_argument_order():
    bad = []
    for path in FILES:
        for line, args in sketches(path.read_text(encoding="utf-8")):
            if misplaced_key(args):
                bad.append(f"{path.relative_to(ROOT)}:{line}: fn({' '.join(args.split())[:80]})")
    assert not bad, (
        "sketches with the key before '*' (the call is fn(params, inputs, ref, *, key, mask=None, ...)):\n"
        + "\n".join(bad)
    )


LOCAL = re.compile(r"(?<![\w.])/(?:root|home|work|Users|mnt|opt)/|(?<![\w.])/tmp/[A-Za-z]")


def test_docs_name_no_machine_local_paths():
    """The guide names folders a reader chooses (``OUT``, ``ZOO``), never a path of one machine
    (issue 42, item 4: ``/work/zoo/mnist``, ``/tmp/llmdemo``). docs/results.md is generated from
    the results files, whose recorded commands keep the paths they ran with."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {ln.strip()[:100]}"
        for p in pages
        if p.name != "results.md"
        for i, ln in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if LOCAL.search(ln)
    ]
    assert not bad, "machine-local paths in the docs:\n" + "\n".join(bad)


def test_local_path_pattern():
    assert LOCAL.search("`--zoo /work/zoo/mnist --defense`") and LOCAL.search("--out /tmp/llmdemo")
    assert not LOCAL.search("--zoo ZOO/mnist") and not LOCAL.search("benchmarks/results/x.json")
