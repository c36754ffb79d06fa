"""The LLM settings objects are checked when built: a bad value raises naming the field and the value
(SamplingConfig, WordLevelOptions in tests/models/test_word_level_tokenizer.py, LLMSARSettings,
PoolLLMSARSettings, LLMAttackSpec, LLMSARAttack), and the pipelines refuse a settings object of
another type."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sarjax.models.llm.generate import SamplingConfig, sample_token, stack_sample_generate
from sarjax.sar import (
    LLMAttackSpec,
    LLMSARAttack,
    LLMSARSettings,
    PoolLLMSARSettings,
    make_llm_oracles,
    pool_llm_sar,
    run_llm_sar,
)


def _attack(params, batch, ref, *, key, mask, **kw):
    raise AssertionError("never called")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -1.0}, r"SamplingConfig.temperature: .* got -1.0"),
        ({"temperature": float("nan")}, r"SamplingConfig.temperature: .* got nan"),
        ({"top_k": -2}, r"SamplingConfig.top_k: .* got -2"),
        ({"top_k": 1.5}, r"SamplingConfig.top_k: .* got 1.5"),
        ({"top_k": True}, r"SamplingConfig.top_k: .* got True"),
        ({"top_p": 0.0}, r"SamplingConfig.top_p: .* got 0.0"),
        ({"top_p": 1.2}, r"SamplingConfig.top_p: .* got 1.2"),
        ({"eos_id": []}, r"SamplingConfig.eos_id: .* got \[\]"),
        ({"eos_id": -3}, r"SamplingConfig.eos_id: .* got -3"),
        ({"eos_id": [2, 1.5]}, r"SamplingConfig.eos_id: .* got \[2, 1.5\]"),
        ({"eos_id": True}, r"SamplingConfig.eos_id: .* got True"),
        ({"pad_id": True}, r"SamplingConfig.pad_id: expected an int, got True"),
        ({"pad_id": 0.5}, r"SamplingConfig.pad_id: .* got 0.5"),
    ],
)
def test_sampling_config_refuses_bad_values_when_built(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_sampling_config_types_traced_fields_and_defaults():
    with pytest.raises(TypeError, match=r"SamplingConfig.temperature: expected a number, got 'hot'"):
        SamplingConfig(temperature="hot")  # type: ignore[arg-type]
    assert SamplingConfig() == (1.0, 0, 1.0, None, 0)
    assert SamplingConfig(eos_id=[7, 11], pad_id=np.int32(3)).eos_id == [7, 11]
    assert SamplingConfig(pad_id=-1).pad_id == -1  # a filler, never read by the model (some configs use -1)

    # traced fields are not checked on the host (one compile for every setting), and a draw
    # through the config equals the draw with the same scalars
    @jax.jit
    def draw(t, k, p, logits):
        c = SamplingConfig(t, k, p)
        return sample_token(jax.random.key(0), logits, c.temperature, c.top_k, c.top_p)

    lg = jnp.asarray([0.1, 2.0, -1.0, 0.5])
    assert int(draw(jnp.float32(0.7), jnp.int32(2), jnp.float32(0.9), lg)) == int(
        sample_token(jax.random.key(0), lg, 0.7, 2, 0.9)
    )
    # array fields (one setting per row under vmap): every element is checked
    rows = SamplingConfig(
        jnp.asarray([0.5, 0.7]), jnp.asarray([1, 2]), jnp.asarray([0.9, 1.0]), None, jnp.zeros(2, int)
    )
    np.testing.assert_allclose(jax.vmap(lambda c: c.temperature * c.top_k)(rows), [0.5, 1.4])
    with pytest.raises(ValueError, match=r"SamplingConfig.top_k: .* got Array\(\[ 1, -1\]"):
        SamplingConfig(top_k=jnp.asarray([1, -1]))
    with pytest.raises(TypeError, match="sampling: expected a SamplingConfig or None, got dict"):
        stack_sample_generate({}, None, np.zeros((1, 2), np.int32), key=jax.random.key(0), sampling={"top_k": 1})


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (LLMSARSettings, {"calls": 0}, r"LLMSARSettings.calls must be an int >= 1, got 0"),
        (LLMSARSettings, {"calls": 1.5}, r"LLMSARSettings.calls must be an int >= 1, got 1.5"),
        (LLMSARSettings, {"calls": True}, r"LLMSARSettings.calls must be an int >= 1, got True"),
        (LLMSARSettings, {"with_asr": 1}, r"LLMSARSettings.with_asr must be a bool, got int 1"),
        (LLMSARSettings, {"progress": "yes"}, r"LLMSARSettings.progress must be a bool, got str 'yes'"),
        (
            LLMSARSettings,
            {"checkpoint_dir": 3},
            r"LLMSARSettings.checkpoint_dir must be None, a str or a path, got int 3",
        ),
        (PoolLLMSARSettings, {"max_new_tokens": 0}, r"PoolLLMSARSettings.max_new_tokens must be an int >= 1, got 0"),
        (PoolLLMSARSettings, {"system": 3}, r"PoolLLMSARSettings.system must be None or a str, got 3"),
        (PoolLLMSARSettings, {"with_asr": None}, r"PoolLLMSARSettings.with_asr must be a bool, got NoneType None"),
        (PoolLLMSARSettings, {"out": 5}, r"PoolLLMSARSettings.out must be None, a str or a path, got int 5"),
        (LLMAttackSpec, {"name": "nope"}, r"LLMAttackSpec.name: attack must be one of 'beast', .* got 'nope'"),
        (LLMAttackSpec, {"options": [1]}, r"LLMAttackSpec.options must be None or a mapping with str keys, got \[1\]"),
        (LLMAttackSpec, {"options": {1: 2}}, r"LLMAttackSpec.options must be None or a mapping .* got \{1: 2\}"),
        (LLMAttackSpec, {"target": ""}, r"LLMAttackSpec.target must be a non-empty str, got ''"),
        (LLMAttackSpec, {"refusal": None}, r"LLMAttackSpec.refusal must be a non-empty str, got None"),
        (LLMAttackSpec, {"seed_fn": 3}, r"LLMAttackSpec.seed_fn must be None or callable, got 3"),
        (LLMAttackSpec, {"seed_tokens": 0}, r"LLMAttackSpec.seed_tokens must be an int >= 1, got 0"),
        (LLMSARAttack, {"fn": _attack, "kwargs": {"key": 1}}, r"LLMSARAttack.kwargs must not hold .* got \['key'\]"),
        (LLMSARAttack, {"fn": _attack, "self_judged": 1}, r"LLMSARAttack.self_judged must be a bool, got 1"),
        (LLMSARAttack, {"fn": _attack, "clean_prompts": (1,)}, r"LLMSARAttack.clean_prompts must be None or an"),
    ],
)
def test_llm_sar_settings_refuse_bad_values_when_built(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_llm_sar_settings_defaults_and_types():
    assert LLMSARSettings() == LLMSARSettings(calls=1, with_asr=False, checkpoint_dir=None, overwrite=False)
    assert PoolLLMSARSettings().max_new_tokens == 32 and PoolLLMSARSettings().with_asr
    spec = LLMAttackSpec()
    assert (spec.name, spec.target, spec.seed_tokens) == ("beast", "Sure, here is", 20)
    with pytest.raises(TypeError, match="LLMSARAttack.fn must be callable, got int"):
        LLMSARAttack(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LLMSARAttack.single must be None or callable"):
        LLMSARAttack(_attack, single="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LLMSARAttack.kwargs must be None or a mapping, got list"):
        LLMSARAttack(_attack, kwargs=[1])  # type: ignore[arg-type]


def test_pipelines_refuse_settings_of_another_type():
    a, key = LLMSARAttack(_attack), jax.random.key(0)
    args = (["r"], lambda i, m: [["x"]], lambda b, g: [False], (0.0,))
    with pytest.raises(TypeError, match="run_llm_sar: settings must be an LLMSARSettings or None, got dict"):
        run_llm_sar(a, *args, key=key, num_members=1, settings={"calls": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="run_llm_sar: attack must be an LLMSARAttack, got function"):
        run_llm_sar(_attack, *args, key=key, num_members=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="make_llm_oracles: key is required"):
        make_llm_oracles(a, *args[:3], key=None, num_members=1)
    with pytest.raises(TypeError, match="pool_llm_sar: attack must be an LLMAttackSpec or a name, got int"):
        pool_llm_sar(None, ["r"], (0.0,), key=key, attack=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pool_llm_sar: settings must be a PoolLLMSARSettings or None, got dict"):
        pool_llm_sar(None, ["r"], (0.0,), key=key, settings={"out": None})  # type: ignore[arg-type]
