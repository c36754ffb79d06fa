"""Resuming AutoAttack (``run_autoattack(checkpoint_dir=...)``, ``sarjax autoattack --checkpoint``).

Known answer: the uninterrupted run. A run interrupted at the start of its 3rd (or 6th) attack run
(a stand-in for a crash: the run's function raises before computing), then rerun with the same
checkpoint folder, must give every output array bit for bit and must run only the runs the
interrupted one did not complete (counted: each run's chunks are counted by wrapping
``sarjax.attacks.autoattack._runs``). The pool has two stacks (two AutoAttack calls: the 6th run
lies in the second call, the first call restored whole); the 3rd run lies inside APGD-T of the
first call (its targets' ranking restored, not recomputed).
"""

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from _aa_kw import run as run_autoattack
from _aa_tiny import BUDGET, EPS, images, make_pool
from _procs import coordinator_args, free_port, run_at_once

import sarjax.attacks.autoattack as aa
from sarjax.attacks.autoattack_checks import AutoAttackWarning
from sarjax.cli import main
from sarjax.experiments.autoattack import load_autoattack
from sarjax.runtime import run_state

FMT, POS = aa.STATE_FORMAT, ("next_stage", "next_run")

KW = dict(norm="linf", eps=EPS, batch_size=8, attacks=["apgd-ce", "apgd-t"], checks=False, log=False, **BUDGET)
FIELDS = ("x_adv", "robust", "clean", "queries", "stage_queries", "stage_robust")


class Interrupted(Exception):
    """The stand-in crash."""


@pytest.fixture
def counted(monkeypatch):
    """Wraps every attack run: ``rec["chunks"]`` lists ``(stage call, run)`` per chunk attacked;
    ``rec["fail_at"] = k`` raises when the ``k``-th distinct run starts."""
    real = aa._runs
    rec = {"chunks": [], "started": [], "fail_at": None, "stage": 0}

    def runs(name, ctx, skey):
        rec["stage"] += 1
        for i, f in enumerate(real(name, ctx, skey)):

            def g(*a, f=f, tag=(rec["stage"], name, i)):
                if tag not in rec["started"]:
                    rec["started"].append(tag)
                    if len(rec["started"]) == rec["fail_at"]:
                        raise Interrupted(f"interrupted at run {tag}")
                rec["chunks"].append(tag)
                return f(*a)

            yield g

    monkeypatch.setattr(aa, "_runs", runs)
    return rec


def _run(tmp, rec, **kw):
    rec["chunks"].clear()
    rec["started"].clear()
    x, y = images()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoAttackWarning)
        return run_autoattack(make_pool(), x, y, **{**KW, **kw})


def _same(a, b):
    for f in FIELDS:
        assert getattr(a, f).dtype == getattr(b, f).dtype, f
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    strip = [[s._replace(seconds=0.0, robust_accuracy=s.robust_accuracy.tolist()) for s in r.log] for r in (a, b)]
    assert strip[0] == strip[1]
    assert a.names == b.names and a.warnings == b.warnings


@pytest.mark.parametrize("fail_at", [3, 6])
def test_interrupted_run_resumes_bit_for_bit_and_reruns_no_completed_run(counted, tmp_path, fail_at):
    ref = _run(tmp_path, counted, out=tmp_path / "ref.json")
    runs_all, chunks_all = list(counted["started"]), len(counted["chunks"])
    assert len(runs_all) >= fail_at, runs_all  # the interruption lies inside the cascade
    ck = tmp_path / "ck"
    counted["fail_at"] = fail_at
    with pytest.raises(Interrupted):
        _run(tmp_path, counted, checkpoint_dir=ck)
    done_chunks = sum(1 for t in counted["chunks"] if counted["started"].index(t) < fail_at - 1)
    assert (ck / "fingerprint.json").is_file() and (ck / "call_0.npz").is_file()
    counted["fail_at"] = None
    res = _run(tmp_path, counted, checkpoint_dir=ck, out=tmp_path / "res.json")
    _same(res, ref)
    # only the runs not completed before the interruption ran again, each on the same chunks
    assert len(counted["started"]) == len(runs_all) - (fail_at - 1)
    assert len(counted["chunks"]) == chunks_all - done_chunks
    a, b = load_autoattack(tmp_path / "ref.json"), load_autoattack(tmp_path / "res.json")
    for f in ("robust", "clean", "queries", "x_adv", "ids", "y"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    # a finished checkpoint: a rerun restores everything and attacks nothing
    again = _run(tmp_path, counted, checkpoint_dir=ck)
    _same(again, ref)
    assert counted["chunks"] == []


def test_other_settings_are_refused_naming_them_and_overwrite_discards(counted, tmp_path):
    ck = tmp_path / "ck"
    counted["fail_at"] = 3
    with pytest.raises(Interrupted):
        _run(tmp_path, counted, checkpoint_dir=ck)
    counted["fail_at"] = None
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    with pytest.raises(ValueError, match=r"eps=0\.05.*this run has .*eps=0\.07") as e:
        _run(tmp_path, counted, checkpoint_dir=ck, eps=0.07)
    msg = str(e.value)
    assert "\n" not in msg and "--overwrite" in msg and "n_iter" not in msg
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before  # the refused run wrote nothing
    # --overwrite: the old state is discarded, the new eps runs every run from the start
    fresh = _run(tmp_path, counted, eps=0.07)
    n_runs = len(counted["started"])
    res = _run(tmp_path, counted, checkpoint_dir=ck, eps=0.07, overwrite=True)
    _same(res, fresh)
    assert len(counted["started"]) == n_runs


def test_cli_checkpoint_resumes_and_refuses_another_eps(counted, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    x, y = images(12)
    np.savez(tmp_path / "mine.npz", x=x, y=y, ids=np.arange(12))
    argv = ["autoattack", "--model", "_aa_tiny:make_linear_pool", "--images", "mine.npz", "--norm", "linf"]
    argv += ["--batch-size", "8", "--no-progress", "--n-iter", "4", "--fab-iter", "3", "--square-queries", "8"]
    argv += ["--checkpoint", "ck"]
    counted["fail_at"] = 4
    with pytest.raises(Interrupted):
        main([*argv, "--eps", str(EPS), "--out", "a.json"])
    counted["fail_at"] = None
    assert counted["started"][-1][1:] == ("apgd-t", 2)
    counted["started"].clear()
    assert main([*argv, "--eps", "0.07", "--out", "b.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sarjax autoattack: error: ") and "eps=0.07" in err and "\n" not in err
    assert counted["started"] == []  # the refused run attacked nothing
    assert main([*argv, "--eps", str(EPS), "--out", "a.json"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert counted["started"][0][1:] == ("apgd-t", 2)  # the first run not completed
    assert main([*argv, "--eps", "0.07", "--out", "b.json", "--overwrite"]) == 0
    capsys.readouterr()
    # --overwrite also replaces the outputs of other settings, and needs no --checkpoint; without it
    # another eps into b.json is refused before the checkpoint is looked at
    assert main([*argv, "--eps", str(EPS), "--out", "b.json"]) == 2
    assert f"b.json was written with eps=0.07, this run has eps={EPS}" in capsys.readouterr().err


STOP = """
import os, sys
import sarjax.attacks.autoattack as aa
from sarjax.cli import main

real, started, fail_at = aa._runs, [], int(os.environ.get("AA_FAIL_AT", "0"))

def runs(name, ctx, skey):
    stage = object()
    for i, f in enumerate(real(name, ctx, skey)):
        def g(*a, f=f, tag=(stage, i)):
            if tag not in started:
                started.append(tag)
                if len(started) == fail_at:
                    raise RuntimeError("interrupted")
            return f(*a)
        yield g

aa._runs = runs
try:
    rc = main(sys.argv[1:])
except RuntimeError as e:  # this process's stand-in crash, or the other process's, reported here
    print("STOPPED", e)
    rc = 0
print("RUNS", len(started))
sys.exit(rc)
"""


def test_two_processes_interrupted_and_resumed_give_the_one_process_run(tmp_path):
    here = Path(__file__).parent
    x, y = images(16, seed=2)
    np.savez(tmp_path / "mine.npz", x=x, y=y, ids=np.arange(100, 116))
    (tmp_path / "stop.py").write_text(STOP)
    common = [sys.executable, str(tmp_path / "stop.py"), "autoattack", "--model", "_aa_tiny:make_linear_pool"]
    common += ["--images", str(tmp_path / "mine.npz"), "--norm", "linf", "--eps", str(EPS), "--batch-size", "4"]
    common += ["--n-iter", str(BUDGET["n_iter"]), "--fab-iter", str(BUDGET["fab_iter"]), "--seed", "3"]
    common += ["--square-queries", str(BUDGET["square_queries"]), "--no-progress"]
    path = os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": path}
    two = [*common, "--out", str(tmp_path / "two.json"), "--checkpoint", str(tmp_path / "ck")]
    port = free_port()
    cmds = [([*common, "--out", str(tmp_path / "one.json")], env)]
    cmds += [([*two, *coordinator_args(port, 2, i)], {**env, "AA_FAIL_AT": "3"}) for i in range(2)]
    outs = run_at_once(cmds)
    assert all("STOPPED" in o for o in outs[1:]), outs[1][-2000:]
    assert not (tmp_path / "two.npz").exists()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["process_0_of_2", "process_1_of_2"]
    port = free_port()
    outs = run_at_once([([*two, *coordinator_args(port, 2, i)], env) for i in range(2)])
    assert "resumed from" in outs[0] and "STOPPED" not in outs[0] + outs[1]
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    for k in a.files:
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)


def _positions(path, prev):
    """Writes AutoAttack states at run ``prev`` then the next run (``keep_prev``: the first becomes ``.prev``)."""
    for run_ in (prev, prev + 1):
        run_state.save_state(
            path, {"robust": np.full(3, run_)}, {"next_stage": 1, "next_run": run_, "batch": 8}, fmt=FMT, keep_prev=True
        )


@pytest.mark.parametrize(
    "other, expect",
    [
        ((1, 5), 5),  # the other process at the same run: this one's latest state
        ((1, 4), 4),  # the other one a run behind: this one's previous state (.prev)
        ((1, 3), None),  # two runs behind: no common state, every process starts over
        ((-1, -1), None),  # the other one has no state: start over
    ],
)
def test_distributed_resume_takes_the_earliest_common_state(tmp_path, monkeypatch, other, expect):
    """``run_state.resume_state``'s choice, with the other process's position and flag gathered by stand-ins:
    every process resumes at the earliest of the processes' latest runs, from ``.prev`` when this
    process is one run ahead."""
    path = tmp_path / "state.npz"
    _positions(path, 4)  # latest at run 5, .prev at run 4
    assert run_state.load_state(path.with_name(path.name + ".prev"), fmt=FMT)[1]["next_run"] == 4

    def gather(arrays):
        return {"pos": np.concatenate([arrays["pos"], np.asarray([other], np.int64)])}

    monkeypatch.setattr(run_state, "allgather_rows", gather)
    # the other process's answer: it holds a state at the target run unless it has none at all
    monkeypatch.setattr(run_state, "all_ok", lambda ok: bool(ok) and other != (-1, -1))
    got = run_state.resume_state(path, fmt=FMT, want={"batch": 8}, position=POS, share=object())
    if expect is None:
        assert got is None
    else:
        arrays, info = got
        assert info["next_run"] == expect and (arrays["robust"] == expect).all()
    with pytest.raises(ValueError, match="written with batch=8, this run has batch=4"):
        run_state.resume_state(path, fmt=FMT, want={"batch": 4}, position=POS, share=object())


def test_a_state_of_another_format_is_refused(tmp_path):
    path = tmp_path / "state.npz"
    run_state.save_state(path, {"a": np.zeros(2)}, {"next_stage": 0, "next_run": 0}, fmt="other/1")
    with pytest.raises(ValueError, match="is not a sarjax-autoattack-state/1 state file, got format 'other/1'"):
        run_state.load_state(path, fmt=FMT)


def test_states_are_written_compressed(tmp_path):
    path = tmp_path / "state.npz"
    run_state.save_state(
        path, {"x_adv": np.zeros((64, 28, 28, 1), np.float32)}, {"next_stage": 0, "next_run": 0}, fmt=FMT
    )
    assert path.stat().st_size < 64 * 28 * 28 * 4 / 20  # zeros compress; np.savez would store 200 kB
    assert run_state.load_state(path, fmt=FMT)[0]["x_adv"].shape == (64, 28, 28, 1)
