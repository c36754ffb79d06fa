"""Checkpoints of every stack kind: a pool of zoo + linen + nnx + plain-function stacks saved here
and restored in a FRESH process with the users' builders gives bit-identical logits; a missing or
wrong builder raise CheckpointError naming the stack; sarjax-pool/2 loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _flax_nets import SHAPE, LinenCNN, linen_variables, nnx_member, plain_apply, plain_params, zoo_params

from sarjax.models import zoo
from sarjax.models.checkpoint import CheckpointError, load_pool, save_pool
from sarjax.models.pool import Pool, Stack

HERE = Path(__file__).parent
BUILDERS = (  # source text of the builders for the fresh process
    "{'LinenCNN': lambda: F.LinenCNN(channels=2, dense=4), 'NnxMLP': lambda: F.nnx_member(0, hidden=4),"
    " 'plain_apply': lambda: F.plain_apply}"
)


def _x():
    return np.random.default_rng(7).random((3, *SHAPE), dtype=np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    arch = zoo.mlp((4,), input_shape=SHAPE, num_classes=3)
    module = LinenCNN(channels=2, dense=4)
    pool = Pool.concat(
        Pool([Stack(arch, zoo_params(arch, 1, 0), ("z0",))]),
        Pool.from_flax(module, [linen_variables(module, s) for s in (1, 2)], ["l0", "l1"], input_shape=SHAPE),
        Pool.from_nnx([nnx_member(s, hidden=4) for s in (3, 4)], ["n0", "n1"], input_shape=SHAPE),
        Pool.from_functions([(plain_apply, plain_params(s)) for s in (5, 6)], ["f0", "f1"], input_shape=SHAPE),
    )
    return pool, save_pool(pool, tmp_path_factory.mktemp("kinds") / "pool", config={"note": "kinds"})


def test_round_trip_in_a_fresh_process_is_bit_identical(saved, tmp_path):
    pool, d = saved
    out = tmp_path / "out.npz"
    script = "\n".join(
        [
            "import sys",
            "import numpy as np",
            f"sys.path.insert(0, {str(HERE)!r})",
            "import _flax_nets as F",
            "from sarjax.models.checkpoint import load_pool",
            f"pool, config = load_pool({str(d)!r}, builders={BUILDERS})",
            "x = np.random.default_rng(7).random((3, *F.SHAPE), dtype=np.float32)",
            f"np.savez({str(out)!r}, logits=np.asarray(pool.logits(x)), hash=pool.content_hash(),"
            " names=list(pool.names), kinds=[s.kind for s in pool.stacks], note=config['note'])",
        ]
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(out)
    assert list(got["kinds"]) == ["zoo", "linen", "nnx", "function"]
    assert tuple(got["names"]) == pool.names and str(got["note"]) == "kinds"
    assert str(got["hash"]) == pool.content_hash()
    np.testing.assert_array_equal(got["logits"], np.asarray(pool.logits(_x())))


def test_missing_and_wrong_builders_name_the_stack(saved):
    import _flax_nets as F

    _, d = saved
    builders = {"LinenCNN": lambda: F.LinenCNN(channels=2, dense=4), "plain_apply": lambda: F.plain_apply}
    with pytest.raises(CheckpointError, match=r"stack 2 is a 'nnx' stack named 'NnxMLP'.*builders=\{'NnxMLP': fn\}"):
        load_pool(d, builders=builders)
    # save_pool recorded the linen module's class and fields and the module-level apply (issue 37),
    # so without builders those two restore by themselves and the nnx stack (no path) is the one named
    meta = json.loads((d / "pool.json").read_text())
    assert [s.get("builder") for s in meta["stacks"]] == [
        None,
        {"path": "_flax_nets:LinenCNN", "call": True, "kwargs": {"channels": 2, "dense": 4}},
        None,
        {"path": "_flax_nets:plain_apply", "call": False},
    ]
    with pytest.raises(CheckpointError, match=r"stack 2 is a 'nnx' stack named 'NnxMLP' saved without a builder"):
        load_pool(d)
    # another architecture under the same name: caught before any logits are compared
    wrong = {**builders, "NnxMLP": lambda: F.nnx_twin(F.zoo_params(zoo.mlp((4,), input_shape=SHAPE), 1, 0), 4)}
    with pytest.raises(CheckpointError, match=r"stack 2 \(NnxMLP\): cannot rebuild .* state paths that differ"):
        load_pool(d, builders=wrong)
    wrong = {**builders, "NnxMLP": lambda: F.nnx_member(0, hidden=4), "LinenCNN": lambda: F.LinenCNN(channels=3)}
    with pytest.raises(CheckpointError, match=r"stack 1 \(LinenCNN\)"):
        load_pool(d, builders=wrong)
    # a function that computes something else: the probe logits differ
    other = {
        **builders,
        "NnxMLP": lambda: F.nnx_member(0, hidden=4),
        "plain_apply": lambda: lambda p, x: 2 * F.plain_apply(p, x),
    }
    with pytest.raises(CheckpointError, match=r"probe-batch logits of 2 member\(s\) differ.*'f0' by .*'f1' by"):
        load_pool(d, builders=other)


def test_format_2_still_loads_verified(tmp_path):
    arch = zoo.cnn((2,), dense=4, input_shape=SHAPE, num_classes=3)
    pool = Pool([Stack(arch, zoo_params(arch, 2, 9), ("a", "b"))])
    d = save_pool(pool, tmp_path / "p")
    meta = json.loads((d / "pool.json").read_text())
    meta["format"] = "sarjax-pool/2"  # the /2 layout: zoo entries without "kind"
    for s in meta["stacks"]:
        del s["kind"]
    (d / "pool.json").write_text(json.dumps(meta))
    got, _ = load_pool(d)
    np.testing.assert_array_equal(np.asarray(got.logits(_x())), np.asarray(pool.logits(_x())))
    meta["stacks"][0]["arch"]["act"] = "tanh"  # still verified: an edited architecture is caught
    (d / "pool.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="probe-batch logits"):
        load_pool(d)
