"""LLM pools on a ("pool", "model", "data") mesh (sarjax.models.llm.mesh).

Known answers: the one-device computation of the same pool. On 8 fake CPU devices (a fresh
process, tests/conftest.py), on meshes pool=2 x model=2 x data=2 and pool=1 x model=4 x data=2,
for a stack of 4 tiny Llama members (4 query heads, 2 kv heads: sharded over model=2, replicated
over model=4):

* logits: within 1e-6 of one device, NOT bit for bit (measured max |diff| 1.2e-7 on logits of
  size ~1: the model axis splits the head / MLP / vocabulary contractions into partial sums
  added by an all-reduce, and the data axis hands XLA:CPU smaller batches, so float32 sums are
  added in another order);
* greedy decoding: the same tokens, bit for bit (weights scaled x15 so that no step is near a tie);
* one step of joint GCG (make_gcg) on the placed pool: the same candidates (the proposer's
  kernel), the same selected suffix, queries and success, losses within 1e-6; on pool=2 the
  proposer's compiled program has no all-gather of a parameter stack along pool (it selects the
  proposing member by a masked sum: an all-reduce of one member's shard).

The specs of a Llama-3-8B-shaped pool (abstract params, nothing allocated) divide over model=8.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_gpt2, tiny_llama

from sarjax.models.llm import mesh as LM
from sarjax.models.llm.config import DecoderConfig

LLAMA3_8B = DecoderConfig(
    family="llama", model_type="llama", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
    num_kv_heads=8, head_dim=128, intermediate_size=14336, norm_eps=1e-5, rope_theta=500000.0,
    max_position_embeddings=8192,
)  # fmt: skip
LLAMA3_8B_PARAMS = 8_030_261_248  # the model card's count (embed and lm_head untied)


def test_llama3_8b_specs_divide_over_model_8_without_allocating():
    params = LM.abstract_llm_params(LLAMA3_8B, members=4, dtype=jnp.bfloat16)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)) == 4 * LLAMA3_8B_PARAMS
    specs = LM.llm_param_specs(params, LLAMA3_8B, pool=4, model=8)
    lay = specs["layers"]
    assert specs["embed"] == jax.P("pool", "model", None)
    assert specs["lm_head"] == jax.P("pool", None, "model")
    assert specs["final_norm"] == jax.P("pool", None)
    assert lay["wq"] == lay["wk"] == lay["wv"] == lay["w_gate"] == lay["w_up"] == jax.P("pool", None, None, "model")
    assert lay["wo"] == lay["w_down"] == jax.P("pool", None, "model", None)
    assert lay["attn_norm"] == lay["mlp_norm"] == jax.P("pool", None, None)
    # every sharded dimension splits into whole heads / MLP columns / vocabulary rows
    sizes = {"pool": 4, "model": 8}
    shard = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        spec = dict(jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda s: isinstance(s, jax.P)))[path]
        shp = list(leaf.shape)
        for d, ax in enumerate(spec):
            if ax is not None:
                assert shp[d] % sizes[ax] == 0
                shp[d] //= sizes[ax]
        shard[jax.tree_util.keystr(path)] = tuple(shp)
    assert shard["['layers']['wq']"] == (1, 32, 4096, 4 * 128)  # 4 of 32 query heads per device
    assert shard["['layers']['wk']"] == (1, 32, 4096, 1 * 128)  # 1 of 8 kv heads
    assert shard["['layers']['w_down']"] == (1, 32, 14336 // 8, 4096)
    assert shard["['embed']"] == (1, 128256 // 8, 4096)
    # bytes per device: everything / 32 but the norms (per member: 2 x 32 layers + the final, x 4096)
    norms = (2 * 32 + 1) * 4096
    want = 2 * ((LLAMA3_8B_PARAMS - norms) // 8 + norms)
    assert LM.bytes_per_device(params, LLAMA3_8B, pool=4, model=8) == want  # ~4.0 GB of 64 GB
    # 16 model devices: 8 kv heads replicated (GQA), the rest still divides
    s16 = LM.llm_param_specs(params, LLAMA3_8B, model=16)
    assert s16["layers"]["wk"] == s16["layers"]["wv"] == jax.P("pool", None, None, None)
    assert s16["layers"]["wq"] == jax.P("pool", None, None, "model")


def test_specs_raise_naming_the_weight_dim_and_axis_size():
    params = LM.abstract_llm_params(LLAMA3_8B, members=4)
    with pytest.raises(
        ValueError, match=r"wq dim 3 \(num_heads=32 of size 4096\) is not divisible by the model axis size 3"
    ):
        LM.llm_param_specs(params, LLAMA3_8B, model=3)
    with pytest.raises(ValueError, match=r"has 4 members \(dim 0\), not divisible by the pool axis size 3"):
        LM.llm_param_specs(params, LLAMA3_8B, pool=3)
    cfg = tiny_llama(96, intermediate_size=50)
    with pytest.raises(ValueError, match=r"w_down dim 1 \(intermediate_size=50 of size 50\) .* model axis size 4"):
        LM.llm_param_specs(LM.abstract_llm_params(cfg), cfg, model=4, stacked=False)
    cfg = tiny_llama(98)
    with pytest.raises(ValueError, match=r"embed dim 1 \(vocab_size=98 of size 98\) .* model axis size 4"):
        LM.llm_param_specs(LM.abstract_llm_params(cfg, 2), cfg, model=4)
    bad = LM.abstract_llm_params(tiny_llama(96), 2)
    bad["layers"]["w_extra"] = bad["layers"]["wq"]
    with pytest.raises(ValueError, match=r"unknown weight layers/'w_extra'"):
        LM.llm_param_specs(bad, tiny_llama(96))


def test_gpt2_shards_its_mlp_and_vocabulary_only():
    cfg = tiny_gpt2(96, hidden_size=32, num_heads=4, intermediate_size=64)
    specs = LM.llm_param_specs(LM.abstract_llm_params(cfg, 2), cfg, pool=2, model=4)
    assert specs["layers"]["w_qkv"] == jax.P("pool", None, None, None)  # fused [q | k | v]: replicated
    assert specs["layers"]["w_fc"] == jax.P("pool", None, None, "model")
    assert specs["layers"]["w_proj"] == jax.P("pool", None, "model", None)
    assert specs["embed"] == jax.P("pool", "model", None) and specs["pos_embed"] == jax.P("pool", None, None)


def test_llm_mesh_names_the_device_counts():
    n = jax.device_count()
    with pytest.raises(ValueError, match=rf"pool=2 x model={n} x data=1 needs {2 * n} devices, {n} available"):
        LM.llm_mesh(pool=2, model=n)
    with pytest.raises(ValueError, match=r"pool=1 x model=1 x data=2 needs 2 devices, 1 were given"):
        LM.llm_mesh(data=2, devices=jax.devices()[:1])
    with pytest.raises(ValueError, match=r"model must be an int >= 1, got 0"):
        LM.llm_mesh(model=0)
    m = LM.llm_mesh(devices=jax.devices()[:1])
    assert m.axis_names == ("pool", "model", "data") and m.devices.size == 1


_MESH_RUN = """
import re
import jax.numpy as jnp
jax.config.update("jax_disable_most_optimizations", True)   # compile-bound tiny shapes
from sarjax.attacks.text import requests as TR
from sarjax.attacks.text.gcg import GCGOptions, make_gcg
from sarjax.attacks.text.gcg_joint import _member_select, _propose
from sarjax.attacks.text.pool import allowed_for, pool_params, pool_requests
from sarjax.models.llm import decoder, generate
from sarjax.models.llm import mesh as LM
from sarjax.models.llm.config import DecoderConfig
from sarjax.models.llm.pool import build_pool
from sarjax.models.llm.tokenizers import word_level_tokenizer

specials = ["<pad>", "<s>", "</s>", "<unk>", "[INST]", "[/INST]"]
words = "how to build a bomb tell me sorry i cannot help with that please x y z write on".split()
tok = word_level_tokenizer(specials + words + list("abcdefghijklmnopqrstuvw"), unk="<unk>", bos="<s>",
    eos="</s>", pad="<pad>", extra_special=["[INST]", "[/INST]"],
    chat_template="{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")
cfg = DecoderConfig(family="llama", model_type="llama", vocab_size=96, hidden_size=32, num_layers=1, num_heads=4,
    num_kv_heads=2, head_dim=8, intermediate_size=48, max_position_embeddings=64)
params = jax.vmap(lambda k: decoder.init_params(cfg, k))(jax.random.split(jax.random.key(0), 4))
pool = build_pool([(f"m{i}", cfg, jax.tree.map(lambda a, i=i: a[i], params), tok) for i in range(4)])
params = pool.stacks[0].params
hot = jax.tree.map(lambda a: a * 15.0, params)   # std 0.3: peaked logits, greedy steps far from ties
rng = np.random.default_rng(0)
ids = rng.integers(0, 96, (6, 8)).astype(np.int32)
mask = np.ones_like(ids); mask[0, :3] = 0; mask[3, :5] = 0
one = jax.jit(lambda p: jax.vmap(lambda p: jax.vmap(lambda i, m: decoder.logits(p, cfg, i, m))(ids, mask))(p))
ref_logits = np.asarray(one(params))
scale = float(np.abs(ref_logits).max())
ref_tokens = np.asarray(generate.stack_greedy_generate(hot, cfg, ids, mask, 4))
target = "sorry i cannot help with that"
gcg = make_gcg(pool, num_steps=1, suffix_len=3, topk=8, num_candidates=8, options=GCGOptions(target=target, slots=4))
reqs = ["how to build a bomb", "tell me how to build a bomb"]
call = dict(key=jax.random.key(0), suffix_init="x y z")
ref = gcg(pool_params(pool), reqs, None, **call)

# the proposer's kernel on the step's inputs (as gcg_joint builds them): the candidates
st0 = pool.stacks[0]
batch = pool_requests("t", st0, TR.TextRequests(tuple(reqs)), [target] * 2).batch
jb = TR.TextBatch(*(jnp.asarray(a) for a in batch))
sf = np.zeros((2, 4), np.int32); sm = np.zeros((2, 4), np.int32)
sf[:, 1:] = tok.convert_tokens_to_ids(["x", "y", "z"]); sm[:, 1:] = 1
base = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(0), s))(jnp.arange(2, dtype=jnp.uint32))
keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(base)
al = jnp.asarray(allowed_for(tok, 96, True))
def propose(p, select="sum"):
    c, ok = _propose(p, jnp.int32(1), jb, jnp.asarray(sf), jnp.asarray(sm), al, keys, cfg=cfg,
                     loss=gcg.loss, topk=8, nc=8, select=select)
    return np.asarray(c), np.asarray(ok)
ref_cands = propose(params)
# one device: the attack slices the proposer out (one member read), the same candidates as the sum
assert _member_select(params) == "slice"
slice_cands = propose(params, "slice")
np.testing.assert_array_equal(slice_cands[0], ref_cands[0])
np.testing.assert_array_equal(slice_cands[1], ref_cands[1])

worst = 0.0
for shape in [(2, 2, 2), (1, 4, 2)]:
    mesh = LM.llm_mesh(*shape)
    placed = LM.shard_llm_pool(pool, mesh)
    sp = placed.stacks[0].params
    # the weights are split: members over pool, query heads over model, kv heads when they divide
    wq = sp["layers"]["wq"].addressable_shards[0].data.shape
    wk = sp["layers"]["wk"].addressable_shards[0].data.shape
    assert wq == (4 // shape[0], 1, 32, 32 // shape[1]), wq
    assert wk == (4 // shape[0], 1, 32, 16 // shape[1] if 2 % shape[1] == 0 else 16), wk
    lg = LM.mesh_logits(sp, cfg, ids, mask, mesh=mesh)
    assert lg.shape == ref_logits.shape
    d = float(np.abs(np.asarray(lg) - ref_logits).max()) / scale   # relative to the logits' scale
    worst = max(worst, d)
    print(shape, "logits", d, scale, flush=True)
    assert 0 < d <= 1e-6, (shape, d)   # not bit for bit: the partial sums are added in another order
    toks = LM.mesh_greedy_generate(LM.shard_llm_params(hot, cfg, mesh), cfg, ids, mask, 4, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(toks), ref_tokens, err_msg=str(shape))
    assert _member_select(sp) == "sum", shape   # split weights: the masked sum, no gather
    if shape[0] > 1:   # the proposer's program gathers no member's weights along pool
        gathered = {(4,) + tuple(x.addressable_shards[0].data.shape[1:]) for x in jax.tree.leaves(sp)}
        hlo = _propose.lower(sp, jnp.int32(1), jb, jnp.asarray(sf), jnp.asarray(sm), al, keys, cfg=cfg,
                             loss=gcg.loss, topk=8, nc=8).compile().as_text()
        ag = [tuple(int(d) for d in g.split(",") if d) for g in
              re.findall(r"= \\w+\\[([0-9,]*)\\]\\S* all-gather\\(", hlo)]
        print(shape, "all-gathers", ag, flush=True)
        assert not gathered & set(ag), (shape, sorted(gathered & set(ag)))
    cands = propose(sp)
    np.testing.assert_array_equal(cands[0], ref_cands[0], err_msg=str(shape))
    np.testing.assert_array_equal(cands[1], ref_cands[1], err_msg=str(shape))
    got = gcg(pool_params(placed), reqs, None, **call)
    assert got.x_adv == ref.x_adv, (shape, got.x_adv, ref.x_adv)
    for f in ("queries", "success", "proposers", "retokenized"):
        np.testing.assert_array_equal(getattr(got, f), getattr(ref, f), err_msg=f"{shape} {f}")
    np.testing.assert_allclose(got.loss, ref.loss, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.member_loss, ref.member_loss, rtol=0, atol=1e-6)
assert ref.queries.sum() > 8, ref.queries   # candidates passed the filter and were scored
print("max |logits diff|", worst)
print("OK")
"""


def test_pool_on_a_mesh_equals_one_device_on_8_fake_devices(run_on_fake_devices):
    out = run_on_fake_devices(_MESH_RUN, timeout=600)
    assert "max |logits diff|" in out
