"""Builds sarjax's API reference from its docstrings with pdoc, and fails on any warning.

    python docs/build_api.py --out site/api

The narrative pages (docs/*.md) are linked from the package docstring; every public module,
class and function gets a page from its docstring. pdoc warns about what it cannot resolve (an
annotation naming an unimported type, a broken ``:func:`` target, a module that fails to import);
CI runs this script, so any such warning fails the build.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path


def build(out: Path) -> list[str]:
    """Writes the HTML reference under ``out``; returns the warnings pdoc raised (empty = clean)."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", search=True, show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(Path(__file__).resolve().parent.parent / "sarjax", output_directory=out)  # this tree's package
    return sorted({f"{w.category.__name__}: {w.message}" for w in caught})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="site/api", help="output directory (default site/api)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    problems = build(out)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"API reference: {len(problems)} warning(s); fix the docstrings or annotations above", file=sys.stderr)
        return 1
    pages = sum(1 for _ in out.rglob("*.html"))
    print(f"API reference: {pages} pages in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
