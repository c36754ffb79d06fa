"""``sarjax sar --images FILE.npz`` without ``--samples`` attacks every image of the file.

It used to take the MNIST default of 100 and refuse a file of 12 images ("samples must be at
most 12 ... got 100"); ``frontier`` and ``autoattack`` already take the whole file. Known answers:
the file's image count, and the same fingerprint as an explicit ``--samples 12`` (which resumes
it). The embedded-MNIST default stays 100.
"""

import json

import jax
import numpy as np
import pytest

from sarjax.cli import main
from sarjax.experiments import sar
from sarjax.experiments.sar import SavedPoolSARSettings
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool, Stack
from sarjax.models.zoo import mlp

SAR = ["--eps", "0.1", "--delta", "0.2", "--steps", "2", "--restarts", "1"]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sar_images")
    arch = mlp((8,), input_shape=(6, 6, 1), num_classes=4)
    shapes = jax.eval_shape(jax.vmap(arch.init), jax.random.split(jax.random.key(0), 2))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / 3).astype(np.float32), shapes)
    pool = Pool([Stack(arch, params, ("a", "b"))])
    pdir = save_pool(pool, tmp / "p")
    x = rng.uniform(size=(12, 6, 6, 1)).astype(np.float32)
    y = np.asarray(pool.logits(x))[0].argmax(-1).astype(np.int64)
    np.savez(tmp / "imgs.npz", x=x, y=y)
    return tmp, pdir


def test_sar_images_without_samples_attacks_the_whole_file(user):
    tmp, pdir = user
    out = tmp / "out"
    argv = ["sar", "--pool", str(pdir), "--images", str(tmp / "imgs.npz"), "--out", str(out), *SAR]
    assert main(argv) == 0
    doc = _results(out)
    assert doc["samples"] == 12
    assert json.loads((out / "fingerprint.json").read_text())["samples"] == 12
    # an explicit --samples 12 is the same run: it resumes (reads the finished OUT), not refused
    assert main([*argv, "--samples", "12"]) == 0
    assert _results(out) == _without_compile(doc)


def test_sar_images_with_more_samples_than_the_file_is_refused(user):
    tmp, pdir = user
    with pytest.raises(ValueError, match=r"samples must be at most 12 \(the images in .*imgs\.npz\), got 13"):
        sar.run_sar_on_saved_pool(
            str(pdir),
            0.1,
            0.2,
            samples=13,
            out=str(tmp / "o13"),
            images=str(tmp / "imgs.npz"),
            settings=SavedPoolSARSettings(progress=False),
        )


def test_the_mnist_default_is_still_100():
    assert sar.SAR_DEFAULT_SAMPLES == 100
    assert sar.sar_samples(None, None) == 100 and sar.sar_samples(7, None) == 7
    assert sar.sar_samples(None, 12) == 12 and sar.sar_samples(5, 12) == 5
    parser_help = _help("sar")
    assert "default 100" in parser_help and "every image of --images" in parser_help


def _help(cmd):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main([cmd, "--help"])
    return " ".join(buf.getvalue().split())


def test_sar_images_moved_file_resumes_and_other_content_is_refused(user, capsys):
    """The output's identity is the images' content, not the file's path: the same file under
    another path reads the finished run; a file with one label changed (the clean accuracy's
    labels) is refused, naming the digest that differs."""
    import shutil

    tmp, pdir = user
    out = tmp / "out_moved"
    argv = ["sar", "--pool", str(pdir), "--out", str(out), *SAR]
    assert main([*argv, "--images", str(tmp / "imgs.npz")]) == 0
    doc = _results(out)
    moved = tmp / "elsewhere"
    moved.mkdir(exist_ok=True)
    shutil.copy(tmp / "imgs.npz", moved / "renamed.npz")
    assert main([*argv, "--images", str(moved / "renamed.npz")]) == 0
    assert _results(out) == _without_compile(doc)
    with np.load(tmp / "imgs.npz") as z:
        x, y = z["x"], z["y"].copy()
    y[0] = (y[0] + 1) % 4
    np.savez(moved / "relabelled.npz", x=x, y=y)
    capsys.readouterr()
    assert main([*argv, "--images", str(moved / "relabelled.npz")]) == 2
    assert "was written with accuracy_images=" in capsys.readouterr().err
    assert _results(out) == _without_compile(doc)


def _without_compile(doc):
    """A run's results.json without its "compile" and "provenance" records (what this run compiled,
    its command and date: a rerun that reads the finished run compiles less, and its results are
    the same)."""
    return {k: v for k, v in doc.items() if k not in ("compile", "provenance")}


def _results(out):
    return _without_compile(json.loads((out / "results.json").read_text()))
