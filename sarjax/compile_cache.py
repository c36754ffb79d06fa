"""XLA's persistent compilation cache for sarjax's commands (``--compile-cache DIR``).

Every command that compiles big programs (``sarjax sar``, ``demo``, ``frontier``, ``autoattack``,
``llm-sar``, ``train-defenses``) can keep XLA's compiled executables in a directory, so that a
rerun with the same shapes (another eps, delta, seed or output directory, a resumed run, the same
architecture in another pool) loads them instead of compiling again. JAX keys each entry by the
program, the compile options, the backend and the jax/jaxlib versions, so a stale entry is never
used for another program (JAX's "Persistent compilation cache" documentation); results do not
depend on whether the cache is on. On this project's 2-core CPU a packed SAR shape costs about
15 CPU-seconds to compile (``benchmarks/sar_compile_cost.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_MIN_SECONDS = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def enable_compile_cache(path: str | os.PathLike, min_compile_seconds: float | None = None) -> Path:
    """Turns on XLA's persistent compilation cache in ``path`` for this process.

    Call it before the first compilation you want cached (programs compiled earlier are not
    written). The directory is created if needed.

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
    import jax

    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ValueError(f"--compile-cache {str(path)!r} exists and is not a directory")
    if min_compile_seconds is None:
        env = os.environ.get(ENV_MIN_SECONDS)
        min_compile_seconds = float(env) if env not in (None, "") else 1.0
    if not min_compile_seconds >= 0:
        raise ValueError(f"min_compile_seconds must be >= 0, got {min_compile_seconds}")
    p.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(p))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return p


def add_compile_cache_argument(parser) -> None:
    """Adds ``--compile-cache DIR`` to an argparse (sub)parser."""
    parser.add_argument(
        "--compile-cache",
        default=None,
        metavar="DIR",
        help="XLA persistent compilation cache directory: a rerun with the same shapes loads the compiled "
        "programs instead of compiling them (results unchanged; default: none)",
    )
