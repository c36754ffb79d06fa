"""``sarjax autoattack`` across 2 processes on JAX's distributed runtime equals the one-process run.

Known answer: the same command in one process. The two processes join a coordinator on a free
localhost port (gloo collectives on CPU); each runs its share of every attack run's chunks
(chunk ``j`` on process ``j mod 2``), the chunks' results are gathered after every run, and
process 0 writes OUT.json and OUT.npz. Every array of the npz and every field of the report but
the wall times must be equal, bit for bit.

The pool is ``_aa_tiny.make_linear_pool`` (``--model``: two linear members) and the images a
16-image ``--images`` file, attacked in chunks of 4 (four chunks in the first run of a stage, fewer
later): the processes spend their time importing and compiling, not attacking.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from _aa_tiny import BUDGET, EPS, images
from _procs import coordinator_args, free_port, run_at_once

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one-process OUT.json, two-process OUT.json, the processes' outputs), the three run at once."""
    tmp = tmp_path_factory.mktemp("aa_mp")
    x, y = images(16, seed=2)
    np.savez(tmp / "mine.npz", x=x, y=y, ids=np.arange(100, 116))
    common = [sys.executable, "-m", "sarjax.cli", "autoattack", "--model", "_aa_tiny:make_linear_pool"]
    common += ["--images", str(tmp / "mine.npz"), "--norm", "linf", "--eps", str(EPS), "--batch-size", "4"]
    common += ["--n-iter", str(BUDGET["n_iter"]), "--fab-iter", str(BUDGET["fab_iter"])]
    common += ["--square-queries", str(BUDGET["square_queries"]), "--seed", "3", "--no-progress"]
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": path}
    port = free_port()
    cmds = [([*common, "--out", str(tmp / "one.json")], env)]
    cmds += [([*common, "--out", str(tmp / "two.json"), *coordinator_args(port, 2, i)], env) for i in range(2)]
    outs = run_at_once(cmds)
    return tmp / "one.json", tmp / "two.json", outs


def test_two_processes_give_the_one_process_autoattack_bit_for_bit(runs):
    one, two, outs = runs
    a, b = np.load(one.with_suffix(".npz")), np.load(two.with_suffix(".npz"))
    assert sorted(a.files) == sorted(b.files) == sorted(["robust", "clean", "queries", "x_adv", "ids", "y", "members"])
    for k in a.files:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)
    # the run is not trivial: pairs broken, pairs left robust, and every stage attacked rows over several chunks
    broken = a["clean"] & ~a["robust"]
    assert broken.any() and a["robust"].any() and a["members"].tolist() == ["lin0", "lin1"]
    assert a["ids"].tolist() == list(range(100, 116))
    ja, jb = json.loads(one.read_text()), json.loads(two.read_text())
    for j in (ja, jb):
        j.pop("seconds"), j.pop("npz")
        j.pop("compile")  # process 0's XLA compilations: the gathers compile programs of their own
        assert " autoattack " in j.pop("provenance")["command"]  # each run's own command and date
        for s in j["stages"]:
            s.pop("seconds")
    assert ja == jb
    assert all(s["attacked"] > 4 and not s["skipped"] for s in ja["stages"]), ja["stages"]
    # process 0 wrote OUT and printed the log; process 1 printed neither
    assert "wrote" in outs[1] and "robust accuracy" in outs[1]
    assert "wrote" not in outs[2] and "robust accuracy" not in outs[2]
