"""Import paths: ``--model PKG.MODULE:FUNCTION`` and the builder paths ``save_pool`` records."""

import sys

import numpy as np
import pytest

from sarjax.models.builders import builder_record, import_path, load_model
from sarjax.models.checkpoint import save_pool
from sarjax.models.pool import Pool


def _module(tmp_path, monkeypatch, name, text):
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


def test_import_path_errors_name_the_path(tmp_path, monkeypatch):
    _module(
        tmp_path, monkeypatch, "bmods_a", "X = 1\ndef f():\n    return 2\nclass C:\n    def m(self):\n        pass\n"
    )
    assert import_path("bmods_a:X") == 1 and import_path("bmods_a:f")() == 2
    assert import_path("bmods_a:C.m").__qualname__ == "C.m"
    for bad in ("bmods_a", "bmods_a:", ":f", "bmods_a:f()", "bmods a:f", 3):
        with pytest.raises(ValueError, match="expected an import path PKG.MODULE:FUNCTION"):
            import_path(bad)
    with pytest.raises(ValueError, match=r"cannot import 'no_such_module_xyz' for 'no_such_module_xyz:f'.*PYTHONPATH"):
        import_path("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=r"'bmods_a:g': module 'bmods_a' has no attribute 'g'"):
        import_path("bmods_a:g")


def test_load_model_checks_it_returns_a_pool(tmp_path, monkeypatch):
    _module(
        tmp_path,
        monkeypatch,
        "bmods_b",
        "import jax\nfrom sarjax.models import zoo\nfrom sarjax.models.pool import Pool\n"
        "def good():\n    return Pool.from_members([(zoo.mlp((4,)), zoo.mlp((4,)).init(jax.random.key(0)))])\n"
        "def bad():\n    return 3\n"
        "def boom():\n    raise RuntimeError('no weights')\n"
        "NOT_CALLABLE = 1\n",
    )
    assert load_model("bmods_b:good").num_members == 1
    with pytest.raises(ValueError, match="expected it to return a sarjax.models.Pool, got int"):
        load_model("bmods_b:bad")
    with pytest.raises(ValueError, match="calling it raised RuntimeError: no weights"):
        load_model("bmods_b:boom")
    with pytest.raises(ValueError, match="int is not callable"):
        load_model("bmods_b:NOT_CALLABLE")


def _apply(p, x):
    return x.reshape(x.shape[0], -1) @ p["w"]


def test_save_pool_records_and_checks_builder_paths(tmp_path):
    params = {"w": np.ones((4, 3), np.float32)}
    pool = Pool.from_functions([(_apply, params)], ["f0"], input_shape=(2, 2, 1))
    # a module-level apply is found by itself; a local function is not (a warning says how to record one)
    assert builder_record(pool.stacks[0]) == {"path": f"{__name__}:_apply", "call": False}

    def local(p, x):
        return _apply(p, x)

    local_pool = Pool.from_functions([(local, params)], ["g0"], input_shape=(2, 2, 1))
    assert builder_record(local_pool.stacks[0]) is None
    with pytest.warns(UserWarning, match=r"no importable builder for stack\(s\) \['local \(function\)'\]"):
        save_pool(local_pool, tmp_path / "p0")
    with pytest.raises(ValueError, match=r"builders name stacks \['nope'\] that the pool lacks"):
        save_pool(pool, tmp_path / "p1", builders={"nope": "x:y"})
    with pytest.raises(ValueError, match="cannot import 'no_such_module_xyz'"):
        save_pool(local_pool, tmp_path / "p2", builders={"local": "no_such_module_xyz:f"})
