"""Save and restore pools with orbax-checkpoint.

Layout of a pool directory::

    DIR/pool.json          format version, member names, one architecture spec per stack, config
    DIR/stack_000/ ...     orbax checkpoint of stack 0's stacked params
    DIR/stack_001/ ...
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import Arch

FORMAT = "sarjax-pool/1"


class CheckpointError(ValueError):
    """A pool checkpoint is missing, partial or corrupt."""


def save_pool(pool: Pool, path: str | os.PathLike, config: dict[str, Any] | None = None, *, overwrite: bool = True) -> Path:
    """Save a pool: params (orbax), architecture specs, member names and a training config.

    Args:
      pool: the pool.
      path: directory to write (created; replaced when ``overwrite``).
      config: JSON-able metadata (e.g. the training config and accuracies).

    Returns:
      The absolute directory path.
    """
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "names": list(pool.names),
        "stacks": [{"arch": s.arch.spec(), "names": list(s.names)} for s in pool.stacks],
        "config": config or {},
    }
    with ocp.StandardCheckpointer() as ckptr:
        for i, s in enumerate(pool.stacks):
            target = path / f"stack_{i:03d}"
            ckptr.save(target, jax.tree.map(np.asarray, s.params), force=overwrite)
        ckptr.wait_until_finished()
    tmp = path / "pool.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(path / "pool.json")  # written last: a pool.json means the params are complete
    return path


def load_pool_meta(path: str | os.PathLike) -> dict:
    """Read and validate ``pool.json`` of a pool directory (raises :class:`CheckpointError`)."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"pool checkpoint {path}: directory does not exist")
    meta_file = path / "pool.json"
    if not meta_file.is_file():
        raise CheckpointError(f"pool checkpoint {path}: missing pool.json (found {sorted(p.name for p in path.iterdir())})")
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"pool checkpoint {path}: pool.json is not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "stacks" not in meta:
        raise CheckpointError(f"pool checkpoint {path}: pool.json is not a {FORMAT} file")
    return meta


def load_pool(path: str | os.PathLike) -> tuple[Pool, dict]:
    """Restore a pool saved by :func:`save_pool`.

    Returns:
      (pool, config) — the logits of the restored pool are bit-identical to the saved one's.

    Raises:
      CheckpointError (a ValueError): naming the path and what is missing or corrupt.
    """
    path = Path(path).absolute()
    meta = load_pool_meta(path)
    stacks = []
    with ocp.StandardCheckpointer() as ckptr:
        for i, sm in enumerate(meta["stacks"]):
            try:
                arch = Arch.from_spec(sm["arch"])
            except (TypeError, KeyError, ValueError) as e:
                raise CheckpointError(f"pool checkpoint {path}: bad architecture spec for stack {i}: {e}") from e
            names = tuple(sm["names"])
            target_dir = path / f"stack_{i:03d}"
            if not target_dir.is_dir():
                raise CheckpointError(f"pool checkpoint {path}: missing params directory {target_dir.name} for stack {i} ({arch.name})")
            abstract = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), len(names)))
            try:
                params = ckptr.restore(target_dir, abstract)
            except Exception as e:  # orbax raises many types for truncated / corrupt files
                raise CheckpointError(f"pool checkpoint {path}: cannot restore {target_dir.name} ({arch.name}): {type(e).__name__}: {e}") from e
            stacks.append(Stack(arch, params, names))
    pool = Pool(stacks)
    if list(pool.names) != list(meta["names"]):
        raise CheckpointError(f"pool checkpoint {path}: member names in pool.json do not match the stacks")
    return pool, meta.get("config", {})
