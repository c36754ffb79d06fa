"""Save and restore pools with orbax-checkpoint, verified against a fingerprint.

Layout of a pool directory::

    DIR/pool.json          format version, member names, one entry per stack (its kind and spec),
                           config, and the fingerprint below
    DIR/stack_000/ ...     orbax checkpoint of stack 0's stacked params
    DIR/stack_001/ ...

Stacks of every kind (:mod:`sarjax.models.stack`) are saved.  A zoo stack is restored from its
architecture spec alone (entry ``{"kind": "zoo", "arch": {...}, "names": [...]}``, params saved as
their nested dict).  Any other kind (``{"kind": "linen", "spec": {...}, "names": [...]}``, params
saved as a flat ``{"leaf_00000": ...}`` dict in ``jax.tree.leaves`` order) needs the user's
builder at load time: ``load_pool(path, builders={spec_name: fn})``, where ``fn()`` returns what
the kind's ``restore`` takes (the module for linen and nnx, the apply for a plain function); a
missing builder raises :class:`CheckpointError` naming it.  :func:`save_pool` records, per such
stack, an import path that rebuilds it (``"builder"`` in the stack's entry,
:mod:`sarjax.models.builders`: found by itself for module-level applies and linen modules, given
with ``save_pool(..., builders={name: "PKG.MODULE:FUNCTION"})`` for nnx and PyTorch modules), so
that ``load_pool(path)`` needs no ``builders=``.  Format ``sarjax-pool/3``;
``sarjax-pool/2`` (zoo stacks only) still loads, fully verified.

The fingerprint (``pool.json["fingerprint"]``) holds, per stack, every params leaf's path, shape
and dtype, the size of every file orbax wrote, and a SHA-256 of each member's params; and for the
pool, the logits of every member on a fixed probe batch (:func:`probe_batch`). :func:`load_pool`
checks all of them and raises :class:`CheckpointError` naming the path, the stack or member and
what differs, so an edited ``pool.json`` (another activation, class count or width), a truncated
file or params corrupted into other finite values never load as a silently different pool.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from sarjax.models.builders import build as build_from_record
from sarjax.models.builders import builder_record
from sarjax.models.pool import Pool, Stack
from sarjax.models.stack import BaseStack, stack_kind
from sarjax.models.zoo import Arch

FORMAT = "sarjax-pool/3"
FINGERPRINTED_FORMATS = ("sarjax-pool/2", FORMAT)  # /2: zoo stacks only, entries without "kind"
LEGACY_FORMATS = ("sarjax-pool/1",)  # no fingerprint: loaded with a CheckpointWarning

PROBE_SEED = 20240613
PROBE_BATCH = 4
PROBE_RTOL = 1e-4  # probe logits must agree within PROBE_RTOL * (1 + max |saved logit|) per member


class CheckpointError(ValueError):
    """A pool checkpoint is missing, partial, corrupt, or does not match its fingerprint."""


class CheckpointWarning(UserWarning):
    """A pool checkpoint was loaded without verification (an older format with no fingerprint)."""


# ----------------------------------------------------------------------------- fingerprint pieces


def probe_batch(input_shape: tuple[int, ...], n: int = PROBE_BATCH, seed: int = PROBE_SEED) -> np.ndarray:
    """The fixed probe inputs whose logits a checkpoint stores: [n, *input_shape] float32 in [0, 1)."""
    return np.random.default_rng(seed).random((n, *input_shape), dtype=np.float32)


def probe_logits(pool: Pool, x: np.ndarray) -> np.ndarray:
    """[M, n, C] float32 logits of every member on ``x`` at full float32 matmul precision.

    ``"highest"`` precision keeps the probe comparable across backends (an accelerator's default
    may use TF32 / bf16 passes, whose error is far above the tolerance).
    """
    with jax.default_matmul_precision("highest"):  # pool.logits: the jitted apply pools of one structure share
        return np.asarray(pool.logits(jnp.asarray(x)), np.float32)


def _leaves(tree) -> list[tuple[str, tuple[int, ...], str]]:
    return [
        (jax.tree_util.keystr(p), tuple(int(d) for d in np.shape(l)), str(np.dtype(l.dtype)))
        for p, l in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def member_hashes(stack: BaseStack) -> list[str]:
    """SHA-256 (hex) of each member's params: every leaf's path, per-member shape, dtype and bytes."""
    leaves = [
        (jax.tree_util.keystr(p), np.asarray(l)) for p, l in jax.tree_util.tree_flatten_with_path(stack.params)[0]
    ]
    out = []
    for i in range(stack.size):
        h = hashlib.sha256()
        for key, a in leaves:
            m = np.ascontiguousarray(a[i])
            h.update(repr((key, m.shape, str(m.dtype))).encode())
            h.update(m.tobytes())
        out.append(h.hexdigest())
    return out


def _file_sizes(directory: Path) -> dict[str, int]:
    return {f.relative_to(directory).as_posix(): f.stat().st_size for f in sorted(directory.rglob("*")) if f.is_file()}


# ----------------------------------------------------------------------------- save


def save_pool(
    pool: Pool,
    path: str | os.PathLike,
    config: dict[str, Any] | None = None,
    *,
    overwrite: bool = True,
    builders: dict[str, str] | None = None,
) -> Path:
    """Save a pool: params (orbax), architecture specs, member names, a config and a fingerprint.

    For every stack that is not a zoo stack, ``pool.json`` also records how to rebuild its
    architecture (:func:`sarjax.models.builders.builder_record`), so that :func:`load_pool` and
    the commands restore it without code: the path given in ``builders``, else one found by
    itself (a plain-function stack whose apply is a module-level function; a linen module
    rebuilt from its class and JSON-able fields). A stack with neither is saved with a warning:
    loading it then needs ``load_pool(path, builders=...)``.

    Args:
      pool: the pool.
      path: directory to write (created; replaced when ``overwrite``).
      config: JSON-able metadata (e.g. the training config and accuracies).
      builders: ``{stack name: "PKG.MODULE:FUNCTION"}``, a zero-argument function returning what
        the stack kind restores from (the nnx or torch module of the architecture, the linen
        module, the apply); importable where the pool will be loaded.

    Returns:
      The absolute directory path. ``pool.json`` is written last (a ``pool.json`` means the params
      are complete); its ``fingerprint`` is what :func:`load_pool` verifies.
    """
    records = _builder_records(pool, builders or {})
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        for i, s in enumerate(pool.stacks):
            ckptr.save(path / f"stack_{i:03d}", _saved_tree(s), force=overwrite)
        ckptr.wait_until_finished()
    x = probe_batch(pool.input_shape)
    meta = {
        "format": FORMAT,
        "names": list(pool.names),
        "stacks": [_stack_entry(s, r) for s, r in zip(pool.stacks, records)],
        "config": config or {},
        "fingerprint": {
            "stacks": [
                {
                    "leaves": [[k, list(shape), dt] for k, shape, dt in _leaves(s.params)],
                    "files": _file_sizes(path / f"stack_{i:03d}"),
                    "members": member_hashes(s),
                }
                for i, s in enumerate(pool.stacks)
            ],
            "probe": {
                "seed": PROBE_SEED,
                "batch": PROBE_BATCH,
                "logits": probe_logits(pool, x).tolist(),
            },  # float32 -> float: exact
        },
    }
    tmp = path / "pool.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(path / "pool.json")
    return path


def _saved_tree(s: BaseStack):
    """What orbax writes for a stack: the zoo's nested dict, or any other kind's leaves as a flat dict."""
    if isinstance(s, Stack):
        return jax.tree.map(np.asarray, s.params)
    return {f"leaf_{j:05d}": np.asarray(leaf) for j, leaf in enumerate(jax.tree.leaves(s.params))}


def _builder_records(pool: Pool, builders: dict[str, str]) -> list[dict | None]:
    """Each stack's builder record (None for zoo stacks); warns for stacks left without one."""
    if not isinstance(builders, dict) or not all(isinstance(k, str) for k in builders):
        raise TypeError(f"builders must be a dict {{stack name: 'PKG.MODULE:FUNCTION'}}, got {builders!r:.80}")
    named = {s.name for s in pool.stacks if not isinstance(s, Stack)}
    unknown = sorted(set(builders) - named)
    if unknown:
        raise ValueError(f"builders name stacks {unknown} that the pool lacks (its non-zoo stacks: {sorted(named)})")
    records: list[dict | None] = []
    missing = []
    for s in pool.stacks:
        if isinstance(s, Stack) or not type(s).needs_builder:
            records.append(None)
            continue
        rec = builder_record(s, builders.get(s.name))
        if rec is None:
            missing.append(f"{s.name} ({s.kind})")
        records.append(rec)
    if missing:
        warnings.warn(
            f"save_pool: no importable builder for stack(s) {missing}; loading the pool will need "
            "load_pool(path, builders=...), and the commands cannot load it. Pass "
            "save_pool(..., builders={stack name: 'PKG.MODULE:FUNCTION'}) to record one.",
            UserWarning,
            stacklevel=3,
        )
    return records


def _stack_entry(s: BaseStack, builder: dict | None = None) -> dict:
    if isinstance(s, Stack):
        return {"kind": "zoo", "arch": s.arch.spec(), "names": list(s.names)}
    spec = s.spec()
    json.dumps(spec)  # a kind's spec must be JSON data (raises TypeError naming the value)
    entry = {"kind": s.kind, "spec": spec, "names": list(s.names)}
    if builder is not None:
        entry["builder"] = builder
    return entry


# ----------------------------------------------------------------------------- load


def _is_str_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(n, str) for n in v)


def load_pool_meta(path: str | os.PathLike) -> dict:
    """Read ``pool.json`` of a pool directory and check its structure.

    Raises:
      CheckpointError: naming the path and the field that is missing or of the wrong type.
    """
    path = Path(path).absolute()
    if not path.is_dir():
        raise CheckpointError(f"pool checkpoint {path}: directory does not exist")
    meta_file = path / "pool.json"
    if not meta_file.is_file():
        raise CheckpointError(
            f"pool checkpoint {path}: missing pool.json (found {sorted(p.name for p in path.iterdir())})"
        )
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"pool checkpoint {path}: pool.json is not valid JSON ({e})") from e

    def bad(msg):
        return CheckpointError(f"pool checkpoint {path}: pool.json {msg}")

    if not isinstance(meta, dict) or meta.get("format") not in (*FINGERPRINTED_FORMATS, *LEGACY_FORMATS):
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise bad(f"is not a {FORMAT} file (format: {got!r})")
    if not _is_str_list(meta.get("names")):
        raise bad(f"'names' must be a list of member names, got {meta.get('names')!r:.80}")
    stacks = meta.get("stacks")
    if not isinstance(stacks, list) or not stacks:
        raise bad(
            f"'stacks' must be a non-empty list of {{'arch': {{...}}, 'names': [...]}} objects, got {stacks!r:.80}"
        )
    for i, sm in enumerate(stacks):
        kind = sm.get("kind", "zoo") if isinstance(sm, dict) and meta["format"] == FORMAT else "zoo"
        if kind == "zoo":
            if not isinstance(sm, dict) or not isinstance(sm.get("arch"), dict) or not _is_str_list(sm.get("names")):
                raise bad(f"stack {i}: expected {{'arch': {{...}}, 'names': [...]}}, got {sm!r:.80}")
        elif (
            not isinstance(kind, str)
            or not isinstance(sm.get("spec"), dict)
            or not isinstance(sm["spec"].get("name"), str)
            or not _is_str_list(sm.get("names"))
        ):
            raise bad(
                f"stack {i}: expected {{'kind': str, 'spec': {{'name': str, ...}}, 'names': [...]}}, got {sm!r:.80}"
            )
    if not isinstance(meta.get("config", {}), dict):
        raise bad(f"'config' must be an object, got {type(meta['config']).__name__}")
    if meta["format"] in FINGERPRINTED_FORMATS:
        fp = meta.get("fingerprint")
        ok = (
            isinstance(fp, dict)
            and isinstance(fp.get("stacks"), list)
            and len(fp["stacks"]) == len(stacks)
            and all(
                isinstance(f, dict)
                and isinstance(f.get("leaves"), list)
                and isinstance(f.get("files"), dict)
                and _is_str_list(f.get("members"))
                for f in fp["stacks"]
            )
            and isinstance(fp.get("probe"), dict)
            and isinstance(fp["probe"].get("logits"), list)
        )
        if not ok:
            raise bad(
                f"has no valid 'fingerprint' (leaves, files and member hashes for each of the "
                f"{len(stacks)} stack(s), probe logits); re-save the pool"
            )
    return meta


def _check_files(path: Path, i: int, target_dir: Path, files: dict) -> None:
    """Every file orbax wrote exists with its saved size (before orbax reads any of them)."""
    problems = []
    for rel, size in files.items():
        f = target_dir / rel
        if not f.is_file():
            problems.append(f"{rel} is missing")
        elif f.stat().st_size != size:
            problems.append(f"{rel} has {f.stat().st_size} bytes, saved with {size}")
    if problems:
        raise CheckpointError(
            f"pool checkpoint {path}: stack {i} params files are truncated or changed: "
            + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
        )


def _compare_leaves(
    path: Path, i: int, name: str, want_leaves: list, got_leaves: list, want_is: str, got_is: str
) -> None:
    want = {k: (tuple(s), d) for k, s, d in want_leaves}
    got = {k: (tuple(s), d) for k, s, d in got_leaves}
    if want == got:
        return
    diffs = [
        f"{k}: {got_is} {got.get(k, 'absent')}, {want_is} {want.get(k, 'absent')}"
        for k in sorted(set(want) | set(got))
        if want.get(k) != got.get(k)
    ]
    raise CheckpointError(
        f"pool checkpoint {path}: stack {i} ({name}): params (shape, dtype) do not match: "
        + "; ".join(diffs[:4])
        + (f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else "")
    )


def _restore_zoo(path: Path, i: int, sm: dict, fp: dict | None) -> Stack:
    """Stack ``i`` of the zoo: architecture from its spec, params target from ``arch.init``."""
    try:
        arch = Arch.from_spec(sm["arch"])
    except (TypeError, KeyError, ValueError) as e:
        raise CheckpointError(f"pool checkpoint {path}: bad architecture spec for stack {i}: {e}") from e
    names = tuple(sm["names"])
    target_dir = path / f"stack_{i:03d}"
    if not target_dir.is_dir():
        raise CheckpointError(
            f"pool checkpoint {path}: missing params directory {target_dir.name} for stack {i} ({arch.name})"
        )
    try:
        abstract = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), len(names)))
    except Exception as e:
        raise CheckpointError(
            f"pool checkpoint {path}: stack {i}: the architecture spec cannot build params: {type(e).__name__}: {e}"
        ) from e
    if fp is not None:
        sfp = fp["stacks"][i]
        saved = _saved_leaves(path, i, sfp)
        _compare_leaves(
            path, i, arch.name, saved, _leaves(abstract), "saved params", "the architecture in pool.json gives"
        )
        _check_files(path, i, target_dir, sfp["files"])
    try:
        with ocp.StandardCheckpointer() as ckptr:
            params = ckptr.restore(target_dir, abstract)
    except Exception as e:  # orbax / tensorstore raise many types for corrupt files
        raise CheckpointError(
            f"pool checkpoint {path}: cannot restore {target_dir.name} ({arch.name}): {type(e).__name__}: {e}"
        ) from e
    _compare_leaves(
        path,
        i,
        arch.name,
        _leaves(abstract),
        _leaves(params),
        "the architecture in pool.json gives",
        "restored params",
    )
    try:
        stack = Stack(arch, params, names)
    except ValueError as e:
        raise CheckpointError(f"pool checkpoint {path}: stack {i}: {e}") from e
    return stack


def _saved_leaves(path: Path, i: int, sfp: dict) -> list[tuple[str, tuple[int, ...], str]]:
    try:
        return [(str(k), tuple(int(d) for d in s), str(dt)) for k, s, dt in sfp["leaves"]]
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"pool checkpoint {path}: pool.json fingerprint of stack {i} is malformed ({e})") from e


def _restore_kind(path: Path, i: int, kind: str, sm: dict, fp: dict | None, builders: dict) -> BaseStack:
    """Stack ``i`` of a kind other than the zoo: flat leaves from orbax, structure from the user's builder."""
    spec, names = sm["spec"], tuple(sm["names"])
    name = spec["name"]
    try:
        cls = stack_kind(kind)
    except (ValueError, ImportError) as e:
        raise CheckpointError(f"pool checkpoint {path}: stack {i} ({name}): {e}") from e
    built = None
    if cls.needs_builder and name not in builders and sm.get("builder") is not None:
        record = sm["builder"]
        try:
            built = build_from_record(record)
        except ValueError as e:
            raise CheckpointError(f"pool checkpoint {path}: stack {i} ({name}): its recorded builder: {e}") from e
    elif cls.needs_builder:
        if name not in builders:
            raise CheckpointError(
                f"pool checkpoint {path}: stack {i} is a {kind!r} stack named {name!r} saved without a builder "
                f"path; restoring it needs its builder: load_pool(path, builders={{{name!r}: fn}}) where fn() returns "
                f"{_BUILDER_RETURNS.get(kind, 'what the kind restores from')} (builders given: {sorted(builders)}), "
                f"or re-save it with save_pool(..., builders={{{name!r}: 'PKG.MODULE:FUNCTION'}})"
            )
        try:
            built = builders[name]()
        except Exception as e:
            raise CheckpointError(
                f"pool checkpoint {path}: stack {i} ({name}): the builder failed: {type(e).__name__}: {e} "
                f"(a builder is a zero-argument function returning {_BUILDER_RETURNS.get(kind, 'the model')})"
            ) from e
    target_dir = path / f"stack_{i:03d}"
    if not target_dir.is_dir():
        raise CheckpointError(
            f"pool checkpoint {path}: missing params directory {target_dir.name} for stack {i} ({name})"
        )
    if fp is None:  # only a fingerprinted format has kinds other than the zoo
        raise CheckpointError(f"pool checkpoint {path}: stack {i} ({name}) of kind {kind!r} has no fingerprint")
    sfp = fp["stacks"][i]
    saved = _saved_leaves(path, i, sfp)
    _check_files(path, i, target_dir, sfp["files"])
    abstract = {f"leaf_{j:05d}": jax.ShapeDtypeStruct(shape, np.dtype(dt)) for j, (_, shape, dt) in enumerate(saved)}
    try:
        with ocp.StandardCheckpointer() as ckptr:
            flat = ckptr.restore(target_dir, abstract)
    except Exception as e:  # orbax / tensorstore raise many types for corrupt files
        raise CheckpointError(
            f"pool checkpoint {path}: cannot restore {target_dir.name} ({name}): {type(e).__name__}: {e}"
        ) from e
    leaves = [flat[k] for k in sorted(abstract)]
    try:
        stack = cls.restore(spec, leaves, [k for k, _, _ in saved], names, built)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"pool checkpoint {path}: stack {i} ({name}): cannot rebuild the {kind!r} stack from its builder: "
            f"{type(e).__name__}: {e}"
        ) from e
    _compare_leaves(path, i, name, saved, _leaves(stack.params), "saved params", "the builder's model gives")
    return stack


_BUILDER_RETURNS = {
    "function": "the one-member apply, or (apply, one member's example params)",
    "linen": "the flax linen module",
    "nnx": "an nnx module of the architecture (any weights)",
    "torch": "the torch module of the architecture (any weights)",
}


def load_pool(path: str | os.PathLike, builders: dict[str, Callable[[], Any]] | None = None) -> tuple[Pool, dict]:
    """Restore a pool saved by :func:`save_pool` and verify it against its fingerprint.

    Checks, in order: the structure of ``pool.json``; per stack, that the architecture spec gives
    the saved params' leaf paths, shapes and dtypes, that every orbax file has its saved size (so a
    truncated file fails here, before orbax reads it), that the restored leaves have the expected
    shapes and that each member's params hash to the saved SHA-256; finally that every member's
    logits on the probe batch agree with the saved ones within ``PROBE_RTOL * (1 + max |saved|)``
    (computed at float32 matmul precision, so a change of backend or ``conv_impl`` passes while
    another activation does not).

    A stack of a kind other than the zoo is rebuilt by ``builders[spec_name]()`` (its params
    structure is then checked against the saved leaves, and the member hashes and probe logits
    as for the zoo).  A checkpoint of an older format (``sarjax-pool/1``, no fingerprint) loads
    with a :class:`CheckpointWarning`: only the structure and the restored shapes are checked.

    Args:
      path: the pool directory.
      builders: ``{stack name: zero-argument function}`` for the stacks that are not zoo stacks;
        it overrides the builder path that :func:`save_pool` recorded (stacks with a recorded
        path need no entry)
        (the name is the stack's ``spec()["name"]``, also in ``pool.json``): ``fn()`` returns the
        flax linen module, an nnx module of the architecture, the one-member apply of a plain
        function stack (or ``(apply, example params of one member)``), ...

    Returns:
      (pool, config) — the logits of the restored pool are bit-identical to the saved one's.

    Raises:
      CheckpointError (a ValueError): naming the path, the stack / member / file and what differs.
    """
    path = Path(path).absolute()
    meta = load_pool_meta(path)
    fp = meta.get("fingerprint")
    if fp is None:
        warnings.warn(
            f"pool checkpoint {path}: format {meta['format']!r} has no fingerprint; loaded without "
            f"verifying params or logits (re-save it with save_pool to add one)",
            CheckpointWarning,
            stacklevel=2,
        )
    stacks = []
    for i, sm in enumerate(meta["stacks"]):
        names = tuple(sm["names"])
        kind = sm.get("kind", "zoo") if meta["format"] == FORMAT else "zoo"
        if kind == "zoo":
            stack = _restore_zoo(path, i, sm, fp)
        else:
            stack = _restore_kind(path, i, kind, sm, fp, builders or {})
        if fp is not None:
            got = member_hashes(stack)
            if len(fp["stacks"][i]["members"]) != len(got):
                raise CheckpointError(
                    f"pool checkpoint {path}: stack {i}: {len(got)} members but "
                    f"{len(fp['stacks'][i]['members'])} saved hashes"
                )
            bad = [n for n, g, w in zip(names, got, fp["stacks"][i]["members"]) if g != w]
            if bad:
                raise CheckpointError(
                    f"pool checkpoint {path}: stack {i} ({stack.name}): params of member(s) {bad} "
                    f"differ from the saved ones (SHA-256 mismatch: corrupt or replaced files)"
                )
        stacks.append(stack)
    try:
        pool = Pool(stacks)
    except ValueError as e:
        raise CheckpointError(f"pool checkpoint {path}: {e}") from e
    if list(pool.names) != list(meta["names"]):
        raise CheckpointError(
            f"pool checkpoint {path}: member names in pool.json ({meta['names']}) do not match "
            f"the stacks ({list(pool.names)})"
        )
    if fp is not None:
        _check_probe(path, pool, fp["probe"])
    return pool, meta.get("config", {})


def _check_probe(path: Path, pool: Pool, probe: dict) -> None:
    """Every member's logits on the probe batch agree with the saved ones (names the members)."""
    try:
        want = np.asarray(probe["logits"], np.float32)
        x = probe_batch(pool.input_shape, int(probe.get("batch", PROBE_BATCH)), int(probe.get("seed", PROBE_SEED)))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"pool checkpoint {path}: pool.json probe logits are malformed ({e})") from e
    got = probe_logits(pool, x)
    if want.shape != got.shape:
        raise CheckpointError(
            f"pool checkpoint {path}: the restored pool gives probe logits of shape {list(got.shape)} "
            f"[members, batch, classes], the saved pool gave {list(want.shape)}: pool.json's "
            f"architecture (e.g. num_classes) was changed"
        )
    err = np.abs(got - want).reshape(len(want), -1).max(axis=1)
    tol = PROBE_RTOL * (1.0 + np.abs(want).reshape(len(want), -1).max(axis=1))
    bad = np.flatnonzero(~(err <= tol))
    if bad.size:
        parts = []
        for s, sl in zip(pool.stacks, pool.member_slices):
            hit = [m for m in bad if sl.start <= m < sl.stop]
            if hit:
                parts.append(
                    f"stack {pool.stacks.index(s)} ({'arch' if isinstance(s, Stack) else 'spec'} "
                    f"{s.arch.spec() if isinstance(s, Stack) else s.spec()}): "
                    + ", ".join(f"{pool.names[m]!r} by {err[m]:.3g} (tolerance {tol[m]:.2g})" for m in hit[:4])
                    + (f" and {len(hit) - 4} more" if len(hit) > 4 else "")
                )
        raise CheckpointError(
            f"pool checkpoint {path}: probe-batch logits of {bad.size} member(s) differ from the saved "
            f"ones; pool.json's architecture does not compute the saved model: " + "; ".join(parts)
        )
