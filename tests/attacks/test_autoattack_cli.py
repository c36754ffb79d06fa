"""``sarjax autoattack``'s wiring: ``--model`` / ``--pool``, ``--images`` / MNIST, the report's fields,
the progress bars, and the one-line errors. The attack itself is replaced by a stand-in that records
its arguments (the real runs: test_autoattack_runner.py, test_autoattack_multiprocess.py)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from _aa_tiny import images, make_pool

import sarjax.attacks.autoattack as aa
from sarjax.cli import main


@pytest.fixture
def fake(monkeypatch):
    """autoattack_pool replaced: every pair robust; records its keywords and images."""
    seen = {}

    def stand_in(pool, x, y, *, attack, settings, **kw):
        seen.update(kw, attack=attack, settings=settings, x=np.asarray(x), y=np.asarray(y))
        b, m = len(x), pool.num_members
        if settings.progress is not None:
            settings.progress("apgd-ce", 0, b)
            settings.progress("apgd-ce", b, b)
        z = np.ones((b, m), bool)
        log = (aa.StageLog("apgd-ce", z.mean(0), 0.1, 0, int(z.sum()), 0),)
        return aa.AutoAttackResult(
            np.repeat(np.asarray(x)[:, None], m, axis=1), z, z, np.ones((b, m), np.int64),
            np.ones((2, b, m), np.int64), np.stack([z, z]), log, attack.version, attack.norm, attack.eps,
            tuple(pool.names), (),
        )  # fmt: skip

    monkeypatch.setattr(aa, "autoattack_pool", stand_in)
    return seen


def _cli(*argv):
    return main(["autoattack", "--norm", "linf", "--eps", "0.05", *map(str, argv)])


@pytest.fixture
def mine(tmp_path):
    x, y = images(10)
    path = tmp_path / "mine.npz"
    np.savez(path, x=x, y=y, ids=np.arange(10) + 50)
    return path, x, y


def test_model_and_images(fake, mine, tmp_path):
    path, x, y = mine
    out = tmp_path / "r" / "aa.json"
    assert _cli("--model", "_aa_tiny:make_pool", "--images", path, "--samples", 6, "--out", out, "--no-progress") == 0
    np.testing.assert_array_equal(fake["x"], x[:6])  # the file's first 6 images, as stored
    assert fake["y"].tolist() == y[:6].tolist() and fake["sample_ids"].tolist() == list(range(50, 56))
    assert fake["settings"].progress is None and not fake["settings"].distribute  # --no-progress; one process
    report = json.loads(out.read_text())
    assert report["model"] == "_aa_tiny:make_pool" and report["pool"] is None
    assert report["samples"] == 6 and report["sample_indices"] == list(range(6))
    assert report["data"].startswith(f"images {path.absolute()} (10 images, sha256 ")
    z = np.load(out.with_suffix(".npz"))
    assert z["ids"].tolist() == list(range(50, 56)) and z["members"].tolist() == ["lin0", "lin1", "relu"]
    assert report["npz"] == str(out.with_suffix(".npz").absolute())
    # without --samples: every image of the file (other images: --overwrite replaces the 6-image run)
    assert _cli("--model", "_aa_tiny:make_pool", "--images", path, "--out", out, "--no-progress", "--overwrite") == 0
    assert len(fake["x"]) == 10


def test_pool_on_mnist_writes_todays_report_and_the_npz(fake, monkeypatch, tmp_path, capsys):
    import sarjax.data.mnist as mnist
    import sarjax.models.checkpoint as checkpoint

    x, y = images(30)
    monkeypatch.setattr(mnist, "load_mnist", lambda data_dir=None: SimpleNamespace(x_test=x, y_test=y, source="tiny"))
    monkeypatch.setattr(checkpoint, "load_pool", lambda path: (make_pool(), {}))
    out = tmp_path / "aa.json"
    assert _cli("--pool", tmp_path / "P", "--samples", 5, "--out", out) == 0
    idx = np.sort(np.random.default_rng(0).permutation(30)[:5])
    np.testing.assert_array_equal(fake["x"], x[idx])
    assert fake["sample_ids"] is None  # MNIST: the sample ids stay 0 .. N-1, as before
    assert callable(fake["settings"].progress)
    report = json.loads(out.read_text())
    today = {"version", "norm", "eps", "members", "clean_accuracy", "robust_accuracy", "queries_total"}
    today |= {"queries_per_sample_mean", "stages", "warnings", "pool", "samples", "sample_indices", "data", "seed"}
    today |= {"seconds", "budget", "noise_sigma", "randomized_members", "deterministic_members_skipped"}
    today |= {"fingerprint"}  # the settings a rerun into the same OUT is checked against
    today |= {"compile"}  # the attack's XLA compilations (sarjax.runtime.compile_stats)
    today |= {"provenance"}  # command, commit, machine, date, load (sarjax.runtime.provenance)
    assert set(report) == today | {"npz"}
    assert report["provenance"]["command"].startswith("sarjax autoattack --norm linf --eps 0.05 --pool ")
    assert report["sample_indices"] == idx.tolist() and report["pool"] == str((tmp_path / "P").absolute())
    assert f"wrote {out} and {out.with_suffix('.npz')}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pool", "P", "--model", "_aa_tiny:make_pool"], "give --pool DIR or --model PKG.MODULE:FUNCTION, not both"),
        ([], "give the models to attack: --pool DIR (a saved pool) or --model PKG.MODULE:FUNCTION"),
        (["--model", "_aa_tiny:make_pool", "--model", "_aa_tiny:make_linear_pool"], "give --model once, got 2"),
        (
            ["--model", "_aa_tiny:make_pool", "--images", "a.npz", "--data-dir", "D"],
            "give --images FILE.npz or --data-dir",
        ),
        (["--model", "_aa_tiny:nothing"], "'_aa_tiny:nothing': module '_aa_tiny' has no attribute 'nothing'"),
        (["--model", "_aa_tiny:make_pool", "--out", "aa.npz"], "out must be the JSON report's path"),
    ],
)
def test_one_line_errors(fake, argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sarjax autoattack: error: ") and message in err and "\n" not in err


def test_images_checked_before_the_model_is_built(fake, mine, monkeypatch, capsys, tmp_path):
    import sarjax.models.builders as builders

    path, x, y = mine

    def no_model(spec):
        raise AssertionError("the model was built before --samples was checked")

    monkeypatch.setattr(builders, "load_model", no_model)
    assert _cli("--model", "_aa_tiny:make_pool", "--images", path, "--samples", 11) == 2
    assert f"samples must be in [1, 10] (the images in {path}), got 11" in capsys.readouterr().err
    monkeypatch.undo()
    np.savez(tmp_path / "rgb.npz", x=np.zeros((3, 4, 4, 3), np.float32), y=np.zeros(3, int))
    assert _cli("--model", "_aa_tiny:make_pool", "--images", tmp_path / "rgb.npz", "--out", tmp_path / "o.json") == 2
    err = capsys.readouterr().err
    assert f"the pool takes inputs (4, 4, 1), --images {tmp_path / 'rgb.npz'} has (4, 4, 3)" in err
    assert not (tmp_path / "o.json").exists()


def test_progress_bars_one_per_stage_and_call():
    from sarjax.cli.autoattack import _progress_callback

    class Bar:
        def __init__(self):
            self.tasks, self.done = [], {}

        def add_task(self, label, total):
            self.tasks.append(label)
            return len(self.tasks) - 1

        def update(self, task, completed, total):
            self.done[task] = (completed, total)

    bar = Bar()
    cb = _progress_callback(bar, [("lin0", "lin1"), ("relu",)])
    for stage, total in [("apgd-ce", 19), ("apgd-t", 72)]:
        cb(stage, 0, total)
        cb(stage, total, total)
    cb("apgd-ce", 0, 9)
    cb("apgd-ce", 5, 9)
    assert bar.tasks == ["lin0, lin1: apgd-ce", "lin0, lin1: apgd-t", "relu: apgd-ce"]
    assert bar.done == {0: (19, 19), 1: (72, 72), 2: (5, 9)}
    single = Bar()
    cb = _progress_callback(single, [("a", "b")])
    cb("square", 0, 0)
    assert single.tasks == ["square"] and single.done == {0: (0, 0)}
