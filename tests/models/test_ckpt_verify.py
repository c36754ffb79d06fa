"""Pool checkpoints are verified against their fingerprint: an edited pool.json, a truncated or
corrupted params file, or a malformed structure raises CheckpointError naming what differs."""

import json
import shutil
import warnings

import jax
import numpy as np
import pytest

from sarjax.models import zoo
from sarjax.models.checkpoint import CheckpointError, CheckpointWarning, load_pool, save_pool
from sarjax.models.pool import Pool, Stack


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    pool = Pool(
        [
            Stack.from_keys(zoo.mlp((8,)), jax.random.split(jax.random.key(0), 2)),
            Stack.from_keys(zoo.cnn((4,), dense=8), jax.random.split(jax.random.key(1), 2)),
        ]
    )
    return pool, save_pool(pool, tmp_path_factory.mktemp("ckpt") / "pool")


def _copy(saved, tmp_path, edit_meta=None):
    d = tmp_path / "copy"
    shutil.copytree(saved[1], d)
    if edit_meta is not None:
        meta = json.loads((d / "pool.json").read_text())
        edit_meta(meta)
        (d / "pool.json").write_text(json.dumps(meta))
    return d


def test_fingerprinted_roundtrip_and_conv_impl_change_pass(saved, tmp_path):
    pool, d = saved
    x = np.random.default_rng(0).random((3, 28, 28, 1), dtype=np.float32)
    got, _ = load_pool(d)
    np.testing.assert_array_equal(np.asarray(got.logits(x)), np.asarray(pool.logits(x)))
    # another conv_impl computes the same model (float differences far below the tolerance)
    d2 = _copy(saved, tmp_path, lambda m: m["stacks"][1]["arch"].update(conv_impl="fused"))
    got, _ = load_pool(d2)
    assert got.stacks[1].arch.conv_impl == "fused"


@pytest.mark.parametrize("stack,field,value", [(0, "act", "tanh"), (1, "act", "elu")])
def test_edited_activation_is_caught_by_probe_logits(saved, tmp_path, stack, field, value):
    d = _copy(saved, tmp_path, lambda m: m["stacks"][stack]["arch"].update({field: value}))
    names = saved[0].stacks[stack].names
    with pytest.raises(
        CheckpointError,
        match=rf"probe-batch logits of 2 member\(s\) differ.*stack {stack} .*'{value}'"
        rf".*{names[0]!r} by .*{names[1]!r} by",
    ) as e:
        load_pool(d)
    assert str(d) in str(e.value)


def test_edited_class_count_is_caught_by_leaf_shapes(saved, tmp_path):
    d = _copy(saved, tmp_path, lambda m: m["stacks"][0]["arch"].update(num_classes=7))
    with pytest.raises(
        CheckpointError,
        match=r"stack 0 \(mlp-8-relu\): params \(shape, dtype\) do not match: "
        r"\['out'\]\['b'\]: the architecture in pool.json gives \(\(2, 7\).*"
        r"saved params \(\(2, 10\)",
    ):
        load_pool(d)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda m: m.update(stacks=5), r"'stacks' must be a non-empty list .* got 5"),
        (lambda m: m["stacks"].__setitem__(0, [1, 2]), r"stack 0: expected \{'arch'"),
        (lambda m: m["stacks"][1].update(names="cnn"), r"stack 1: expected \{'arch'"),
        (lambda m: m.update(names=None), r"'names' must be a list"),
        (lambda m: m.pop("fingerprint"), r"no valid 'fingerprint'"),
        (lambda m: m["fingerprint"]["stacks"].pop(), r"no valid 'fingerprint'"),
    ],
)
def test_malformed_pool_json_raises_checkpoint_error(saved, tmp_path, edit, match):
    with pytest.raises(CheckpointError, match=match):
        load_pool(_copy(saved, tmp_path, edit))


def test_truncating_any_params_file_fails_before_orbax_reads(saved, tmp_path):
    """Every file of every stack, truncated in turn: always the same one-line CheckpointError
    (orbax never reads a truncated file, so no 'Event loop is closed' from its async reads)."""
    src = saved[1]
    files = sorted(f.relative_to(src) for f in src.glob("stack_*/**/*") if f.is_file() and f.stat().st_size > 1)
    assert len(files) >= 10
    d = tmp_path / "copy"
    for rel in files:
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        f = d / rel
        size = f.stat().st_size
        f.write_bytes(f.read_bytes()[: size // 2])
        stack = int(rel.parts[0][-3:])
        inner = rel.relative_to(rel.parts[0]).as_posix()
        with pytest.raises(
            CheckpointError,
            match=rf"stack {stack} params files are truncated or changed: "
            rf"{inner} has {size // 2} bytes, saved with {size}",
        ):
            load_pool(d)


def test_params_corrupted_into_finite_values_name_the_member(saved, tmp_path):
    d = _copy(saved, tmp_path)
    # the largest file of stack 1 holds the raw weights: flip a few bytes, keep the size
    f = max((p for p in (d / "stack_001").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    b = bytearray(f.read_bytes())
    b[200:204] = b"\x01\x02\x03\x04"
    f.write_bytes(bytes(b))
    with pytest.raises(
        CheckpointError, match=r"stack 1 \(cnn-4-relu\): params of member\(s\) \['cnn-4-relu/0'\] differ"
    ):
        load_pool(d)


def test_legacy_checkpoint_loads_with_warning_and_shape_check(saved, tmp_path):
    def legacy(m):
        m["format"] = "sarjax-pool/1"
        del m["fingerprint"]

    d = _copy(saved, tmp_path, legacy)
    with pytest.warns(CheckpointWarning, match="no fingerprint"):
        pool, _ = load_pool(d)
    assert pool.names == saved[0].names
    # without a fingerprint the restored shapes are still checked (orbax restores the saved shapes)
    meta = json.loads((d / "pool.json").read_text())
    meta["stacks"][0]["arch"]["num_classes"] = 7
    (d / "pool.json").write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(
            CheckpointError,
            match=r"stack 0 .*restored params \(\(2, 10\).*the architecture in pool.json gives \(\(2, 7\)",
        ):
            load_pool(d)
