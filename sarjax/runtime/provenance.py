"""What produced a result: the provenance every results file records (issue 43).

A figure quoted in the guides must come from a file that says which command made it, on which
commit, which machine, when, and under what load (``tests/test_docs_figures.py`` checks it). The
``sarjax`` commands that write a results document (``demo``, ``sar``, ``frontier``, ``autoattack``,
``llm-demo``, ``llm-sar``, ``plan``, ``train-pool``, ``train-defenses``) add :func:`provenance`'s
record under ``"provenance"``, and the benchmarks in ``benchmarks/`` use the same function
(``benchmarks/_timing.py``), so a CLI run copied into ``benchmarks/results/`` carries it too.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sarjax

_COMMAND: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("sarjax_command", default=None)


@contextlib.contextmanager
def command_line(argv: Sequence[str]) -> Iterator[None]:
    """Within the block, :func:`provenance` records ``argv`` as the command (``sarjax.cli.main``
    wraps each command in it, so a command called in-process, ``main(["sar", ...])``, records
    ``sarjax sar ...`` rather than its host program's command line).

    Args:
      argv: the whole command, program name first (e.g. ``["sarjax", "sar", "--eps", "0.1"]``).
    """
    token = _COMMAND.set(tuple(str(a) for a in argv))
    try:
        yield
    finally:
        _COMMAND.reset(token)


def _checkout_commit(root: Path) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``root`` (``+dirty`` when tracked files
    differ from it); None outside a git checkout or without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        commit = head.stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if dirty.returncode == 0 and dirty.stdout.strip():
            commit += "+dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """The provenance record of this process's result.

    Args:
      argv: the command line to record (default: the :func:`command_line` in effect, else
        ``sys.argv``, written ``python -m PACKAGE ...`` for
        a module run with ``-m``); a ``.py`` program is prefixed with the interpreter's name, an
        installed script (``sarjax``) is named without its path.

    Returns:
      ``{"command": str, "commit": str | None, "sarjax": version, "machine": {"platform",
      "processor", "cpus", "backend", "jax"}, "date": ISO 8601 UTC, "load": [1, 5, 15-minute load
      averages]}``. ``commit`` is the git commit of the checkout that holds the imported ``sarjax``
      (``+dirty`` when tracked files differ from it), None for an installed copy outside a checkout
      (then ``sarjax`` names the version).
    """
    import jax  # the backend in use: imported here so that reading the module stays cheap

    current = _COMMAND.get()
    if argv is None and current is not None:
        argv = list(current)
    args = list(sys.argv if argv is None else argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if argv is None and args and spec is not None and spec.name:  # python -m package
        args = [Path(sys.executable).name, "-m", spec.name.removesuffix(".__main__"), *args[1:]]
    elif args and args[0].endswith(".py"):
        args = [Path(sys.executable).name, *args]
    elif args:
        args[0] = Path(args[0]).name
    return {
        "command": shlex.join(args),
        "commit": _checkout_commit(Path(sarjax.__file__).resolve().parent.parent),
        "sarjax": sarjax.__version__,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "backend": jax.default_backend(),
            "jax": jax.__version__,
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load": list(os.getloadavg()),
    }


__all__ = ["command_line", "provenance"]
