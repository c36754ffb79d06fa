"""XLA's persistent compilation cache for sarjax's commands (``--compile-cache DIR``).

Every command that compiles big programs (``sarjax sar``, ``demo``, ``frontier``, ``autoattack``,
``llm-sar``, ``train-pool``, ``llm-demo``, ``train-defenses``) can keep XLA's compiled executables in a directory, so that a
rerun with the same shapes (another eps, delta, seed or output directory, a resumed run, the same
architecture in another pool) loads them instead of compiling again. JAX keys each entry by the
program, the compile options, the backend and the jax/jaxlib versions, so a stale entry is never
used for another program (JAX's "Persistent compilation cache" documentation); results do not
depend on whether the cache is on. On this project's 2-core CPU a packed SAR shape costs about
15 CPU-seconds to compile (``benchmarks/sar_compile_cost.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_MIN_SECONDS = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
ENV_OFF = "SARJAX_NO_COMPILE_CACHE"  # set (to anything but "" or "0"): the commands use no default cache


def default_compile_cache_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The commands' default cache directory: ``$XDG_CACHE_HOME/sarjax/jax`` (``~/.cache/sarjax/jax``
    when ``XDG_CACHE_HOME`` is unset, empty or relative, as the XDG base directory specification
    says), or ``None`` when ``SARJAX_NO_COMPILE_CACHE`` is set to anything but ``""`` or ``"0"``.

    Args:
      environ: the environment to read (default ``os.environ``).
    """
    env = os.environ if environ is None else environ
    if env.get(ENV_OFF, "") not in ("", "0"):
        return None
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path("~/.cache").expanduser()
    return base / "sarjax" / "jax"


def _current_dir() -> str | None:
    """JAX's ``jax_compilation_cache_dir`` option now."""
    import jax  # deferred: the commands import this module, and sarjax --help should not load jax

    return jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]


def enable_compile_cache(path: str | os.PathLike, min_compile_seconds: float | None = None) -> Path:
    """Turns on XLA's persistent compilation cache in ``path`` for this process.

    Call it before the first compilation you want cached (programs compiled earlier are not
    written). The directory is created if needed. Idempotent: calling it again with the same
    directory changes nothing; another directory replaces the first (for the programs compiled
    from then on).

    Args:
      path: cache directory (shared safely between runs; not between jax versions, which JAX
        keys apart anyway).
      min_compile_seconds: programs that compiled faster than this are not written (default: the
        ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` environment variable when set, else 1.0:
        writing a tiny program costs more than compiling it).

    Returns:
      The absolute directory.

    Raises:
      ValueError: ``path`` exists and is not a directory; a negative ``min_compile_seconds``.
    """
    import jax  # deferred: the commands import this module, and sarjax --help should not load jax

    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ValueError(f"--compile-cache {str(path)!r} exists and is not a directory")
    if min_compile_seconds is None:
        env = os.environ.get(ENV_MIN_SECONDS)
        min_compile_seconds = float(env) if env not in (None, "") else 1.0
    if not min_compile_seconds >= 0:
        raise ValueError(f"min_compile_seconds must be >= 0, got {min_compile_seconds}")
    p.mkdir(parents=True, exist_ok=True)
    current = _current_dir()
    if current is not None and current != str(p):
        # JAX opens its cache at the first compilation and keeps that directory: start it afresh
        # (deferred import: as jax above)
        from jax.experimental.compilation_cache.compilation_cache import reset_cache

        reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(p))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return p


def enable_command_compile_cache(explicit: str | os.PathLike | None) -> Path | None:
    """The commands' cache, turned on once in ``sarjax``'s entry point before the command runs:
    ``explicit`` (``--compile-cache DIR``) when given, else a directory already set in JAX's
    options (``JAX_COMPILATION_CACHE_DIR``), else :func:`default_compile_cache_dir` (``None``: no
    cache, with ``SARJAX_NO_COMPILE_CACHE=1``). Returns the directory in use.

    Only the commands turn the cache on by default; ``import sarjax`` and the library functions
    never do (call :func:`enable_compile_cache` for that). Setting JAX's options starts no
    backend, so ``sarjax sar --coordinator`` still initializes JAX's distributed runtime first.
    A default directory that cannot be created (a read-only home) is reported on stderr and the
    command runs without the cache; an explicit one that cannot be used raises.

    Raises:
      ValueError: ``explicit`` exists and is not a directory.
    """
    if explicit is not None:
        return enable_compile_cache(explicit)
    current = _current_dir()
    if current is not None:  # the user's own (JAX_COMPILATION_CACHE_DIR)
        return Path(current)
    default = default_compile_cache_dir()
    if default is None:
        return None
    try:
        return enable_compile_cache(default)
    except (OSError, ValueError) as e:
        print(
            f"sarjax: no compilation cache (the default directory {default} is unusable: {e}); "
            f"set --compile-cache DIR, or {ENV_OFF}=1 to silence this",
            file=sys.stderr,
        )
        return None


def add_compile_cache_argument(parser) -> None:
    """Adds ``--compile-cache DIR`` to an argparse (sub)parser."""
    parser.add_argument(
        "--compile-cache",
        default=None,
        metavar="DIR",
        help="XLA persistent compilation cache directory: a rerun with the same shapes loads the compiled "
        "programs instead of compiling them (results unchanged; default: $XDG_CACHE_HOME/sarjax/jax, "
        f"~/.cache/sarjax/jax without XDG_CACHE_HOME; {ENV_OFF}=1 turns the default off)",
    )


# -- the process's memory-map budget ------------------------------------------------------------
#
# Every compiled XLA CPU executable keeps its machine code in memory mappings of its own for as long
# as JAX caches it: measured here, about 6 mappings for a tiny jitted function and up to about 440
# for one of AutoAttack's l1 kernels (a pool's AutoAttack at one l1 radius: 2,630 mappings in 6
# compilations). Linux caps a process's mappings at ``vm.max_map_count`` (65,530 by default), and
# at the cap LLVM cannot map the next program's sections: XLA fails with "LLVM compilation error:
# Cannot allocate memory" while gigabytes are free (reproduced with the limit lowered to 6,000:
# the failure came at 5,923 mappings). Long multi-model runs (``sarjax frontier`` over a zoo with
# AutoAttack: hundreds of compilations in one process) reach it on CPU.

MAP_FRACTION = 0.5  # drop the compiled programs beyond half of vm.max_map_count (room for one more step)


def memory_maps() -> tuple[int, int] | None:
    """``(mappings in use by this process, the kernel's vm.max_map_count)``, or ``None`` where
    ``/proc`` does not say (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read().split()[0])
        with open("/proc/self/maps", "rb") as f:
            used = sum(1 for _ in f)
    except (OSError, ValueError, IndexError):
        return None
    return used, limit


def release_compiled_near_map_limit(fraction: float = MAP_FRACTION, *, log=None) -> bool:
    """Drops JAX's compiled programs (``jax.clear_caches()``) when this process uses more than
    ``fraction`` of ``vm.max_map_count`` memory mappings (see the note above); returns whether it did.

    Call it between steps of a long loop that compiles many programs. Results do not change: the
    programs are compiled again when next called (or loaded from ``--compile-cache`` when it is
    on). Measured: 2,321 mappings after 300 kept-alive compilations fell to 513.

    Args:
      fraction: in (0, 1]; the share of the limit beyond which the caches are dropped.
      log: called with one line when they are (default: print to stderr).

    Raises:
      ValueError: ``fraction`` outside (0, 1].
    """
    import jax  # deferred: the commands import this module, and sarjax --help should not load jax

    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    m = memory_maps()
    if m is None or m[0] <= fraction * m[1]:
        return False
    jax.clear_caches()
    after = memory_maps()
    now = f"{after[0]:,}" if after else "?"
    line = (
        f"sarjax: {m[0]:,} memory mappings of vm.max_map_count {m[1]:,} in use; dropped JAX's compiled "
        f"programs (now {now}) so that XLA can go on compiling; they recompile when next called"
    )
    (log or (lambda s: print(s, file=sys.stderr, flush=True)))(line)
    return True
