"""benchmarks/autoattack_cold.py's own logic (issue 43, item 2): reading a child's result, the
medians, ratios and agreement, and the refusal to overwrite. Torch-free and pyautoattack-free:
the children are not started."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "autoattack_cold.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("autoattack_cold_under_test", PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _line(bench, **kw):
    out = {"side": "sarjax", "samples": 4, "attack_seconds": 2.5, "robust": [True, False, True, True]}
    out["robust_accuracy"] = 0.75
    out.update(kw)
    return bench.MARK + json.dumps(out)


def test_parse_child_reads_the_one_result_line(bench):
    text = "model loaded\n" + _line(bench) + "\nbye\n"
    got = bench.parse_child(text, side="sarjax", samples=4)
    assert got["robust"] == [True, False, True, True] and got["attack_seconds"] == 2.5


@pytest.mark.parametrize(
    "text, match",
    [
        ("no result here\n", "expected one"),
        ("{A}\n{A}\n", "expected one"),
        ("MARK{not json\n", "not JSON"),
        ("MARK[1, 2]\n", "JSON object"),
        ("MARK{}\n", "lacks"),
    ],
)
def test_parse_child_refuses_a_missing_doubled_or_broken_line(bench, text, match):
    text = text.replace("{A}", _line(bench)).replace("MARK", bench.MARK)
    with pytest.raises(ValueError, match=match):
        bench.parse_child(text, side="sarjax", samples=4)


@pytest.mark.parametrize(
    "kw, side, samples, match",
    [
        ({}, "reference", 4, "asked for side"),
        ({}, "sarjax", 5, "asked for side"),
        ({"robust": [True, False, 1, True]}, "sarjax", 4, "list of 4 bools"),
        ({"robust": [True, False, True]}, "sarjax", 4, "list of 4 bools"),
        ({"robust_accuracy": 0.5}, "sarjax", 4, "does not match"),
        ({"attack_seconds": 0}, "sarjax", 4, "attack_seconds"),
    ],
)
def test_parse_child_refuses_what_was_not_asked(bench, kw, side, samples, match):
    with pytest.raises(ValueError, match=match):
        bench.parse_child(_line(bench, **kw), side=side, samples=samples)


def _run(side, secs, proc, robust, threads=None):
    return {"side": side, "threads": threads, "attack_seconds": secs, "process_seconds": proc, "robust": robust}


def test_summarize_medians_ratio_baseline_and_agreement(bench):
    s = [True, True, False, False]
    r = [True, False, False, True]
    runs = [
        _run("sarjax", 10.0, 14.0, s),
        _run("reference", 40.0, 41.0, r, 1),
        _run("reference", 30.0, 31.0, r, 2),
        _run("sarjax", 12.0, 16.0, s),
        _run("reference", 44.0, 45.0, r, 1),
        _run("reference", 34.0, 35.0, r, 2),
        _run("sarjax", 100.0, 104.0, s),  # an outlier: the median ignores it
        _run("reference", 42.0, 43.0, r, 1),
        _run("reference", 32.0, 33.0, r, 2),
    ]
    row = bench.summarize(runs, 4, [1, 2])
    assert row["median_attack_seconds"] == {"sarjax": 12.0, "reference_1t": 42.0, "reference_2t": 32.0}
    assert row["baseline"] == "reference_2t"  # the faster thread count
    assert row["ratio_attack"] == pytest.approx(32.0 / 12.0)
    assert row["ratio_process"] == pytest.approx(33.0 / 16.0)
    assert row["robust_accuracy"] == {"sarjax": 0.5, "reference": 0.5}
    assert row["agreement"] == 0.5
    assert row["robust_only_sarjax"] == [1] and row["robust_only_reference"] == [3]
    assert row["deterministic"] == {"sarjax": True, "reference": True}
    runs[3] = _run("sarjax", 12.0, 16.0, [True, True, True, False])
    assert bench.summarize(runs, 4, [1, 2])["deterministic"]["sarjax"] is False


def test_summarize_refuses_missing_or_unknown_contenders(bench):
    runs = [_run("sarjax", 1.0, 2.0, [True]), _run("reference", 1.0, 2.0, [True], 1)]
    with pytest.raises(ValueError, match="no runs of"):
        bench.summarize(runs, 1, [1, 2])
    with pytest.raises(ValueError, match="unknown contender"):
        bench.summarize([*runs, _run("reference", 1.0, 2.0, [True], 4)], 1, [1])
    with pytest.raises(ValueError, match="robust flags"):
        bench.summarize([_run("sarjax", 1.0, 2.0, [True, False]), runs[1]], 1, [1])


def test_an_existing_output_is_refused_before_any_work(bench, tmp_path):
    out = tmp_path / "autoattack_cold.json"
    out.write_text("{}")
    with pytest.raises(FileExistsError, match="never overwrites"):
        bench.check_out(out)
    with pytest.raises(FileExistsError):  # main refuses it before training or starting a child
        bench.main(["--samples", "2", "--repeats", "1", "--out", str(out)])
    assert out.read_text() == "{}"
    bench.check_out(tmp_path / "new.json")  # a new path passes
