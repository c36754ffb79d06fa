"""AutoAttack on a pool in memory: run it, write the JSON report and the per-image npz, read them back.

:func:`run_autoattack` is what ``sarjax autoattack`` runs once it has loaded a pool and images
(a saved pool, ``--model PKG.MODULE:FUNCTION``, MNIST or ``--images FILE.npz``): it checks the
images against the pool, runs :func:`sarjax.attacks.autoattack.autoattack_pool`, and, given
``out``, writes

* ``OUT.json``: the report (settings, clean and robust accuracy per member, the per-stage log,
  query totals, the sanity checks' warnings, the attack's seconds and its XLA compilations
  (``"compile"``: :meth:`sarjax.runtime.compile_stats.CompileStats.to_json`, process 0's), the
  run's metadata);
* ``OUT.npz`` beside it (same stem, ``np.savez_compressed``): per image and member ``robust
  [N, M]`` and ``clean [N, M]`` (bool), ``queries [N, M]`` (int64), the adversarial points
  ``x_adv [N, M, *S]`` (float32; the clean image where the member was not broken), ``ids [N]``
  (each image's sample id, which seeds its random streams), ``y [N]`` and ``members [M]``.

:func:`load_autoattack` reads both back. Across processes (``AutoAttackSettings(distribute=True)`` on JAX's
distributed runtime) every process runs its share of each attack run's chunks, the chunks'
results are gathered after every run (:func:`sarjax.attacks.autoattack.autoattack`), and
process 0 writes the outputs: bit-identical to one process (docs/autoattack.md).

Resume (``checkpoint_dir``, ``sarjax autoattack --checkpoint DIR``): the cascade's state is saved
after every completed attack run (``DIR/call_<j>.npz``, one per AutoAttack call; per process in
``DIR/process_<i>_of_<n>`` when distributed) with ``DIR/fingerprint.json``
(:mod:`sarjax.runtime.fingerprint`); a rerun with the same settings skips the completed runs
(bit-identical result), one with other settings is refused naming them, ``overwrite`` discards.

Outputs are never replaced by another run's: the report records the run's settings
(``"fingerprint"``: pool content hash, images and ids, norm, eps, version, stages, budgets, batch
size, seed, sarjax version; with ``meta``, the report's own fields), and before any attack work a
run into an existing ``OUT.json`` / ``OUT.npz`` is refused (:func:`check_outputs`, one line naming
the settings that differ) unless its settings are the same (an identical rerun, a resumed run) or
``overwrite`` is given (``sarjax autoattack --overwrite``).
"""

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from sarjax.attacks import autoattack as aa  # the module: autoattack_pool is looked up at call time (tests replace it)
from sarjax.attacks.autoattack import AutoAttackConfig, AutoAttackResult, AutoAttackSettings
from sarjax.data.images import check_ids, check_images
from sarjax.runtime import fingerprint as fingerprints
from sarjax.runtime.compile_stats import CompileStats, count_compiles
from sarjax.runtime.distributed import all_ok, is_main, process_checkpoint_dir, process_count
from sarjax.runtime.provenance import provenance

CHECKPOINT_HINT = "pass --overwrite (overwrite=True) to discard it, or choose another --checkpoint directory"
OUTPUT_HINT = "pass --overwrite (overwrite=True) to replace them, or choose another --out"

# the report's fields: AutoAttackResult.to_json's and the run's (meta may not replace them)
_OWN_FIELDS = frozenset(
    ("version", "norm", "eps", "members", "clean_accuracy", "robust_accuracy", "queries_total")
    + ("queries_per_sample_mean", "stages", "warnings", "samples", "seed", "seconds", "budget", "npz")
    + ("fingerprint", "compile", "provenance")
)

# the fingerprint's fields (run_autoattack's settings; the report's "fingerprint")
_FINGERPRINT_FIELDS = frozenset(
    ("pool", "conv_impl", "images", "ids", "norm", "eps", "version", "stages", "n_iter", "fab_iter")
    + ("square_queries", "batch_size", "seed", "per_member", "checks", "wrap", "stochastic", "sarjax")
    + ("randomized",)
)
# the meta fields that describe ``wrap`` / ``stochastic`` (callables, which cannot be fingerprinted):
# the CLI's noise sigma and each randomized member's description enter the checkpoint fingerprint
RANDOMIZED_META = ("noise_sigma", "randomized_members")


def output_paths(out: str | os.PathLike) -> tuple[Path, Path]:
    """``(OUT.json, OUT.npz)`` for ``out`` (the JSON path; the npz has the same stem).

    Raises:
        ValueError: ``out`` ends in ``.npz`` (the report and the arrays would share a name).
    """
    path = Path(out)
    if path.suffix == ".npz":
        raise ValueError(f"out must be the JSON report's path (the arrays go to OUT.npz beside it), got {str(path)!r}")
    return path, path.with_suffix(".npz")


def check_outputs(
    out: str | os.PathLike,
    settings: dict[str, Any],
    meta: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    distribute: bool = False,
    partial: bool = False,
) -> None:
    """Refuse to replace an ``OUT.json`` / ``OUT.npz`` that a run with other settings wrote.

    Nothing exists yet, or the report's recorded settings equal this run's: the run may write
    (an identical rerun, a resumed one writes the same result). Otherwise it raises, unless
    ``overwrite``. :func:`run_autoattack` calls it before any attack work; ``sarjax autoattack``
    also calls it with ``partial=True`` before it loads the data and the pool.

    Args:
      out: the JSON report's path (``OUT.npz`` beside it).
      settings: this run's fingerprint, the fields the report stores under ``"fingerprint"``
        (pool content hash, images, norm, eps, ...).
      meta: this run's own report fields (``run_autoattack(meta=)``: the pool's path, the data's
        source, ...), compared with the report's top-level fields.
      overwrite: replace whatever is there (no check).
      distribute: a run on JAX's distributed runtime: process 0 (the one that writes) checks, and
        every process raises when it refuses (:func:`sarjax.runtime.distributed.all_ok`).
      partial: compare only the fields given (a check before everything is known).

    Raises:
      ValueError: the files exist and were written with other settings (naming each one that
        differs, the stored and this run's value), hold no recorded settings (an older sarjax,
        another program) or are not a report; the message says ``--overwrite`` or another ``--out``.
    """
    json_path, npz_path = output_paths(out)
    err = None
    if not overwrite and (not distribute or is_main()):
        err = _outputs_refusal(json_path, npz_path, _combined(settings, meta or {}), partial)
    if distribute and process_count() > 1 and not all_ok(err is None):  # every process stops together
        raise ValueError(err or f"process 0 refused to replace {json_path} (see its log); {OUTPUT_HINT}")
    if err is not None:
        raise ValueError(err)


def _combined(fingerprint: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """One dict of a run's fingerprint and its report fields; a report field named like a
    fingerprint field (``pool``: the path beside the pool's content hash) keeps both, renamed."""
    taken = set(fingerprint) | _FINGERPRINT_FIELDS
    return {**fingerprint, **{(f"{k} (report)" if k in taken else k): v for k, v in meta.items()}}


def _outputs_refusal(json_path: Path, npz_path: Path, want: dict[str, Any], partial: bool) -> str | None:
    """The one-line reason to refuse writing ``json_path`` / ``npz_path``, or None."""
    if not json_path.exists() and not npz_path.exists():
        return None
    for f in (json_path, npz_path):
        if f.exists() and not f.is_file():
            return f"{f} exists and is not a file: choose another --out"
    them = f"refusing to replace {json_path.name} and {npz_path.name}; {OUTPUT_HINT}"
    if not json_path.is_file():
        return (
            f"{npz_path} holds another run's arrays without their report {json_path.name}, so its settings "
            f"cannot be checked: {them}"
        )
    try:
        report = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        report = None
    if not isinstance(report, dict):
        return f"{json_path} exists and is not an AutoAttack report (not a JSON object): {them}"
    meta = {k: v for k, v in report.items() if k not in _OWN_FIELDS}
    stored = report.get("fingerprint")
    if isinstance(stored, dict):
        stored = _combined(stored, meta)
        if partial:
            stored = {k: stored[k] for k in want if k in stored}
        diff = fingerprints.differing_fields(stored, want)
        if not diff:
            return None
        return f"{fingerprints.mismatch_reason(json_path, stored, want, diff)}: {them}"
    # a report without a fingerprint (an older sarjax): name what its recorded fields tell apart
    budget = report.get("budget")
    budget = budget if isinstance(budget, dict) else {}
    known = {k: report[k] for k in ("norm", "eps", "version", "seed") if k in report}
    known.update({k: budget[k] for k in ("n_iter", "fab_iter", "square_queries") if k in budget})
    known = _combined(known, meta)
    known = {k: v for k, v in known.items() if k in want}
    diff = fingerprints.differing_fields(known, {k: want[k] for k in known})
    if diff:
        reason = fingerprints.mismatch_reason(json_path, known, want, diff)
        return f"{reason} (its other settings are not recorded): {them}"
    return f"{json_path} holds a report without recorded settings (an older sarjax), so it cannot be checked: {them}"


def run_autoattack(
    pool,
    x,
    y,
    *,
    attack: AutoAttackConfig,
    seed: int = 0,
    ids=None,
    wrap: Callable | None = None,
    stochastic: dict[str, Callable] | None = None,
    meta: dict[str, Any] | None = None,
    settings: AutoAttackSettings | None = None,
) -> AutoAttackResult:
    """AutoAttack on every member of ``pool`` for the images ``x, y``; writes ``settings.out`` when given.

    Args:
      pool: a :class:`sarjax.models.pool.Pool`.
      x: ``[N, *pool.input_shape]`` images in [0, 1]; y: ``[N]`` labels in ``[0, pool.num_classes)``
        (checked by :func:`sarjax.data.images.check_images`).
      attack: the threat model, AutoAttack's version and budgets, an
        :class:`~sarjax.attacks.autoattack.AutoAttackConfig`
        (:func:`~sarjax.attacks.autoattack.autoattack_config`; its ``box`` must be ``(0, 1)`` and
        ``square_rescale_schedule`` AutoAttack's False: the fingerprint does not record them).
      seed: the attack's key is ``jax.random.PRNGKey(seed)``.
      ids: ``[N]`` distinct non-negative sample ids (each image's random streams; default
        ``0 .. N-1``), recorded in the npz.
      wrap, stochastic: the randomized models of ``version="rand"`` (as ``autoattack_pool``).
        Callables cannot be fingerprinted: describe them in ``meta`` (``noise_sigma``,
        ``randomized_members``, as ``sarjax autoattack`` does), and those fields enter the
        checkpoint's fingerprint, so a resume with another noise sigma is refused.
      meta: more fields for the JSON report (e.g. the pool's path, the data's source); they may
        not replace the result's own fields.
      settings: how it runs, an :class:`~sarjax.attacks.autoattack.AutoAttackSettings` (default
        ``AutoAttackSettings()``):

        * ``out``: the JSON report's path (``OUT.npz`` is written beside it), or None to write
          nothing. Existing files are replaced only by a run with the same settings (the report
          records them under ``"fingerprint"``, and ``meta``): :func:`check_outputs`, before any
          attack work.
        * ``batch_size``, ``per_member``, ``checks``: as
          :func:`sarjax.attacks.autoattack.autoattack_pool` / :func:`~sarjax.attacks.autoattack.autoattack`.
        * ``log``: print AutoAttack's log (on process 0 only when distributed).
        * ``progress``: ``progress(stage, done, total)`` after every chunk of every stage
          (:func:`~sarjax.attacks.autoattack.autoattack`); it only observes.
        * ``distribute``: spread the attack runs' chunks over the processes of JAX's distributed
          runtime (every process calls this with the same arguments; each returns the whole
          result, bit-identical to one process; process 0 writes ``out``).
        * ``checkpoint_dir``: resume: the cascade's state is saved here after every completed
          attack run (per process in ``process_<i>_of_<n>`` when distributed), with a fingerprint
          of the settings (pool content hash, images, ids, norm, eps, version, stages, budgets,
          batch size, seed, processes, sarjax version); a rerun with the same fingerprint skips
          the completed runs and gives the uninterrupted result bit for bit. None: no checkpoint.
          A run that fails before its first state is saved removes the fingerprint it wrote.
        * ``overwrite``: replace ``OUT.json`` / ``OUT.npz`` of other settings, and discard the
          checkpoints ``checkpoint_dir`` holds (any settings) and start over.

    Returns:
      The :class:`~sarjax.attacks.autoattack.AutoAttackResult` (every process, when distributed).

    Raises:
      ValueError: images that fail the checks (naming what is wrong), ``ids`` that are not
        ``N`` distinct non-negative ints, an ``out`` ending in ``.npz``, ``meta`` clashing with
        a result field, an ``attack`` with another box or Square schedule; the attack's own
        errors; an ``out`` or a ``checkpoint_dir`` written with other settings (naming each one
        that differs) unless ``overwrite``.
      TypeError: ``attack`` not an ``AutoAttackConfig``, ``settings`` not an ``AutoAttackSettings``.
    """
    if not isinstance(attack, AutoAttackConfig):
        raise TypeError(
            "run_autoattack: attack must be an AutoAttackConfig (autoattack_config(norm, eps, version, ...)), "
            f"got {type(attack).__name__}"
        )
    if settings is None:
        settings = AutoAttackSettings()
    if not isinstance(settings, AutoAttackSettings):
        raise TypeError(
            f"run_autoattack: settings must be an AutoAttackSettings or None, got {type(settings).__name__}"
        )
    if attack.box != (0.0, 1.0) or attack.square_rescale_schedule:
        raise ValueError(
            "run_autoattack attacks images in [0, 1] with AutoAttack's Square schedule (its fingerprint records "
            f"neither): attack.box must be (0.0, 1.0) and square_rescale_schedule False, got box={attack.box}, "
            f"square_rescale_schedule={attack.square_rescale_schedule}"
        )
    out, overwrite, distribute = settings.out, settings.overwrite, settings.distribute
    xf, yi = check_images(x, y, input_shape=tuple(pool.input_shape), num_classes=int(pool.num_classes))
    sample_ids = np.arange(len(xf), dtype=np.int64) if ids is None else check_ids(ids, len(xf))
    paths = output_paths(out) if out is not None else None
    clash = sorted(set(meta or {}) & _OWN_FIELDS)
    if clash:
        raise ValueError(f"meta may not replace the report's own fields, got {clash}")
    fingerprint = {
        **fingerprints.pool_fingerprint(pool),
        "images": fingerprints.array_digest(xf, yi),
        "ids": fingerprints.array_digest(sample_ids),
        "norm": attack.norm,
        "eps": float(attack.eps),
        "version": attack.version,
        "stages": list(attack.stages),
        "n_iter": attack.n_iter,
        "fab_iter": attack.fab_iter,
        "square_queries": attack.square_queries,
        "batch_size": settings.batch_size,
        "seed": seed,
        "per_member": settings.per_member,
        "checks": settings.checks,
        "wrap": wrap is not None,
        "stochastic": None if stochastic is None else sorted(stochastic),
        "sarjax": fingerprints.sarjax_version(),
        "randomized": {k: (meta or {})[k] for k in RANDOMIZED_META if k in (meta or {})},
    }
    multi = distribute and process_count() > 1
    if paths is not None:  # before any attack work: another run's outputs are refused now
        check_outputs(paths[0], fingerprint, meta, overwrite=overwrite, distribute=multi)
    ck, wrote = None, False
    if settings.checkpoint_dir is not None:
        ck, wrote = _open_checkpoint(
            Path(settings.checkpoint_dir),
            {**fingerprint, "processes": process_count() if distribute else 1},
            overwrite,
            multi,
        )
    t0 = time.perf_counter()
    compiles = count_compiles()
    try:
        res = aa.autoattack_pool(
            pool,
            xf,
            yi,
            attack=attack,
            key=jax.random.PRNGKey(seed),
            settings=dataclasses.replace(settings, out=None, checkpoint_dir=ck, overwrite=False),
            sample_ids=None if ids is None else sample_ids,
            wrap=wrap,
            stochastic=stochastic,
        )
    except BaseException:
        if wrote and ck is not None:  # refused or stopped before its first state: the folder holds no run
            _drop_unused_fingerprint(ck)
        raise
    seconds = time.perf_counter() - t0
    if paths is not None and is_main():
        budget = (attack.n_iter, attack.fab_iter, attack.square_queries)
        _write(paths, res, yi, sample_ids, seconds, compiles.stop(), seed, budget, meta or {}, fingerprint)
    return res


def _open_checkpoint(directory: Path, fp: dict[str, Any], overwrite: bool, multi: bool) -> tuple[Path, bool]:
    """This process's checkpoint folder under ``directory``, its fingerprint checked (or written),
    and whether this run wrote the fingerprint (the folder held no run).

    Raises:
      ValueError: the folder holds checkpoints of other settings (naming them) and not ``overwrite``.
    """
    pdir = process_checkpoint_dir(directory) if multi else directory
    has = pdir.is_dir() and any(pdir.glob("call_*.npz*"))
    if overwrite and pdir.is_dir():
        fingerprints.remove_paths(pdir, ["call_*.npz*", fingerprints.FINGERPRINT_FILE])
        has = False
    err, wrote = None, False
    try:
        if fingerprints.check_fingerprint(pdir, fp, hint=CHECKPOINT_HINT, holds_results=has) is None:
            fingerprints.write_fingerprint(pdir, fp)
            wrote = True
    except fingerprints.FingerprintMismatch as e:
        err = ValueError(f"{e.reason}; {CHECKPOINT_HINT}")
    if multi and not all_ok(err is None):  # every process stops when one refuses its folder
        raise err or ValueError(f"another process refused its checkpoint folder (see its log); {CHECKPOINT_HINT}")
    if err is not None:
        raise err
    return pdir, wrote


def _drop_unused_fingerprint(pdir: Path) -> None:
    """Remove the fingerprint this run wrote into ``pdir`` when no state was saved beside it (the
    run was refused, e.g. a bad setting, or stopped before its first attack run completed), so a
    corrected run may use the folder; the folder too when that leaves it empty."""
    if any(pdir.glob("call_*.npz*")):
        return
    (pdir / fingerprints.FINGERPRINT_FILE).unlink(missing_ok=True)
    try:
        pdir.rmdir()  # only when empty
    except OSError:
        pass


def _write(
    paths,
    res: AutoAttackResult,
    y,
    ids,
    seconds: float,
    compiles: CompileStats,
    seed: int,
    budget,
    meta: dict,
    settings,
) -> None:
    json_path, npz_path = paths
    record = res.to_json()
    record.update(meta)
    n_iter, fab_iter, square_queries = budget
    record.update(
        samples=int(len(y)),
        seed=seed,
        seconds=seconds,
        compile=compiles.to_json(),
        provenance=provenance(),  # command, commit, machine, date, load
        budget=dict(n_iter=n_iter, fab_iter=fab_iter, square_queries=square_queries),
        npz=str(npz_path.absolute()),
        fingerprint=settings,
    )
    json_path.parent.mkdir(parents=True, exist_ok=True)
    # written beside, then moved into place: a run stopped while writing leaves the old files whole
    tmp_npz, tmp_json = (f.with_name(f.name + ".tmp") for f in (npz_path, json_path))
    with open(tmp_npz, "wb") as fh:
        np.savez_compressed(
            fh,
            robust=np.asarray(res.robust, bool),
            clean=np.asarray(res.clean, bool),
            queries=np.asarray(res.queries, np.int64),
            x_adv=np.asarray(res.x_adv, np.float32),
            ids=np.asarray(ids, np.int64),
            y=np.asarray(y, np.int32),
            members=np.asarray(list(res.names), dtype=str),
        )
    tmp_json.write_text(json.dumps(record, indent=1))
    os.replace(tmp_npz, npz_path)
    os.replace(tmp_json, json_path)


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


__all__ = ["AutoAttackRun", "check_outputs", "load_autoattack", "output_paths", "run_autoattack"]
