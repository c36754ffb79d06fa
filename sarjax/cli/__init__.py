"""The ``sarjax`` command line: one module per command under ``sarjax/cli/``, registered in :data:`COMMANDS`.

A command module holds its argument parser (``register(sub)``) and its ``cmd_*`` function, which
calls library code (``sarjax.experiments`` and the layers below); argument types shared by the
commands are in :mod:`sarjax.cli.args`.

:func:`main` turns XLA's persistent compilation cache on before a command that takes
``--compile-cache`` runs: that directory when given, else ``$XDG_CACHE_HOME/sarjax/jax``
(``SARJAX_NO_COMPILE_CACHE=1``: none; :mod:`sarjax.runtime.compile_cache`). Importing sarjax
never does.

Every command counts the XLA programs it compiles (:mod:`sarjax.runtime.compile_stats`): one that
compiled or loaded any ends, when it completes, with one line on stderr, ``sarjax COMMAND: compiled
N XLA programs in S s (K loaded from the compilation cache in T s; tracing and lowering U s)``
(none for one that compiled nothing, such as ``train-defenses --list``; none after an error, whose
message stays the last line). ``SARJAX_COMPILE_LOG=1`` adds, before that line, one line per jitted
function that compiled: its compiled programs, their seconds and its cache hits
(:func:`sarjax.runtime.compile_stats.by_name`), the most seconds first.
"""

from __future__ import annotations

import argparse
import os
import sys

from sarjax.cli import autoattack, defenses, demo, frontier, llm_demo, llm_sar, plan, sar, train_pool
from sarjax.runtime.compile_cache import enable_command_compile_cache
from sarjax.runtime.compile_stats import by_name, count_compiles
from sarjax.runtime.provenance import command_line

# Every command, in the order ``sarjax --help`` lists them: each module's ``register(sub)``.
COMMANDS = (train_pool, demo, sar, defenses, autoattack, frontier, llm_sar, llm_demo, plan)


def _version() -> str:
    """The installed sarjax version (pyproject.toml's ``version``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sarjax")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sarjax", description="Systemic adversarial robustness of model pools, in JAX.")
    p.add_argument("--version", action="version", version=f"sarjax {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    compiles = count_compiles()  # before the command's first compilation
    try:
        if hasattr(args, "compile_cache"):  # the commands with --compile-cache: on by default
            enable_command_compile_cache(args.compile_cache)
        with command_line(["sarjax", *(sys.argv[1:] if argv is None else argv)]):
            rc = int(args.func(args) or 0)
        line = compiles.stop().summary()
        if line is not None and os.environ.get("SARJAX_COMPILE_LOG", "") not in ("", "0"):
            for row in by_name(compiles.programs()):
                print(
                    f"sarjax {args.command}: {row['compiled']:3d} x {row['seconds']:8.2f} s  "
                    f"(+{row['cache_hits']} cached)  {row['name']}",
                    file=sys.stderr,
                )
        if line is not None:
            print(f"sarjax {args.command}: {line}", file=sys.stderr, flush=True)
        return rc
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"sarjax {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`sarjax ... | head`): stop quietly, as Python's
        # signal documentation ("Note on SIGPIPE") recommends: the rest of stdout goes to devnull so
        # that the interpreter's flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
