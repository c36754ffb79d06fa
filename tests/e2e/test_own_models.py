"""A user's own models and images through every command, each in a fresh process (issue 37).

The user's module (``_ownmodels.py``, copied to a temporary folder as ``ownmodels.py`` and put
on ``PYTHONPATH``, as a user's package would be installed) builds one pool of all four kinds: plain
functions, flax linen, flax nnx and PyTorch. A fresh process saves it (``save_pool`` records the
function and linen builders by itself, the nnx and torch ones from ``builders=``). Then, each in
a fresh process and with no code: ``sarjax sar --pool``, ``sarjax sar --model`` (the same pool
built by import path), ``sarjax frontier --models`` and ``sarjax autoattack --pool``, on an
``--images`` file of the user's.

Known answers: the commands' clean accuracies equal the accuracies of the pool built here on the
same images (so the fresh processes restored the same models), and ``--pool`` and ``--model``
give the same SAR (the restored pool is the built one).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

HERE = Path(__file__).parent
BUILDERS = "{'NnxNet': 'ownmodels:nnx_builder', 'TorchNet': 'ownmodels:torch_builder'}"


def _run(args, env, timeout=600):
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, args))}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(tmp dir, env with the user's module on PYTHONPATH, saved pool dir, images file, expected accuracy)."""
    tmp = tmp_path_factory.mktemp("own")
    shutil.copy(HERE / "_ownmodels.py", tmp / "ownmodels.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")])}
    env.update(JAX_PLATFORMS="cpu")  # the session's temporary compilation cache (tests/conftest.py): shared
    script = (
        "import sys, numpy as np, ownmodels\n"
        "from sarjax.data.mnist import load_mnist\n"
        "from sarjax.models.checkpoint import save_pool\n"
        "pool = ownmodels.make_pool()\n"
        f"save_pool(pool, sys.argv[1], builders={BUILDERS})\n"
        "x = load_mnist(None).x_test[:6]\n"
        "y = ownmodels.labels(x)\n"
        "np.savez(sys.argv[2], x=x, y=y, ids=np.arange(100, 106))\n"
        "np.save(sys.argv[3], pool.accuracy(x, y))\n"
    )
    pool_dir, images, acc = tmp / "pool", tmp / "mine.npz", tmp / "acc.npy"
    _run([sys.executable, "-c", script, str(pool_dir), str(images), str(acc)], env)
    meta = json.loads((pool_dir / "pool.json").read_text())
    assert [s["kind"] for s in meta["stacks"]] == ["function", "linen", "nnx", "torch"]
    assert [s["builder"]["path"] for s in meta["stacks"]] == [
        "ownmodels:plain_apply",
        "ownmodels:LinenNet",
        "ownmodels:nnx_builder",
        "ownmodels:torch_builder",
    ]
    return tmp, env, pool_dir, images, np.load(acc)


SAR = ["--eps", "0.1", "--delta", "0.2", "--samples", "4", "--steps", "3", "--restarts", "1"]


def test_sar_on_the_saved_pool_and_by_import_path(user):
    tmp, env, pool_dir, images, acc = user
    cmd = [sys.executable, "-m", "sarjax.cli", "sar", "--images", str(images), *SAR]
    _run([*cmd, "--pool", str(pool_dir), "--out", str(tmp / "sar_pool")], env)
    _run([*cmd, "--model", "ownmodels:make_pool", "--out", str(tmp / "sar_model")], env)
    a = json.loads((tmp / "sar_pool" / "results.json").read_text())
    b = json.loads((tmp / "sar_model" / "results.json").read_text())
    assert a["names"] == ["fn0", "fn1", "linen0", "nnx0", "torch0"]
    np.testing.assert_array_equal(a["member_accuracy"], acc)  # measured on the whole images file
    assert b["pool"] == "model ownmodels:make_pool"
    for k in ("member_accuracy", "member_asr", "sar", "sar_singleton", "k_hat_histogram"):
        assert a[k] == b[k], k


def test_frontier_and_autoattack_on_the_saved_pool_and_images(user):
    tmp, env, pool_dir, images, acc = user
    out = tmp / "frontier"
    args = ["--norm", "l2", "--attacks", "fmn", "--restarts", "0", "--targeted", "0", "--cap", "20"]
    args += ["--samples", "4", "--tiers", "20", "40", "--heldout", "0", "--no-progress", "--images", str(images)]
    _run([sys.executable, "-m", "sarjax.cli", "frontier", "--models", str(pool_dir), "--out", str(out), *args], env)
    report = json.loads((out / "frontier.json").read_text())
    assert report["models"] == [f"pool/{n}" for n in ("fn0", "fn1", "linen0", "nnx0", "torch0")]
    aa = tmp / "aa.json"
    args = ["--norm", "linf", "--eps", "0.05", "--samples", "6", "--n-iter", "3", "--fab-iter", "3"]
    args += ["--square-queries", "10", "--images", str(images), "--no-progress"]
    _run([sys.executable, "-m", "sarjax.cli", "autoattack", "--pool", str(pool_dir), "--out", str(aa), *args], env)
    got = json.loads(aa.read_text())
    assert got["members"] == ["fn0", "fn1", "linen0", "nnx0", "torch0"]
    np.testing.assert_array_equal(got["clean_accuracy"], acc)  # all 6 images of the file
