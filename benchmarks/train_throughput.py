"""Pool-training throughput: sarjax's vmapped trainer vs a JAX loop vs a PyTorch loop.

Every contender trains the same M members of one architecture from the same initial
parameters, on the same data (the embedded 4,000-image MNIST train split), with the same
per-member batch order, batch size, number of steps and optimiser (AdamW, lr 2e-3 -- the
``MemberConfig`` default --, weight decay 0, betas (0.9, 0.999), eps 1e-8, i.e. optax's and
torch's shared AdamW defaults) and the same loss (softmax cross-entropy on one-hot targets):

- ``sarjax``:    the compiled epoch function of ``sarjax.models.train`` (``_make_epoch_fn``, the
                 kernel ``train_stack`` runs once per epoch): one ``lax.scan`` over the steps,
                 ``vmap`` over the members. Timed after a warm-up call (compile excluded).
- ``jax-loop``:  a Python loop over members and steps calling ONE jitted single-member step
                 (compiled once, reused by every member): the fair JAX baseline. It computes
                 the same member step as the trainer (same loss, same ``inject_hyperparams``
                 AdamW, same dropout key at rate 0) without the early-stopping mask.
- ``torch-loop``: a Python loop over members and steps with ``torch.nn`` modules built to the
                 same architecture (same layer sizes and activation, SAME padding, 2x2 max-pool),
                 ``torch.optim.AdamW``, ``torch.set_num_threads(--threads)``.
- ``torch-loop-1t`` (unless ``--no-torch-1t`` or ``--threads 1``): the same torch loop on one
                 thread. On a CPU shared with other jobs a 2-thread torch loop can lose to a
                 1-thread one; the ratio against the faster of the two is the fair one.
- ``jax-scan-loop`` (only with ``--with-scan-loop``): a Python loop over members, each running
                 one jitted ``lax.scan`` over all steps -- separates the gain from ``vmap``
                 from the gain from not dispatching every step.

Before timing, the torch modules are loaded with the JAX initial parameters and their logits
are checked against ``Arch.apply`` (the run stops if they disagree); after the warm-up run the
final parameters of every contender are compared and their test accuracy reported, so the
table compares the same work.

``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` here (set it in the environment to override): with
OpenMP's active spin-wait, torch threads that share cores with other processes spin on each
other and the loop runs 10-20x slower.

The contenders run alternately (a, b, c, a, b, c, ...) for ``--repeats`` rounds; the table
shows the median member-samples per second (M * steps * batch / seconds) of each and the
ratios sarjax / jax-loop and sarjax / torch-loop. The CPU may be shared, so absolute numbers
are noisy; the alternation keeps the ratios fair.

    python benchmarks/train_throughput.py                      # M=20, 50 steps, 3 repeats, mlp + cnn
    python benchmarks/train_throughput.py --quick              # M=4, 16 steps, mlp: under a minute
    python benchmarks/train_throughput.py --families mlp,cnn,cnn16x32,cnn-xla --with-scan-loop
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

# OpenMP's default active spin-wait makes a 2-thread torch loop 10-20x slower when the cores are
# shared (measured here: 7 s vs 0.9 s PASSIVE vs 0.4 s one thread, same MLP steps); an explicit
# OMP_WAIT_POLICY in the environment wins. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import provenance, results_path  # benchmarks/ is on sys.path when run as a script

from sarjax.data.mnist import load_mnist
from sarjax.models import zoo
from sarjax.models.presets import BASE_ARCH
from sarjax.models.train import _make_epoch_fn
from sarjax.models.zoo import Arch

#: benchmark families: name -> architecture
FAMILIES: dict[str, Arch] = {
    "mlp": zoo.mlp((256, 128)),
    "cnn": BASE_ARCH,  # zoo.cnn((8, 16), dense=64), the low/medium pools' architecture
    "cnn16x32": zoo.cnn((16, 32), dense=64),
    "cnn-xla": dataclasses.replace(BASE_ARCH, conv_impl="xla"),  # lax.conv instead of im2col
}
LR = 2e-3  # MemberConfig.lr default (sarjax/models/train.py)
BATCH = 32  # TrainConfig.batch_size default


# ---------------------------------------------------------------------------------------------
# PyTorch twin of an Arch
# ---------------------------------------------------------------------------------------------


def _torch_act(name: str):
    import torch.nn as nn

    table = {
        "relu": nn.ReLU,
        "gelu": lambda: nn.GELU(approximate="tanh"),  # jax.nn.gelu defaults to the tanh form
        "tanh": nn.Tanh,
        "elu": nn.ELU,
        "swish": nn.SiLU,
        "leaky_relu": lambda: nn.LeakyReLU(0.01),  # jax.nn.leaky_relu's default slope
    }
    return table[name]()


def torch_module(arch: Arch):
    """A ``torch.nn.Sequential`` with the architecture of ``arch`` (NCHW inputs).

    Args:
      arch: an ``mlp`` or ``cnn`` family Arch (stride-1 SAME convs, 2x2 floor max-pool).

    Returns:
      The module (float32, random init; load JAX params with :func:`load_jax_params`).
    """
    import torch.nn as nn

    h, w, c = arch.input_shape
    layers: list = [] if arch.family == "cnn" else [nn.Flatten()]
    if arch.family == "mlp":
        fan = h * w * c
        for width in arch.widths:
            layers += [nn.Linear(fan, width), _torch_act(arch.act)]
            fan = width
        layers.append(nn.Linear(fan, arch.num_classes))
        return nn.Sequential(*layers)
    if arch.family != "cnn":
        raise ValueError(f"torch twin supports the mlp and cnn families, got {arch.family!r}")
    cin = c
    for ch in arch.widths:
        layers += [nn.Conv2d(cin, ch, arch.kernel, padding="same"), _torch_act(arch.act), nn.MaxPool2d(2)]
        cin, h, w = ch, h // 2, w // 2
    layers += [
        nn.Flatten(),
        nn.Linear(h * w * cin, arch.dense),
        _torch_act(arch.act),
        nn.Linear(arch.dense, arch.num_classes),
    ]
    return nn.Sequential(*layers)


def _layer_names(arch: Arch) -> list[str]:
    if arch.family == "mlp":
        return [f"dense{i}" for i in range(len(arch.widths))] + ["out"]
    return [f"conv{i}" for i in range(len(arch.widths))] + ["dense", "out"]


def _flat_hwc(arch: Arch) -> tuple[int, int, int]:
    h, w, _ = arch.input_shape
    for _ in arch.widths:
        h, w = h // 2, w // 2
    return h, w, arch.widths[-1]


def load_jax_params(arch: Arch, params: dict, module) -> None:
    """Copy ONE member's JAX params into the torch twin (kernels transposed to torch layout)."""
    import torch

    weighted = [m for m in module if hasattr(m, "weight")]
    for name, m in zip(_layer_names(arch), weighted, strict=True):
        wj = np.asarray(params[name]["w"])
        if wj.ndim == 4:  # [k, k, cin, cout] -> [cout, cin, k, k]
            wt = wj.transpose(3, 2, 0, 1)
        elif name == "dense" and arch.family == "cnn":  # rows (h, w, c) in JAX, columns (c, h, w) in torch
            h, w, c = _flat_hwc(arch)
            wt = wj.reshape(h, w, c, -1).transpose(3, 2, 0, 1).reshape(wj.shape[1], -1)
        else:  # [in, out] -> [out, in]
            wt = wj.T
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(np.ascontiguousarray(wt)))
            m.bias.copy_(torch.from_numpy(np.array(params[name]["b"])))


def jax_params_of(arch: Arch, module) -> dict:
    """The inverse of :func:`load_jax_params`: ONE member's params in sarjax layout (numpy)."""
    weighted = [m for m in module if hasattr(m, "weight")]
    out = {}
    for name, m in zip(_layer_names(arch), weighted, strict=True):
        wt = m.weight.detach().numpy()
        if wt.ndim == 4:
            wj = wt.transpose(2, 3, 1, 0)
        elif name == "dense" and arch.family == "cnn":
            h, w, c = _flat_hwc(arch)
            wj = wt.reshape(-1, c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, -1)
        else:
            wj = wt.T
        out[name] = {"w": wj, "b": m.bias.detach().numpy().copy()}
    return out


# ---------------------------------------------------------------------------------------------
# the contenders
# ---------------------------------------------------------------------------------------------


def _xent(logits, target):
    return -jnp.sum(target * jax.nn.log_softmax(logits), axis=-1).mean()


def _tx():
    # the trainer's optimiser: AdamW with per-member lr / wd held in the state
    return optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=0.0)


def _init_opt(tx, params):
    s = tx.init(params)
    s.hyperparams["learning_rate"] = jnp.asarray(LR, jnp.float32)
    s.hyperparams["weight_decay"] = jnp.asarray(0.0, jnp.float32)
    return s


def _numpy_init(arch: Arch, members: int, rng: np.random.Generator) -> dict:
    """Stacked params [M, ...] with ``Arch.init``'s shapes and scales (He-normal weights, gain 1
    on the logits layer, zero biases), drawn with numpy: compiling ``vmap(arch.init)`` costs
    ~20 s of CPU here, and the benchmark only needs every contender to start from the same point."""
    shapes = jax.eval_shape(arch.init, jax.random.key(0))

    def draw(path, sd):
        layer, leaf = (getattr(k, "key", k) for k in path)
        if leaf == "b":
            return jnp.zeros((members, *sd.shape), jnp.float32)
        gain = 1.0 if layer == "out" else 2.0
        w = rng.standard_normal((members, *sd.shape), dtype=np.float32) * np.float32(
            np.sqrt(gain / np.prod(sd.shape[:-1]))
        )
        return jnp.asarray(w)

    return jax.tree_util.tree_map_with_path(draw, shapes)


class Setup:
    """Everything the contenders share for one family: data, per-member order, keys, init."""

    def __init__(self, arch: Arch, x: np.ndarray, y: np.ndarray, members: int, steps: int, seed: int = 0):
        self.arch, self.members, self.steps = arch, members, steps
        n = len(x)
        rng = np.random.default_rng(seed)
        # [steps, M, bs] per-member batch order (each member its own permutation, tiled)
        per = [
            np.resize(np.concatenate([rng.permutation(n) for _ in range(-(-steps * BATCH // n))]), steps * BATCH)
            for _ in range(members)
        ]
        self.idx = np.stack(per).reshape(members, steps, BATCH).transpose(1, 0, 2).astype(np.int32)
        self.x, self.y = x, y
        self.xd = jnp.asarray(x)
        self.yd = jnp.asarray(np.eye(arch.num_classes, dtype=np.float32)[y])
        base = jnp.stack([jax.random.key(seed * 1000 + m) for m in range(members)])
        self.params0 = _numpy_init(arch, members, rng)
        # [steps, M] keys, as train_stack folds them (epoch 0)
        fold = jax.vmap(
            lambda k: jax.vmap(lambda s: jax.random.fold_in(jax.random.fold_in(k, 0), s))(jnp.arange(steps))
        )
        self.keys = jax.jit(fold)(base).T
        jax.block_until_ready((self.params0, self.keys))


def make_sarjax(st: Setup):
    """sarjax's vmapped trainer: the compiled epoch kernel of ``train_stack``."""
    tx = _tx()
    epoch = _make_epoch_fn(st.arch, False, tx, dropout=False)  # as train_stack when every dropout rate is 0
    m = st.members
    opt0 = jax.vmap(lambda p: _init_opt(tx, p))(st.params0)
    hp = {"aug": jnp.zeros(m), "ls": jnp.zeros(m), "dropout": jnp.zeros(m)}
    active = jnp.ones(m, bool)
    idx = jnp.asarray(st.idx)
    jax.block_until_ready((opt0, idx))

    def run():
        p, _, loss = epoch(st.params0, opt0, st.xd, st.yd, idx, st.keys, hp, active, masked=False)
        jax.block_until_ready((p, loss))
        return [jax.tree.map(lambda a, i=i: np.asarray(a[i]), p) for i in range(m)]

    return run


def make_jax_loop(st: Setup, scan: bool = False):
    """A Python loop over members (and steps, unless ``scan``) around one jitted member step."""
    tx, arch = _tx(), st.arch

    def member_step(params, opt_state, x, y, ib, key):
        del key  # no dropout draw (every rate is 0)
        xb, yb = x[ib], y[ib]

        def loss_fn(p):
            return _xent(arch.apply(p, xb), yb)  # no dropout: as the sarjax trainer when every rate is 0

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    m, steps = st.members, st.steps
    p0 = [jax.tree.map(lambda a, i=i: a[i], st.params0) for i in range(m)]
    o0 = [_init_opt(tx, p) for p in p0]
    if scan:

        @jax.jit
        def member_run(params, opt_state, x, y, idx, keys):  # idx: [steps, bs], keys: [steps]
            def body(c, inp):
                p, s, loss = member_step(*c, x, y, *inp)
                return (p, s), loss

            (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (idx, keys))
            return params, opt_state, losses

        idx = [jnp.asarray(st.idx[:, i]) for i in range(m)]
        keys = [st.keys[:, i] for i in range(m)]
        jax.block_until_ready((p0, o0, idx, keys))

        def run():
            out = [member_run(p0[i], o0[i], st.xd, st.yd, idx[i], keys[i])[0] for i in range(m)]
            jax.block_until_ready(out)
            return [jax.tree.map(np.asarray, p) for p in out]

        return run

    step = jax.jit(member_step)
    # per-step inputs prepared on the device up front (untimed), as the torch loop gets them
    idx = [[jnp.asarray(st.idx[s, i]) for s in range(steps)] for i in range(m)]
    keys = [[st.keys[s, i] for s in range(steps)] for i in range(m)]
    jax.block_until_ready((p0, o0, idx, keys))

    def run():
        out = []
        for i in range(m):
            p, o = p0[i], o0[i]
            for s in range(steps):
                p, o, _ = step(p, o, st.xd, st.yd, idx[i][s], keys[i][s])
            out.append(p)
        jax.block_until_ready(out)
        return [jax.tree.map(np.asarray, p) for p in out]

    return run


def make_torch_loop(st: Setup, threads: int):
    """A PyTorch loop over members and steps on ``threads`` intra-op threads (fresh modules from
    the same init and fresh optimisers each run, untimed)."""
    import torch
    import torch.nn.functional as F

    arch, m, steps = st.arch, st.members, st.steps
    p0 = [jax.tree.map(lambda a, i=i: np.asarray(a[i]), st.params0) for i in range(m)]
    xt = torch.from_numpy(np.ascontiguousarray(st.x.transpose(0, 3, 1, 2)))  # NCHW
    yt = torch.from_numpy(st.y.astype(np.int64))
    idx = torch.from_numpy(st.idx.astype(np.int64))
    models = [torch_module(arch) for _ in range(m)]

    def run():
        torch.set_num_threads(threads)
        for mod, p in zip(models, p0):  # reset to the shared init (untimed)
            load_jax_params(arch, p, mod)
        opts = [torch.optim.AdamW(mod.parameters(), lr=LR, weight_decay=0.0) for mod in models]
        t = time.perf_counter()
        for i in range(m):
            mod, opt = models[i], opts[i]
            for s in range(steps):
                ib = idx[s, i]
                loss = F.cross_entropy(mod(xt[ib]), yt[ib])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        run.seconds = time.perf_counter() - t
        return [jax_params_of(arch, mod) for mod in models]

    return run


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    return getattr(fn, "seconds", dt), out


def _max_diff(a: list, b: list) -> float:
    return float(
        max(
            np.abs(np.asarray(u) - np.asarray(v)).max()
            for pa, pb in zip(a, b)
            for u, v in zip(jax.tree.leaves(pa), jax.tree.leaves(pb))
        )
    )


def check_torch_twin(st: Setup) -> float:
    """Max |logits_torch - logits_jax| of member 0 at init on 64 images; raises if > 1e-3."""
    import torch

    p = jax.tree.map(lambda a: np.asarray(a[0]), st.params0)
    mod = torch_module(st.arch)
    load_jax_params(st.arch, p, mod)
    xb = st.x[:64]
    with torch.no_grad():
        lt = mod(torch.from_numpy(np.ascontiguousarray(xb.transpose(0, 3, 1, 2)))).numpy()
    lj = np.asarray(jax.jit(st.arch.apply)(p, jnp.asarray(xb)))
    back = jax_params_of(st.arch, mod)
    err = float(np.abs(lt - lj).max())
    if err > 1e-3 or _max_diff([back], [p]) != 0.0:
        raise RuntimeError(f"torch twin of {st.arch.name} disagrees with Arch.apply: max |logit diff| {err:.2e}")
    return err


def bench_family(name: str, arch: Arch, x, y, xt, yt, a) -> dict:
    st = Setup(arch, x, y, a.members, a.steps)
    twin_err = check_torch_twin(st)
    runners = {"sarjax": make_sarjax(st), "jax-loop": make_jax_loop(st), "torch-loop": make_torch_loop(st, a.threads)}
    if a.threads != 1 and not a.no_torch_1t:
        runners["torch-loop-1t"] = make_torch_loop(st, 1)
    if a.with_scan_loop:
        runners["jax-scan-loop"] = make_jax_loop(st, scan=True)

    # warm-up (compiles; torch's first-call allocations) and the equivalence check
    warm, finals = {}, {}
    for c, fn in runners.items():
        warm[c], finals[c] = _timed(fn)
    acc_fn = jax.jit(
        lambda p, xx, yy: (jnp.argmax(jax.vmap(arch.apply, in_axes=(0, None))(p, xx), -1) == yy[None]).mean(-1)
    )
    test_acc = {
        c: float(np.mean(acc_fn(jax.tree.map(lambda *v: jnp.stack(v), *ps), jnp.asarray(xt), jnp.asarray(yt))))
        for c, ps in finals.items()
    }
    init_acc = float(np.mean(acc_fn(st.params0, jnp.asarray(xt), jnp.asarray(yt))))
    diffs = {f"{c}_vs_sarjax": _max_diff(finals[c], finals["sarjax"]) for c in runners if c != "sarjax"}
    del finals

    times = {c: [] for c in runners}
    for r in range(a.repeats):  # alternate: a, b, c, a, b, c, ...
        for c, fn in runners.items():
            times[c].append(_timed(fn)[0])
        print(
            f"  {name} round {r + 1}/{a.repeats}: " + "  ".join(f"{c} {times[c][-1]:.2f}s" for c in runners), flush=True
        )
    work = a.members * a.steps * BATCH
    med = {c: float(np.median(t)) for c, t in times.items()}
    thr = {c: work / med[c] for c in runners}
    ratios = {f"sarjax/{c}": thr["sarjax"] / thr[c] for c in runners if c != "sarjax"}
    return {
        "arch": arch.spec(),
        "member_samples_per_run": work,
        "median_seconds": med,
        "median_member_samples_per_s": thr,
        "ratios": ratios,
        "seconds_per_repeat": times,
        "warmup_seconds_incl_compile": warm,
        "equivalence": {
            "torch_twin_init_logits_max_abs_diff": twin_err,
            "final_params_max_abs_diff": diffs,
            "mean_test_acc_after_training": test_acc,
            "mean_test_acc_at_init": init_acc,
        },
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=20, help="pool size M (default 20, the SAR paper's)")
    ap.add_argument("--steps", type=int, default=50, help="training steps per member (default 50)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per contender (default 3)")
    ap.add_argument(
        "--families", default=None, help=f"comma-separated, from {sorted(FAMILIES)} (default mlp,cnn; --quick: mlp)"
    )
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--no-torch-1t", action="store_true", help="skip the extra one-thread torch loop contender")
    ap.add_argument(
        "--with-scan-loop", action="store_true", help="add a 4th contender: JAX loop over members of a jitted scan"
    )
    ap.add_argument(
        "--quick", action="store_true", help="M=4, 16 steps, 2 repeats, mlp unless --families (under a minute)"
    )
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default: a temporary folder, never benchmarks/results/)",
    )
    a = ap.parse_args(argv)
    # without --out, a run never overwrites benchmarks/results/
    a.out = str(results_path("train_throughput.json", a.out, quick=a.quick))
    if a.quick:
        a.members, a.steps, a.repeats = 4, 16, 2
    if a.families is None:
        a.families = "mlp" if a.quick else "mlp,cnn"
    fams = [f.strip() for f in a.families.split(",") if f.strip()]
    bad = [f for f in fams if f not in FAMILIES]
    if bad or not fams:
        ap.error(f"--families must be a comma-separated subset of {sorted(FAMILIES)}, got {a.families!r}")
    if a.members < 1 or a.steps < 1 or a.repeats < 1:
        ap.error(f"--members, --steps and --repeats must be >= 1, got {a.members}, {a.steps}, {a.repeats}")

    import torch

    torch.set_num_threads(a.threads)
    torch_info = torch.__config__.parallel_info().splitlines()[:8]  # before the 1-thread contender changes it
    data = load_mnist()
    t0 = time.time()
    load0 = os.getloadavg()
    res = {"families": {}}
    for f in fams:
        print(f"{f}: {FAMILIES[f].name}, M={a.members}, {a.steps} steps x batch {BATCH}", flush=True)
        res["families"][f] = bench_family(f, FAMILIES[f], data.x_train, data.y_train, data.x_test, data.y_test, a)

    cols = list(res["families"][fams[0]]["median_member_samples_per_s"])
    ratio_cols = [c for c in cols if c != "sarjax"]
    head = f"{'family':<10}" + "".join(f"{c:>15}" for c in cols) + "".join(f"{'sarjax/' + c:>22}" for c in ratio_cols)
    print("\nmedian member-samples/s (higher is better)")
    print(head)
    for f, r in res["families"].items():
        print(
            f"{f:<10}"
            + "".join(f"{r['median_member_samples_per_s'][c]:>15.0f}" for c in cols)
            + "".join(f"{r['ratios']['sarjax/' + c]:>21.2f}x" for c in ratio_cols)
        )
    for f, r in res["families"].items():
        e = r["equivalence"]
        print(
            f"{f}: torch twin logits diff {e['torch_twin_init_logits_max_abs_diff']:.1e}; final params max diff vs sarjax "
            + ", ".join(f"{k.split('_vs')[0]} {v:.1e}" for k, v in e["final_params_max_abs_diff"].items())
            + "; test acc "
            + ", ".join(f"{k} {v:.3f}" for k, v in e["mean_test_acc_after_training"].items())
            + f" (init {e['mean_test_acc_at_init']:.3f})"
        )

    res["settings"] = {
        "members": a.members,
        "steps": a.steps,
        "batch_size": BATCH,
        "repeats": a.repeats,
        "families": fams,
        "optimizer": f"AdamW lr={LR} weight_decay=0 betas=(0.9,0.999) eps=1e-8",
        "loss": "softmax cross-entropy",
        "torch_threads": a.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch_parallel_info": torch_info,
        "quick": a.quick,
        "with_scan_loop": a.with_scan_loop,
        "data": f"{data.source}, train split {len(data.y_train)} images",
        "command": " ".join(
            ["python", "benchmarks/train_throughput.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    res["machine"] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": __import__("jaxlib").__version__,
        "jax_devices": [str(d) for d in jax.devices()],
        "torch": torch.__version__,
        "optax": optax.__version__,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "wall_seconds": time.time() - t0,
    }
    res["provenance"] = provenance()  # command, commit, machine, date, load
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out} ({time.time() - t0:.0f} s)")
    return res


if __name__ == "__main__":
    main()
