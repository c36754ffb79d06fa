"""SAR and individual ASR along distillation (the SAR paper, Figure 3).

A teacher (the residual CNN) is trained on the MNIST training split and labels a transfer set
(EMNIST-digits when ``--emnist-dir`` is given, else augmented MNIST training images from
``sarjax.data.augment.transfer_set``); the students are the trained high-diversity pool, which is
then trained further on the teacher's hard labels. SAR_0.85 and the mean individual ASR are
measured at checkpoints along the students' training. The paper's claim: SAR falls while
individual ASR barely moves.

    python benchmarks/sar_distillation.py --samples 100 --out benchmarks/results/sar_distillation
    python benchmarks/sar_distillation.py --quick

Writes OUT/sar_distillation.json (with the run's provenance: command, commit, machine, date, load)
and OUT/sar_along_distillation.png; ``--out OUT`` (default: a temporary folder, never
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
from sarjax.data.augment import transfer_set
from sarjax.data.mnist import load_idx_dir, load_mnist
from sarjax.experiments.demo import DemoSettings, get_pool
from sarjax.experiments.sar import PoolSARSettings, evaluate_pool
from sarjax.models import zoo
from sarjax.models.pool import Pool, Stack
from sarjax.models.train import MemberConfig, TrainConfig, TrainMonitor, teacher_targets, train_pool, train_stack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=10, help="epochs of the original high pool")
    ap.add_argument("--teacher-epochs", type=int, default=15)
    ap.add_argument("--transfer", type=int, default=24000, help="transfer-set size (the paper: 240,000 EMNIST)")
    ap.add_argument("--distill-epochs", type=int, default=4)
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--coverage", type=float, default=0.85)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--emnist-dir", default=None, help="EMNIST-digits IDX directory (else augmented MNIST)")
    ap.add_argument("--cache", default="sarjax-demo/pools")
    ap.add_argument("--no-cache", action="store_true", help="train the student pool in memory, write no cache")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="evaluate no new checkpoint after this many seconds (the JSON is rewritten after each)",
    )
    ap.add_argument(
        "--precision",
        default=None,
        choices=["default", "high", "highest"],
        help="jax_default_matmul_precision (on GPUs 'default' may use TF32)",
    )
    ap.add_argument(
        "--out", default=None, help="output folder (default: a temporary folder, never benchmarks/results/)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    a.out = str(results_path("sar_distillation", a.out, quick=a.quick))
    if a.quick:
        a.samples, a.members, a.epochs, a.teacher_epochs, a.transfer, a.distill_epochs, a.steps, a.restarts = (
            12,
            6,
            2,
            2,
            2000,
            2,
            10,
            1,
        )
    if a.precision:
        jax.config.update("jax_default_matmul_precision", a.precision)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data = load_mnist()
    x = data.x_test[: a.samples]
    students, _ = get_pool(
        "high",
        data,
        DemoSettings(members=a.members, epochs=a.epochs, seed=a.seed),
        None if a.no_cache else Path(a.cache),
    )

    teacher_arch = zoo.resnet((16, 32), blocks=2, dense=128)
    teacher, _ = train_pool(
        [(teacher_arch, MemberConfig(seed=10_000 + a.seed, aug_strength=0.5))],
        data.x_train,
        data.y_train,
        config=TrainConfig(epochs=a.teacher_epochs, patience=4),
        names=["teacher"],
    )
    teacher_acc = float(teacher.accuracy(data.x_test, data.y_test)[0])
    print(f"teacher {teacher_arch.name}: test accuracy {teacher_acc:.4f}")
    if a.emnist_dir:
        xt = load_idx_dir(a.emnist_dir, "emnist-digits").x_train[: a.transfer]
        source = f"EMNIST-digits ({len(xt)})"
    else:
        xt = transfer_set(jax.random.key(a.seed + 1), data.x_train, a.transfer, elastic=1.0)
        source = f"augmented MNIST transfer set ({len(xt)})"
    yt = teacher_targets(teacher, xt, soft=False)
    print(f"transfer set: {source}, labelled by the teacher")

    snapshots: dict[int, list] = {}
    for stack in students.stacks:
        cfgs = [MemberConfig(seed=i) for i in range(stack.size)]

        def snap(epoch, params, stack=stack):
            snapshots.setdefault(epoch, []).append(Stack(stack.arch, params, stack.names))

        snapshots.setdefault(0, []).append(stack)
        train_stack(
            stack.arch,
            cfgs,
            xt,
            yt,
            init_params=stack.params,
            names=stack.names,
            monitor=TrainMonitor(label=f"distill {stack.arch.name}", callback=snap),
            config=TrainConfig(epochs=a.distill_epochs, patience=0),
        )
    steps_per_epoch = int(0.9 * len(xt)) // TrainConfig().batch_size
    delta = round(1 - a.coverage, 10)
    print(f"distillation done ({time.time() - t0:.0f}s)", flush=True)
    doc = {
        "settings": vars(a),
        "provenance": provenance(),  # command, commit, machine, date, load (when the attacks start)
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
        "teacher": {"arch": teacher_arch.spec(), "test_accuracy": teacher_acc},
        "transfer_set": source,
        "samples": int(len(x)),
        "rows": [],
        "complete": False,
    }
    rows = doc["rows"]
    attack = make_joint_pgd(
        Pool(snapshots[0]).apply, steps=a.steps, step=JointPGDStep(restarts=a.restarts)
    )  # reused: same archs
    epochs = sorted(snapshots)
    # evaluate the first and last checkpoints first, then fill in between (a budget cut keeps both ends)
    order = [epochs[0], epochs[-1]] + epochs[1:-1] if len(epochs) > 1 else epochs
    for epoch in order:
        if a.budget_s is not None and time.time() - t0 > a.budget_s and len(rows) >= 2:
            print(f"budget of {a.budget_s:.0f}s spent: skipping the remaining checkpoints", flush=True)
            break
        t1 = time.time()
        pool = Pool(snapshots[epoch])
        acc = pool.accuracy(data.x_test, data.y_test)
        agree = (pool.predict(data.x_test) == teacher.predict(data.x_test)[0]).mean()
        res, member_asr = evaluate_pool(
            pool,
            x,
            a.eps,
            [delta],
            key=jax.random.key(a.seed),
            attack=attack,
            settings=PoolSARSettings(steps=a.steps, restarts=a.restarts, progress=False),
        )
        v = res.valid
        row = {
            "epoch": epoch,
            "step": epoch * steps_per_epoch,
            "accuracy": float(acc.mean()),
            "teacher_agreement": float(agree),
            "asr": float(member_asr.mean()),
            "member_asr": member_asr.tolist(),
            "sar": float(res.sar[v, 0].mean()),
            "sar_sem": float(res.sar[v, 0].std(ddof=1) / np.sqrt(v.sum())) if v.sum() > 1 else None,
            "median_sar": float(np.median(res.sar[v, 0])),
            "share_sar_one": float((res.sar[v, 0] >= 1).mean()),
            "per_sample_sar": res.sar[v, 0].tolist(),
            "seconds": time.time() - t1,
        }
        rows.append(row)
        rows.sort(key=lambda r: r["epoch"])
        print(
            f"epoch {epoch} (step {row['step']}): acc {row['accuracy']:.4f} agree {agree:.3f} ASR {row['asr']:.3f} "
            f"SAR_{a.coverage:g} {row['sar']:.3f} (median {row['median_sar']:.3f}, SAR=1 {row['share_sar_one']:.0%})"
            f"  ({time.time() - t0:.0f}s)",
            flush=True,
        )
        doc["seconds"] = time.time() - t0
        (out / "sar_distillation.json").write_text(json.dumps(doc, indent=2))
    doc["complete"] = len(rows) == len(epochs)
    doc["seconds"] = time.time() - t0
    doc["sar_change"] = rows[-1]["sar"] - rows[0]["sar"]
    doc["asr_change"] = rows[-1]["asr"] - rows[0]["asr"]
    (out / "sar_distillation.json").write_text(json.dumps(doc, indent=2))
    plot(doc, a.coverage, out)
    print(
        f"SAR change {doc['sar_change']:+.3f}, ASR change {doc['asr_change']:+.3f}; wrote {out} ({doc['seconds']:.0f}s)"
    )


def plot(doc: dict, coverage: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    steps = [r["step"] for r in rows]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax0.plot(steps, [r["sar"] for r in rows], marker="o", label=f"mean SAR_{coverage:g}")
    ax0.plot(steps, [1 - r["asr"] for r in rows], marker="s", label="1 - mean ASR")
    ax0.plot(steps, [r["accuracy"] for r in rows], ls=":", label="test accuracy")
    ax0.set_xlabel("distillation step")
    ax0.set_ylim(0, 1.05)
    ax0.legend(fontsize=8)
    ax0.grid(alpha=0.3)
    bins = np.linspace(0, 1, 21)
    for r in (rows[0], rows[-1]):
        ax1.hist(r["per_sample_sar"], bins=bins, alpha=0.5, label=f"step {r['step']}")
    ax1.set_xlabel(f"per-sample SAR_{coverage:g}")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(out / "sar_along_distillation.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
