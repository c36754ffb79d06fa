"""AutoAttack on a pool in memory: run it, write the JSON report and the per-image npz, read them back.

:func:`run_autoattack` is what ``sarjax autoattack`` runs once it has loaded a pool and images
(a saved pool, ``--model PKG.MODULE:FUNCTION``, MNIST or ``--images FILE.npz``): it checks the
images against the pool, runs :func:`sarjax.attacks.autoattack.autoattack_pool`, and, given
``out``, writes

* ``OUT.json``: the report (settings, clean and robust accuracy per member, the per-stage log,
  query totals, the sanity checks' warnings, the run's metadata);
* ``OUT.npz`` beside it (same stem, ``np.savez_compressed``): per image and member ``robust
  [N, M]`` and ``clean [N, M]`` (bool), ``queries [N, M]`` (int64), the adversarial points
  ``x_adv [N, M, *S]`` (float32; the clean image where the member was not broken), ``ids [N]``
  (each image's sample id, which seeds its random streams), ``y [N]`` and ``members [M]``.

:func:`load_autoattack` reads both back. Across processes (``distribute=True`` on JAX's
distributed runtime) every process runs its share of each attack run's chunks, the chunks'
results are gathered after every run (:func:`sarjax.attacks.autoattack.autoattack`), and
process 0 writes the outputs: bit-identical to one process (docs/autoattack.md).

Resume (``checkpoint_dir``, ``sarjax autoattack --checkpoint DIR``): the cascade's state is saved
after every completed attack run (``DIR/call_<j>.npz``, one per AutoAttack call; per process in
``DIR/process_<i>_of_<n>`` when distributed) with ``DIR/fingerprint.json``
(:mod:`sarjax.runtime.fingerprint`); a rerun with the same settings skips the completed runs
(bit-identical result), one with other settings is refused naming them, ``overwrite`` discards.
"""

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from sarjax.attacks import autoattack as aa  # the module: autoattack_pool is looked up at call time (tests replace it)
from sarjax.attacks.autoattack import N_ITER, SQUARE_QUERIES, AutoAttackResult
from sarjax.data.images import check_ids, check_images
from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.distributed import all_ok, is_main, process_checkpoint_dir, process_count

CHECKPOINT_HINT = "pass --overwrite (overwrite=True) to discard it, or choose another --checkpoint directory"

# the report's fields: AutoAttackResult.to_json's and the run's (meta may not replace them)
_OWN_FIELDS = frozenset(
    ("version", "norm", "eps", "members", "clean_accuracy", "robust_accuracy", "queries_total")
    + ("queries_per_sample_mean", "stages", "warnings", "samples", "seed", "seconds", "budget", "npz")
)


def output_paths(out: str | os.PathLike) -> tuple[Path, Path]:
    """``(OUT.json, OUT.npz)`` for ``out`` (the JSON path; the npz has the same stem).

    Raises:
        ValueError: ``out`` ends in ``.npz`` (the report and the arrays would share a name).
    """
    path = Path(out)
    if path.suffix == ".npz":
        raise ValueError(f"out must be the JSON report's path (the arrays go to OUT.npz beside it), got {str(path)!r}")
    return path, path.with_suffix(".npz")


def run_autoattack(
    pool,
    x,
    y,
    *,
    norm: str,
    eps: float,
    out: str | os.PathLike | None = None,
    version: str = "standard",
    seed: int = 0,
    ids=None,
    batch_size: int | None = None,
    n_iter: int = N_ITER,
    fab_iter: int = N_ITER,
    square_queries: int = SQUARE_QUERIES,
    wrap: Callable | None = None,
    stochastic: dict[str, Callable] | None = None,
    per_member: bool = False,
    attacks=None,
    checks: bool = True,
    log: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    distribute: bool = False,
    meta: dict[str, Any] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> AutoAttackResult:
    """AutoAttack on every member of ``pool`` for the images ``x, y``; writes ``out`` when given.

    Args:
      pool: a :class:`sarjax.models.pool.Pool`.
      x: ``[N, *pool.input_shape]`` images in [0, 1]; y: ``[N]`` labels in ``[0, pool.num_classes)``
        (checked by :func:`sarjax.data.images.check_images`).
      norm, eps, version: the threat model and AutoAttack's version (``"standard"``, ``"plus"``,
        ``"rand"``).
      out: the JSON report's path (``OUT.npz`` is written beside it), or None to write nothing.
      seed: the attack's key is ``jax.random.PRNGKey(seed)``.
      ids: ``[N]`` distinct non-negative sample ids (each image's random streams; default
        ``0 .. N-1``), recorded in the npz.
      batch_size, n_iter, fab_iter, square_queries, per_member, attacks, checks: as
        :func:`sarjax.attacks.autoattack.autoattack_pool` / :func:`~sarjax.attacks.autoattack.autoattack`
        (``attacks``: a custom list of stages; None: the version's).
      wrap, stochastic: the randomized models of ``version="rand"`` (as ``autoattack_pool``).
      log: print AutoAttack's log (on process 0 only when distributed).
      progress: ``progress(stage, done, total)`` after every chunk of every stage
        (:func:`~sarjax.attacks.autoattack.autoattack`); it only observes.
      distribute: spread the attack runs' chunks over the processes of JAX's distributed runtime
        (every process calls this with the same arguments; each returns the whole result,
        bit-identical to one process; process 0 writes ``out``).
      meta: more fields for the JSON report (e.g. the pool's path, the data's source); they may
        not replace the result's own fields.
      checkpoint_dir: resume: the cascade's state is saved here after every completed attack run
        (per process in ``process_<i>_of_<n>`` when distributed), with a fingerprint of the
        settings (pool content hash, images, ids, norm, eps, version, stages, budgets, batch
        size, seed, processes, sarjax version); a rerun with the same fingerprint skips the
        completed runs and gives the uninterrupted result bit for bit. None: no checkpoint.
      overwrite: discard the checkpoints ``checkpoint_dir`` holds (any settings) and start over.

    Returns:
      The :class:`~sarjax.attacks.autoattack.AutoAttackResult` (every process, when distributed).

    Raises:
      ValueError: images that fail the checks (naming what is wrong), ``ids`` that are not
        ``N`` distinct non-negative ints, an ``out`` ending in ``.npz``, ``meta`` clashing with
        a result field; the attack's own errors (bad eps, norm, version, ...); a ``checkpoint_dir``
        written with other settings (naming each one that differs) unless ``overwrite``.
    """
    xf, yi = check_images(x, y, input_shape=tuple(pool.input_shape), num_classes=int(pool.num_classes))
    sample_ids = np.arange(len(xf), dtype=np.int64) if ids is None else check_ids(ids, len(xf))
    paths = output_paths(out) if out is not None else None
    clash = sorted(set(meta or {}) & _OWN_FIELDS)
    if clash:
        raise ValueError(f"meta may not replace the report's own fields, got {clash}")
    ck = None
    if checkpoint_dir is not None:
        ck = _open_checkpoint(
            Path(checkpoint_dir),
            {
                **fingerprints.pool_fingerprint(pool),
                "images": fingerprints.array_digest(xf, yi),
                "ids": fingerprints.array_digest(sample_ids),
                "norm": norm,
                "eps": float(eps),
                "version": version,
                "stages": list(aa.stages_of(version, norm) if attacks is None else attacks),
                "n_iter": n_iter,
                "fab_iter": fab_iter,
                "square_queries": square_queries,
                "batch_size": batch_size,
                "seed": seed,
                "per_member": per_member,
                "checks": checks,
                "wrap": wrap is not None,
                "stochastic": None if stochastic is None else sorted(stochastic),
                "processes": process_count() if distribute else 1,
                "sarjax": fingerprints.sarjax_version(),
            },
            overwrite,
            distribute and process_count() > 1,
        )
    t0 = time.perf_counter()
    res = aa.autoattack_pool(
        pool,
        xf,
        yi,
        norm=norm,
        eps=eps,
        key=jax.random.PRNGKey(seed),
        version=version,
        batch_size=batch_size,
        n_iter=n_iter,
        fab_iter=fab_iter,
        square_queries=square_queries,
        wrap=wrap,
        stochastic=stochastic,
        per_member=per_member,
        attacks=attacks,
        checks=checks,
        log=log,
        **({} if ids is None else {"sample_ids": sample_ids}),
        **({} if progress is None else {"progress": progress}),
        **({"distribute": True} if distribute else {}),
        **({} if ck is None else {"checkpoint_dir": ck}),
    )
    seconds = time.perf_counter() - t0
    if paths is not None and is_main():
        _write(paths, res, yi, sample_ids, seconds, seed, (n_iter, fab_iter, square_queries), meta or {})
    return res


def _open_checkpoint(directory: Path, fp: dict[str, Any], overwrite: bool, multi: bool) -> Path:
    """This process's checkpoint folder under ``directory``, its fingerprint checked (or written).

    Raises:
      ValueError: the folder holds checkpoints of other settings (naming them) and not ``overwrite``.
    """
    pdir = process_checkpoint_dir(directory) if multi else directory
    has = pdir.is_dir() and any(pdir.glob("call_*.npz*"))
    if overwrite and pdir.is_dir():
        fingerprints.remove_paths(pdir, ["call_*.npz*", fingerprints.FINGERPRINT_FILE])
        has = False
    err = None
    try:
        if fingerprints.check_fingerprint(pdir, fp, hint=CHECKPOINT_HINT, holds_results=has) is None:
            fingerprints.write_fingerprint(pdir, fp)
    except fingerprints.FingerprintMismatch as e:
        err = ValueError(f"{e.reason}; {CHECKPOINT_HINT}")
    if multi and not all_ok(err is None):  # every process stops when one refuses its folder
        raise err or ValueError(f"another process refused its checkpoint folder (see its log); {CHECKPOINT_HINT}")
    if err is not None:
        raise err
    return pdir


def _write(paths, res: AutoAttackResult, y, ids, seconds: float, seed: int, budget, meta: dict) -> None:
    json_path, npz_path = paths
    record = res.to_json()
    record.update(meta)
    n_iter, fab_iter, square_queries = budget
    record.update(
        samples=int(len(y)),
        seed=seed,
        seconds=seconds,
        budget=dict(n_iter=n_iter, fab_iter=fab_iter, square_queries=square_queries),
        npz=str(npz_path.absolute()),
    )
    json_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        npz_path,
        robust=np.asarray(res.robust, bool),
        clean=np.asarray(res.clean, bool),
        queries=np.asarray(res.queries, np.int64),
        x_adv=np.asarray(res.x_adv, np.float32),
        ids=np.asarray(ids, np.int64),
        y=np.asarray(y, np.int32),
        members=np.asarray(list(res.names), dtype=str),
    )
    json_path.write_text(json.dumps(record, indent=1))


class AutoAttackRun(NamedTuple):
    """A written AutoAttack run (:func:`load_autoattack`).

    Attributes:
      report: the JSON report (a dict).
      robust, clean: ``[N, M]`` bool per image and member.
      queries: ``[N, M]`` int64.
      x_adv: ``[N, M, *S]`` float32 (the clean image where member ``m`` was not broken).
      ids: ``[N]`` int64 sample ids; y: ``[N]`` int32 labels; members: the member names.
    """

    report: dict
    robust: np.ndarray
    clean: np.ndarray
    queries: np.ndarray
    x_adv: np.ndarray
    ids: np.ndarray
    y: np.ndarray
    members: tuple[str, ...]

    @property
    def broken(self) -> np.ndarray:
        """``[N, M]`` bool: member ``m`` was correct on image ``n`` and an attack fooled it within eps."""
        return self.clean & ~self.robust


def load_autoattack(path: str | os.PathLike) -> AutoAttackRun:
    """Reads a run :func:`run_autoattack` (or ``sarjax autoattack``) wrote: ``OUT.json`` or ``OUT.npz``.

    Raises:
      FileNotFoundError: the JSON or the npz is missing (naming it).
      ValueError: the npz lacks an array or its shapes disagree with the report's members.
    """
    p = Path(path)
    json_path, npz_path = (p.with_suffix(".json"), p) if p.suffix == ".npz" else (p, p.with_suffix(".npz"))
    for f in (json_path, npz_path):
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no such file (an AutoAttack run writes OUT.json and OUT.npz)")
    report = json.loads(json_path.read_text())
    with np.load(npz_path, allow_pickle=False) as z:
        want = ("robust", "clean", "queries", "x_adv", "ids", "y", "members")
        missing = [k for k in want if k not in z.files]
        if missing:
            raise ValueError(f"{npz_path}: missing arrays {missing} (expected {list(want)})")
        a = {k: z[k] for k in want}
    members = tuple(str(s) for s in a["members"])
    n, m = a["robust"].shape if a["robust"].ndim == 2 else (-1, -1)
    if members != tuple(report.get("members", ())) or m != len(members) or a["x_adv"].shape[:2] != (n, m):
        raise ValueError(
            f"{npz_path}: arrays robust {list(a['robust'].shape)}, x_adv {list(a['x_adv'].shape)} and members "
            f"{list(members)} do not match the report's members {report.get('members')}"
        )
    return AutoAttackRun(report, a["robust"], a["clean"], a["queries"], a["x_adv"], a["ids"], a["y"], members)


__all__ = ["AutoAttackRun", "load_autoattack", "output_paths", "run_autoattack"]
