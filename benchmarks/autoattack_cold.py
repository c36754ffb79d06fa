"""Cold AutoAttack: sarjax against the reference implementation, each in a fresh process (issue 43, item 2).

Usage (the quiet-machine measurement; several tens of minutes on 2 cores)::

    PYTHONPATH=. python benchmarks/autoattack_cold.py --samples 100 500 --repeats 2 \\
        --out benchmarks/results/autoattack_cold.json

    PYTHONPATH=. python benchmarks/autoattack_cold.py --samples 20 --repeats 1   # a short check

What a user's first AutoAttack costs. One MNIST-size ReLU network (the model options of
``benchmarks/autoattack_vs_torch.py``: by default ``zoo.cnn((8, 16), dense=64)`` trained here,
PGD-AT linf ``--train-eps`` unless ``--standard``; or ``--zoo DIR --defense NAME``, ``--pool DIR``)
is written once to a work folder, as sarjax params and as its torch twin (the same weights,
``train_throughput.torch_module``; the logits are checked to agree), with the first ``N`` of a fixed
random subset of the embedded MNIST test split. Then, for each ``N`` of ``--samples``, for
``--repeats`` rounds, the two sides run ALTERNATED (sarjax, reference at each ``--threads``
count, sarjax, ...), every run a NEW Python process:

* sarjax: ``sarjax.attacks.autoattack.autoattack`` (``autoattack_config("linf", eps)``: the
  standard version with AutoAttack's defaults; ``AutoAttackSettings(log=False)``, its sanity
  checks on as by default) with JAX's persistent compilation cache on in a fresh, empty folder
  (what the ``sarjax`` commands do on a machine's first run);
* the reference: AutoAttack's own code (pip ``pyautoattack``: ``AutoAttack(model, norm="Linf",
  eps=eps, version="standard", seed=seed).run_standard_evaluation(x, y)``, batch size 250 as
  sarjax's) on the torch twin at ``torch.set_num_threads(T)``; no JAX in that process.

Both processes get ``OMP_WAIT_POLICY=PASSIVE`` (unless set in the environment;
benchmarks/train_throughput.py says why) and no ``JAX_COMPILATION_CACHE_DIR`` /
``SARJAX_NO_COMPILE_CACHE``. Per run the JSON records the wall seconds of the attack call in the
fresh process (``attack_seconds``: sarjax's includes every compilation), the whole process's
wall seconds (``process_seconds``: interpreter, imports, loading, the attack), the robust flags
and robust accuracy; for sarjax also its compilations (``compile``: programs, seconds, cache
writes; ``per_function``: programs per jitted function). Per ``N``: the medians, the reference's
faster thread count, the ratios reference / sarjax of the attack wall and of the process wall
(above 1: sarjax is faster), and the two sides' agreement image by image. The JSON carries the
provenance (``benchmarks/_timing.provenance``); an existing ``--out`` is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/train_throughput.py

HERE = Path(__file__).resolve().parent
MARK = "AUTOATTACK_COLD_RESULT "  # the child's one result line on stdout: MARK + JSON
SIDES = ("sarjax", "reference")
CHILD_KEYS = ("side", "samples", "attack_seconds", "robust", "robust_accuracy")
BATCH = 250  # both sides' rows per batch (AutoAttack's run_standard_evaluation default)


# -- what the parent reads back ------------------------------------------------------------------


def parse_child(stdout: str, *, side: str, samples: int) -> dict[str, Any]:
    """The result a child printed: the one line ``MARK + JSON`` of ``stdout``.

    Args:
      stdout: the child's whole standard output.
      side: the side it ran (``"sarjax"`` or ``"reference"``).
      samples: the images it attacked.

    Returns:
      The decoded dict (keys ``CHILD_KEYS`` and more).

    Raises:
      ValueError: no result line, more than one, bad JSON, a missing key, another side or image
        count than asked, robust flags not ``samples`` bools, or a robust accuracy that does not
        match them.
    """
    lines = [ln[len(MARK) :] for ln in stdout.splitlines() if ln.startswith(MARK)]
    if len(lines) != 1:
        raise ValueError(f"expected one {MARK.strip()} line in the child's output, got {len(lines)}")
    try:
        out = json.loads(lines[0])
    except json.JSONDecodeError as e:
        raise ValueError(f"the child's result line is not JSON: {e}") from None
    if not isinstance(out, dict):
        raise ValueError(f"the child's result must be a JSON object, got {type(out).__name__}")
    missing = [k for k in CHILD_KEYS if k not in out]
    if missing:
        raise ValueError(f"the child's result lacks {missing}")
    if out["side"] != side or out["samples"] != samples:
        raise ValueError(
            f"asked for side {side!r} on {samples} images, the child ran {out['side']!r} on {out['samples']}"
        )
    robust = out["robust"]
    if not (isinstance(robust, list) and len(robust) == samples and all(isinstance(v, bool) for v in robust)):
        raise ValueError(f"robust must be a list of {samples} bools, got {str(robust)[:80]}")
    acc = sum(robust) / samples
    if abs(float(out["robust_accuracy"]) - acc) > 1e-9:
        raise ValueError(f"robust_accuracy {out['robust_accuracy']} does not match the flags ({acc})")
    if not (isinstance(out["attack_seconds"], (int, float)) and out["attack_seconds"] > 0):
        raise ValueError(f"attack_seconds must be a number > 0, got {out['attack_seconds']!r}")
    return out


def summarize(runs: list[dict[str, Any]], samples: int, threads: list[int]) -> dict[str, Any]:
    """Medians, ratios and agreement for one image count.

    Args:
      runs: the runs of that count, each ``{"side", "threads" (reference only),
        "attack_seconds", "process_seconds", "robust"}``.
      samples: the image count.
      threads: the reference's thread counts.

    Returns:
      ``{"samples", "median_attack_seconds", "median_process_seconds"}`` (per contender:
      ``"sarjax"``, ``"reference_<T>t"``), ``"baseline"`` (the reference's contender with the
      smaller median attack wall), ``"ratio_attack"`` and ``"ratio_process"`` (baseline / sarjax:
      above 1, sarjax is faster), ``"robust_accuracy"`` per side, ``"agreement"`` (the share of
      images both sides call alike), ``"robust_only_sarjax"`` / ``"robust_only_reference"``
      (indices) and ``"deterministic"`` (every run of a side gave the same flags).

    Raises:
      ValueError: a contender without runs, or flags of another length.
    """
    names = ["sarjax", *[f"reference_{t}t" for t in threads]]

    def name_of(r):
        return "sarjax" if r["side"] == "sarjax" else f"reference_{r['threads']}t"

    by: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    for r in runs:
        if name_of(r) not in by:
            raise ValueError(f"a run of an unknown contender {name_of(r)!r} (expected {names})")
        if len(r["robust"]) != samples:
            raise ValueError(f"{name_of(r)}: {len(r['robust'])} robust flags, expected {samples}")
        by[name_of(r)].append(r)
    empty = [k for k, v in by.items() if not v]
    if empty:
        raise ValueError(f"no runs of {empty}")
    med_a = {k: statistics.median(r["attack_seconds"] for r in v) for k, v in by.items()}
    med_p = {k: statistics.median(r["process_seconds"] for r in v) for k, v in by.items()}
    baseline = min(names[1:], key=lambda k: med_a[k])
    flags = {k: [tuple(r["robust"]) for r in v] for k, v in by.items()}
    s = list(flags["sarjax"][0])
    ref = list(flags[baseline][0])
    ref_all = [f for k in names[1:] for f in flags[k]]
    return {
        "samples": samples,
        "median_attack_seconds": med_a,
        "median_process_seconds": med_p,
        "baseline": baseline,
        "ratio_attack": med_a[baseline] / med_a["sarjax"],
        "ratio_process": med_p[baseline] / med_p["sarjax"],
        "robust_accuracy": {"sarjax": sum(s) / samples, "reference": sum(ref) / samples},
        "agreement": sum(a == b for a, b in zip(s, ref)) / samples,
        "robust_only_sarjax": [i for i, (a, b) in enumerate(zip(s, ref)) if a and not b],
        "robust_only_reference": [i for i, (a, b) in enumerate(zip(s, ref)) if b and not a],
        "deterministic": {
            "sarjax": len(set(flags["sarjax"])) == 1,
            "reference": len(set(ref_all)) == 1,
        },
    }


def check_out(path: Path) -> None:
    """Refuse to overwrite: a run never replaces a result it did not produce (house rule).

    Raises:
      FileExistsError: ``path`` exists.
    """
    if path.exists():
        raise FileExistsError(f"{path} exists: remove it first (a run never overwrites a result it did not produce)")


# -- the children ----------------------------------------------------------------------------------


def _child_sarjax(work: Path, samples: int, eps: float, seed: int, cache: Path) -> dict[str, Any]:
    import numpy as np

    from sarjax.runtime.compile_stats import by_name, count_compiles, start_compile_stats

    start_compile_stats()  # count from the first program on
    from sarjax.runtime.compile_cache import enable_compile_cache

    enable_compile_cache(cache)  # fresh and empty: the parent made sure
    import jax

    from sarjax.attacks.autoattack import AutoAttackSettings, autoattack, autoattack_config
    from sarjax.models.zoo import Arch

    arch = Arch.from_spec(json.loads((work / "arch.json").read_text()))
    flat = np.load(work / "params.npz")
    params: dict[str, dict[str, Any]] = {}
    for k in flat.files:
        layer, leaf = k.split("/")
        params.setdefault(layer, {})[leaf] = flat[k]
    img = np.load(work / "images.npz")
    x, y = img["x"][:samples], img["y"][:samples]
    cfg = autoattack_config("linf", eps)  # the standard version, AutoAttack's defaults
    with count_compiles() as c:
        t0 = time.perf_counter()
        res = autoattack(
            arch.apply, params, x, y, attack=cfg, key=jax.random.PRNGKey(seed),
            settings=AutoAttackSettings(log=False, batch_size=min(samples, BATCH)),
        )  # fmt: skip
        secs = time.perf_counter() - t0
    robust = [bool(v) for v in np.asarray(res.robust)[:, 0]]
    return {
        "attack_seconds": secs,
        "robust": robust,
        "robust_accuracy": sum(robust) / samples,
        "clean_accuracy": float(res.clean_accuracy[0]),
        "compile": c.stats.to_json(),
        "per_function": by_name(c.programs()),
        "stages": [
            {"name": s.name, "seconds": s.seconds, "robust_accuracy": float(s.robust_accuracy[0])} for s in res.log
        ],
        "warnings": list(res.warnings),
        "jax": jax.__version__,
    }


def _child_reference(work: Path, samples: int, eps: float, seed: int, threads: int) -> dict[str, Any]:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    import pyautoattack
    from pyautoattack import AutoAttack

    tm = torch.load(work / "twin.pt", weights_only=False).eval()
    img = np.load(work / "images.npz")
    xt = torch.from_numpy(img["x"][:samples].transpose(0, 3, 1, 2).copy())
    yt = torch.from_numpy(img["y"][:samples].astype(np.int64))
    aa = AutoAttack(tm, norm="Linf", eps=eps, version="standard", seed=seed, device="cpu")
    t0 = time.perf_counter()
    x_adv, _ = aa.run_standard_evaluation(xt, yt, batch_size=BATCH)
    secs = time.perf_counter() - t0
    with torch.no_grad():
        robust = [bool(v) for v in (tm(x_adv).argmax(1) == yt).numpy()]
        clean = float((tm(xt).argmax(1) == yt).float().mean())
    return {
        "attack_seconds": secs,
        "robust": robust,
        "robust_accuracy": sum(robust) / samples,
        "clean_accuracy": clean,
        "max_linf": float((x_adv - xt).abs().amax().item()),
        "torch": torch.__version__,
        "pyautoattack": pyautoattack.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def _child(a) -> None:
    work = Path(a.work)
    if a.child == "sarjax":
        out = _child_sarjax(work, a.child_samples, a.eps, a.seed, Path(a.child_cache))
    else:
        out = _child_reference(work, a.child_samples, a.eps, a.seed, a.child_threads)
    out.update(side=a.child, samples=a.child_samples)
    print(MARK + json.dumps(out), flush=True)


# -- the parent ------------------------------------------------------------------------------------


def _prepare(a, work: Path) -> dict[str, Any]:
    """Writes the network (``arch.json``, ``params.npz``, ``twin.pt``) and the images
    (``images.npz``: the first ``max(samples)`` of the fixed subset) to ``work``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    from autoattack_vs_torch import _model
    from train_throughput import load_jax_params, torch_module

    from sarjax.data.mnist import load_mnist

    data = load_mnist()
    arch, params, what = _model(a, data)
    if a.conv_impl and arch.family == "cnn":
        from sarjax.models.zoo import Arch

        arch = Arch.from_spec({**arch.spec(), "conv_impl": a.conv_impl})
    n = max(a.samples)
    sel = np.sort(np.random.default_rng(0).permutation(len(data.x_test))[:n])  # autoattack_vs_torch's images
    x = np.asarray(data.x_test[sel], np.float32)
    y = np.asarray(data.y_test[sel], np.int32)
    (work / "arch.json").write_text(json.dumps(arch.spec()))
    np.savez(work / "params.npz", **{f"{k}/{leaf}": np.asarray(v) for k, d in params.items() for leaf, v in d.items()})
    np.savez(work / "images.npz", x=x, y=y)
    tm = torch_module(arch).eval()
    load_jax_params(arch, params, tm)
    torch.save(tm, work / "twin.pt")
    with torch.no_grad():
        zt = tm(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    zj = np.asarray(jax.jit(arch.apply)(params, jnp.asarray(x)))
    twin = float(np.max(np.abs(zt - zj)))
    if twin > 1e-3 * (1 + np.abs(zj).max()):
        raise SystemExit(f"the torch twin disagrees with the JAX model (max |logit diff| {twin:.2e})")
    clean = float(np.mean(np.argmax(zj, 1) == y))
    print(f"model: {what} ({arch.name}, conv_impl {arch.conv_impl}); twin max |logit diff| {twin:.1e}; "
          f"clean accuracy {100 * clean:.1f}% on {n} images", flush=True)  # fmt: skip
    return {"model": what, "arch": arch.spec(), "torch_twin_max_abs_diff": twin, "clean_accuracy": clean}


def _run_child(a, work: Path, side: str, samples: int, threads: int | None, tag: str) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--work", str(work)]
    argv += ["--child-samples", str(samples), "--eps", str(a.eps), "--seed", str(a.seed)]
    cache = work / f"cache-{tag}"
    if side == "sarjax":
        if cache.exists():
            raise ValueError(f"{cache} exists: a cold run needs an empty compile cache")
        argv += ["--child-cache", str(cache)]
    else:
        argv += ["--child-threads", str(threads)]
    env = {**os.environ}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for k in ("JAX_COMPILATION_CACHE_DIR", "SARJAX_NO_COMPILE_CACHE"):
        env.pop(k, None)
    load = list(os.getloadavg())
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=str(HERE.parent))
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    out = parse_child(r.stdout, side=side, samples=samples)
    out.update(threads=threads, process_seconds=wall, load_before=load, load_after=list(os.getloadavg()))
    if side == "sarjax":
        files = [p for p in cache.rglob("*") if p.is_file()]
        out["cache_entries"], out["cache_bytes"] = len(files), sum(p.stat().st_size for p in files)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, nargs="+", default=[100, 500], help="image counts (each a separate run)")
    ap.add_argument("--repeats", type=int, default=2, help="alternated rounds per image count")
    ap.add_argument("--eps", type=float, default=0.1, help="linf radius of both AutoAttacks")
    ap.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="the reference's torch thread counts (the faster is quoted)",
    )
    ap.add_argument("--zoo", default=None, help="a defense zoo directory (sarjax train-defenses)")
    ap.add_argument("--defense", default="pgd-at-linf-0.3", help="the zoo defense to attack (with --zoo)")
    ap.add_argument("--pool", default=None, help="a saved pool: attack its first member (a CNN or MLP)")
    ap.add_argument("--standard", action="store_true", help="train the CNN with standard training (default: PGD-AT)")
    ap.add_argument("--train-eps", type=float, default=0.1, help="PGD-AT's linf radius")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--conv-impl", default=None, help="the CNN's conv_impl (default: the model's own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sides", nargs="+", choices=SIDES, default=list(SIDES), help="run only these sides (a check; no ratio)"
    )
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder; an existing file is refused)")
    ap.add_argument("--child", choices=SIDES, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-samples", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-cache", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a)
        return {}
    if any(n < 1 for n in a.samples) or a.repeats < 1 or any(t < 1 for t in a.threads):
        raise SystemExit(f"--samples, --repeats and --threads must be >= 1, got {a.samples}, {a.repeats}, {a.threads}")
    a.pgd_at = not a.standard  # autoattack_vs_torch._model's switch
    sys.path.insert(0, str(HERE))
    from _timing import provenance, results_path

    path = results_path("autoattack_cold.json", a.out, quick=max(a.samples) < 100)
    check_out(path)
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="sarjax-autoattack-cold-") as tmp:
        work = Path(tmp)
        model = _prepare(a, work)
        for n in a.samples:
            these = []
            for r in range(a.repeats):
                order = [("sarjax", None)] * ("sarjax" in a.sides)
                order += [("reference", t) for t in a.threads] * ("reference" in a.sides)
                for side, t in order:
                    tag = f"{n}-{r}-{side}" + (f"-{t}t" if t else "")
                    run = _run_child(a, work, side, n, t, tag)
                    these.append(run)
                    extra = (
                        f", {run['compile']['programs']} programs compiled in {run['compile']['seconds']:.1f} s"
                        if side == "sarjax"
                        else f" at {t} thread(s)"
                    )
                    print(
                        f"N={n} round {r} {side}: attack {run['attack_seconds']:.1f} s, process "
                        f"{run['process_seconds']:.1f} s{extra}, robust {100 * run['robust_accuracy']:.1f}%, "
                        f"load {run['load_before'][0]:.1f}",
                        flush=True,
                    )
            runs.extend({**x, "samples": n} for x in these)
            if len(a.sides) < len(SIDES):
                continue
            row = summarize(these, n, a.threads)
            rows.append(row)
            print(
                f"N={n}: cold ratio reference ({row['baseline']}) / sarjax: attack {row['ratio_attack']:.2f}x, "
                f"process {row['ratio_process']:.2f}x; robust accuracy sarjax "
                f"{100 * row['robust_accuracy']['sarjax']:.1f}% reference {100 * row['robust_accuracy']['reference']:.1f}%, "
                f"agreement {100 * row['agreement']:.1f}% of images",
                flush=True,
            )
    out = {
        "benchmark": "autoattack_cold",
        **model,
        "eps": a.eps,
        "norm": "linf",
        "version": "standard",
        "settings": {k: v for k, v in vars(a).items() if not k.startswith("child") and k != "work"},
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "rows": rows,
        "runs": runs,
        "provenance": provenance(),  # command, commit, machine, date, load
    }
    check_out(path)  # again: nothing may have appeared there meanwhile
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
