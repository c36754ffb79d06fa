"""``sarjax sar`` across 2 processes on JAX's distributed runtime equals the one-process run.

Known answer: the same command in one process on one device. The two processes join a
coordinator on a free localhost port (gloo collectives on CPU), each shards its block of the
images over a mesh of its OWN 2 fake CPU devices (4 in the job): process 0 on the member axis
(``--devices pool=2``: the 3 members padded to 4), process 1 on the batch axis
(``--devices data=2``: its block of 2 images); process 0 writes OUT. Every array of
the saved SARResult and every number of results.json must be equal (bit for bit), per-sample
k_hat included.

The pool is 3 random MLP members and the data a tiny IDX directory (6 test images), so the
three processes spend their time importing and compiling, not attacking.
"""

import json
import os
import sys
from dataclasses import fields

import jax
import numpy as np
import pytest
from _procs import coordinator_args, free_port, run_at_once

from sarjax.cover.result import SARResult
from sarjax.models import zoo
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack


def _write_idx(path, array):
    a = np.ascontiguousarray(array, np.uint8)
    header = bytes([0, 0, 8, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    path.write_bytes(header + a.tobytes())


def _tiny_mnist(d):
    rng = np.random.default_rng(0)
    d.mkdir()
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    for (img, lab), n in zip([names[:2], names[2:]], (4, 6)):
        _write_idx(d / img, rng.integers(0, 256, (n, 28, 28)))
        _write_idx(d / lab, rng.integers(0, 10, n))
    return d


def _tiny_pool(d):
    arch = zoo.mlp((8,))
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 3))
    rng = np.random.default_rng(1)
    params = jax.tree.map(
        lambda s: (rng.standard_normal(s.shape) / np.sqrt(np.prod(s.shape[1:-1]) or 1.0)).astype(np.float32), shapes
    )
    return save_pool(Pool([Stack(arch, params, tuple(f"m{i}" for i in range(3)))]), d)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one-process OUT, two-process OUT, the processes' outputs), the three run at once."""
    tmp = tmp_path_factory.mktemp("sar_mp")
    common = [sys.executable, "-m", "sarjax.cli", "sar", "--pool", str(_tiny_pool(tmp / "pool"))]
    common += ["--data-dir", str(_tiny_mnist(tmp / "mnist")), "--eps", "0.3", "--delta", "0.25"]
    common += ["--samples", "5", "--steps", "3", "--restarts", "1", "--seed", "3"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    port = free_port()
    cmds = [([*common, "--out", str(tmp / "one")], env)]
    for i, mesh in enumerate(["pool=2", "data=2"]):  # each process's own mesh over its own devices
        cmd = [*common, "--out", str(tmp / "two"), "--devices", mesh, *coordinator_args(port, 2, i)]
        cmds.append((cmd, {**env, "JAX_NUM_CPU_DEVICES": "2"}))
    outs = run_at_once(cmds)
    return tmp / "one", tmp / "two", outs


def test_two_processes_give_the_one_process_sar_bit_for_bit(runs):
    one, two, outs = runs
    a, b = SARResult.load(one / "sar"), SARResult.load(two / "sar")
    assert a.batch_size == 5 and a.num_rounds >= 2
    assert a.reached.any() and not a.reached.all(), a.k_hat  # some samples reach the target, some not
    assert a.fallback.any()
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(y, x, err_msg=f.name)
        else:
            assert x == y, f.name
    ja, jb = json.loads((one / "results.json").read_text()), json.loads((two / "results.json").read_text())
    assert (ja.pop("processes"), jb.pop("processes")) == (1, 2)
    assert ja.pop("compile")["programs"] > 0 and jb.pop("compile")["programs"] > 0  # each run's own compilations
    assert all(" sar " in j.pop("provenance")["command"] for j in (ja, jb))  # each run's own command and date
    assert (ja.pop("devices"), jb.pop("devices")) == (None, {"pool": 2, "data": 1})  # process 0's
    assert ja == jb
    # process 0 wrote OUT; process 1 only its own checkpoints and printed no summary
    assert "wrote" in outs[1] and "wrote" not in outs[2]
    assert sorted(p.name for p in (two / "checkpoint").iterdir()) == ["process_0_of_2", "process_1_of_2"]


# -- the pieces, in this (one) process ------------------------------------------------------


def test_process_rows_split_contiguously_and_refuse_empty_blocks():
    from sarjax.runtime.distributed import process_rows

    blocks = [process_rows(7, i, 3).tolist() for i in range(3)]
    assert blocks == [[0, 1, 2], [3, 4], [5, 6]]
    assert process_rows(4).tolist() == [0, 1, 2, 3]  # one process: everything
    with pytest.raises(ValueError, match="2 samples cannot be split over 3 processes"):
        process_rows(2, 0, 3)


def test_initialize_checks_its_arguments_before_joining():
    from sarjax.runtime.distributed import initialize

    with pytest.raises(ValueError, match="go together"):
        initialize("localhost:1234", None, 0)
    with pytest.raises(ValueError, match="HOST:PORT"):
        initialize("localhost", 2, 0)
    with pytest.raises(ValueError, match=r"process_id must be in \[0, 2\), got 2"):
        initialize("localhost:1234", 2, 2)


def test_packed_parts_come_back_and_concatenate_like_chunks():
    # allgather_parts ships each process's result as bytes and concatenates them in process order:
    # the same as run_sar's own chunks. Known answer: run_sar on the whole batch (in chunks of 2,
    # the parts' size: one compiled kernel for the test).
    from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
    from sarjax.cover.result import concat_results
    from sarjax.sar.distributed import _pack, _unpack, run_sar_across_processes
    from sarjax.sar.settings import SARSettings
    from sarjax.sar.vision import run_sar

    arch = zoo.mlp((6,), input_shape=(4, 4, 1), num_classes=4)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 3))
    rng = np.random.default_rng(2)
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), shapes)
    pool = Pool([Stack(arch, params, ("a", "b", "c"))])
    x = rng.random((4, 4, 4, 1), dtype=np.float32)
    kw = dict(key=jax.random.key(1), attack=make_joint_pgd(pool.apply, steps=2, step=JointPGDStep(restarts=1)))
    whole = run_sar(pool, x, 0.3, [0.0, 0.5], settings=SARSettings(chunk_size=2), **kw)
    assert whole.covered.any() and whole.num_rounds >= 2
    one = run_sar_across_processes(
        pool, x, 0.3, [0.0, 0.5], settings=SARSettings(chunk_size=2), **kw
    )  # one process: run_sar
    assert one.k_hat.tolist() == whole.k_hat.tolist()
    parts = [run_sar(pool, x[r], 0.3, [0.0, 0.5], sample_ids=r, **kw) for r in (np.arange(2), np.arange(2, 4))]
    back = [_unpack(_pack(p, {"s": np.full((p.batch_size, 2), i)})) for i, p in enumerate(parts)]
    merged = concat_results([r for r, _ in back])
    assert [e["s"][:, 0].tolist() for _, e in back] == [[0, 0], [1, 1]]
    for f in fields(whole):
        a, b = getattr(whole, f.name), getattr(merged, f.name)
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(b, a, err_msg=f.name)
