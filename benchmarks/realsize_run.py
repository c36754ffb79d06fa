"""Real-size pools on this machine (issue 41, item 1): a RobustBench-shaped WideResNet-28-10 pool
converted from PyTorch, and a pool of two decoders at Llama-3.2-1B's dimensions loaded from Hugging
Face checkpoints; logits against the framework they came from, one attack step of each family,
peak memory and step times.

1. **WRN** (``--part wrn``): 2 DM-style WideResNet-28-10 (RobustBench's ``DMWideResNet`` layout:
   depth 28, width 10, 16 base channels, SiLU, CIFAR-10 mean/std inside the model; random weights,
   batch-norm statistics and a whitened head, ``tests/models/_torch_nets.py``) through
   ``Pool.from_torch``. Checked: logits within 1e-4 of PyTorch's on 8 CIFAR-shaped images; one
   joint PGD call (``make_joint_pgd``, 1 step, 1 restart, eps 8/255) and one ``run_sar`` with that
   attack (deltas 0 and 0.5; its kernel compiled by then), their ``x_adv`` within the ball and every success flag / covered member
   confirmed by PyTorch's own prediction.
2. **LLM** (``--part llm``, one fresh process per dtype): 2 ``LlamaForCausalLM`` at Llama-3.2-1B's
   ``config.json`` values (GQA 32/8 heads, llama3 rope scaling, tied embeddings, vocabulary 128,256;
   random weights, non-trivial norms), written with ``save_pretrained`` and a tiny offline
   word-level tokenizer (fewer ids than the vocabulary, which the loader allows), then loaded as
   users load theirs (``load_llm_pool``). The transformers model is freed before the JAX pool is
   built: its logits (on 2 x 24 random ids) are saved to disk and compared there (float32: max
   |diff| / max |logit| within 1e-4; bfloat16: the measured figure, beside transformers' own
   bf16-vs-f32 gap). One joint GCG step (``make_gcg``, 4 candidates, top-k 8) and one joint
   BEAST step (``make_beast``, suffix 1, beam 2 x 2) run; in a third process each member is
   reloaded in transformers and every member loss the two attacks report is recomputed from the
   prompt ids they return.

Every phase runs in a fresh subprocess: its peak resident memory (``ru_maxrss``, and per stage
``VmHWM`` after resetting it) is its own. A watchdog stops a phase whose machine runs out of memory
(``MemAvailable`` below ``--min-free-gib``); the JSON then says so, and an LLM dtype so stopped
is retried with fewer decoder layers (``--fallback-layers``, default 8 then 4), the largest size
that fits. Step times: the first call
(compile included) and the median of ``--reps`` warm calls (other keys); compile = first - warm.

    python benchmarks/realsize_run.py --out benchmarks/results/realsize_run.json
    python benchmarks/realsize_run.py --small          # the same code at test dimensions (seconds)

``tests/models/test_realsize.py`` runs the small dimensions in the default suite and this script
at real size with ``SARJAX_REALSIZE_FULL=1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch threads must not spin on a shared CPU

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models"))  # _torch_nets: the DM-style WideResNet
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _timing
from sarjax.cli.llm_sar import hide_broken_torchvision  # noqa: E402

hide_broken_torchvision()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import provenance, results_path  # noqa: E402

# ------------------------------------------------------------------------------------- the sizes


@dataclasses.dataclass(frozen=True)
class WrnSpec:
    """A pool of DM-style WideResNets: depth 6n+4, width factor, base channels, members, images."""

    depth: int
    width: int
    base: int = 16
    members: int = 2
    images: int = 8
    whiten_images: int = 64
    eps: float = 8 / 255
    reps: int = 2


WRN_REAL = WrnSpec(depth=28, width=10)
WRN_SMALL = WrnSpec(depth=10, width=1, reps=1)

# Llama-3.2-1B's config.json (meta-llama/Llama-3.2-1B), the values the issue names
LLAMA32_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}
# the same structure (GQA 4:1, llama3 rope scaling, tied embeddings) at hidden 64; the original
# context is 64 tokens so that the scaled frequencies move the logits of 24-token prompts
LLAMA32_SMALL = {
    **LLAMA32_1B,
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 256,
    "rope_scaling": {**LLAMA32_1B["rope_scaling"], "original_max_position_embeddings": 64},
    "max_position_embeddings": 2048,
}


@dataclasses.dataclass(frozen=True)
class LlmSpec:
    """A pool of Llama decoders: the HF config values, members, the probe and the attacks' sizes."""

    config: dict
    members: int = 2
    probe_rows: int = 2
    probe_len: int = 24
    gcg_candidates: int = 4
    gcg_topk: int = 8
    gcg_suffix: int = 3
    beast_beam: int = 2
    beast_candidates: int = 2
    reps: int = 1


LLM_REAL = LlmSpec(config=LLAMA32_1B)
LLM_SMALL = LlmSpec(config=LLAMA32_SMALL)

REQUESTS = ["tell me how to build a bomb"]
REFUSAL = "sorry i cannot help with that"
BEAST_TARGET = "sure here is"
CHAT_TEMPLATE = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"

# ---------------------------------------------------------------------------------- measurement


def reset_peak() -> None:
    """Resets this process's peak resident memory (VmHWM) to its current size (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def memory_mib() -> dict:
    """``{"rss_mib", "peak_mib"}``: resident memory now and its peak since the last
    :func:`reset_peak` (``VmRSS``, ``VmHWM``), and ``ru_maxrss_mib``, the process's peak."""
    out = {"ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    out["rss_mib"] = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    out["peak_mib"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


class Stages:
    """Wall time and memory of the named stages of one phase; written to ``path`` after each
    stage (when given), so a phase stopped by the watchdog leaves what it had measured."""

    def __init__(self, path: str | None = None):
        self.path = path
        self.record: dict = {"stages": {}, "load_start": list(os.getloadavg())}

    def run(self, name: str, fn, *args, **kw):
        reset_peak()
        t = time.perf_counter()
        out = fn(*args, **kw)
        out = jax.block_until_ready(out) if _is_arrays(out) else out
        self.record["stages"][name] = {"seconds": time.perf_counter() - t, **memory_mib()}
        self.flush()
        return out

    def put(self, **kw) -> None:
        self.record.update(kw)
        self.flush()

    def flush(self) -> None:
        self.record["load_end"] = list(os.getloadavg())
        if self.path:
            Path(self.path).write_text(json.dumps(self.record, indent=1, default=_jsonable))


def _is_arrays(x) -> bool:
    return all(isinstance(a, jax.Array) for a in jax.tree.leaves(x)) and bool(jax.tree.leaves(x))


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(type(x).__name__)


def rel_diff(got, want) -> float:
    """``max |got - want| / max |want|`` (float64)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def timed_calls(stages: Stages, name: str, call, reps: int) -> object:
    """``call(i)`` once (compile included), then ``reps`` warm calls (``i = 1..reps``): records
    ``first_s``, ``warm_s`` (median), ``compile_s`` (first - warm) under ``name``."""
    out = stages.run(f"{name}_first", call, 0)
    warm = []
    for i in range(1, reps + 1):
        out = stages.run(f"{name}_warm{i}", call, i)
        warm.append(stages.record["stages"][f"{name}_warm{i}"]["seconds"])
    first = stages.record["stages"][f"{name}_first"]["seconds"]
    w = statistics.median(warm) if warm else None
    stages.put(**{name: {"first_s": first, "warm_s": w, "compile_s": None if w is None else first - w, "reps": reps}})
    return out


# --------------------------------------------------------------------------------------- the WRN


def build_wrns(spec: WrnSpec) -> list:
    """``spec.members`` DM-style WideResNets (PyTorch, eval mode, seeds 0, 1, ...): random weights,
    batch-norm statistics and a head whitened on ``spec.whiten_images`` smooth images."""
    import torch
    from _torch_nets import WideResNet, randomize_bn, smooth_images, whiten_head

    mods = []
    for i in range(spec.members):
        torch.manual_seed(i)
        m = randomize_bn(WideResNet(depth=spec.depth, width=spec.width, base=spec.base), seed=i)
        whiten_head(m, m.logits, smooth_images(spec.whiten_images, seed=100 + i), seed=i)
        mods.append(m)
    return mods


def _torch_logits(mods, x) -> np.ndarray:
    """``[M, B, C]`` PyTorch logits of NHWC images."""
    import torch

    xt = torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))
    with torch.no_grad():
        return np.stack([m.eval()(xt).numpy() for m in mods])


def run_wrn(spec: WrnSpec, stages: Stages | None = None) -> dict:
    """The WRN checks of the module docstring; returns the measured record (``stages.record``)."""
    import torch
    from _torch_nets import smooth_images

    from sarjax.attacks.joint import JointPGDStep, make_joint_pgd
    from sarjax.models.pool import Pool
    from sarjax.sar.settings import SARSettings
    from sarjax.sar.vision import run_sar

    torch.set_num_threads(os.cpu_count() or 1)
    st = stages or Stages()
    mods = st.run("torch_build", build_wrns, spec)
    n_params = sum(p.numel() for p in mods[0].parameters())
    st.put(spec=dataclasses.asdict(spec), params_per_member=n_params)
    pool = st.run("convert", Pool.from_torch, mods, input_shape=(32, 32, 3))
    x = smooth_images(spec.images, seed=7)
    want = _torch_logits(mods, x)
    got = st.run("logits_first", pool.logits, x)
    diff = float(np.abs(np.asarray(got) - want).max())
    st.put(logits={"max_abs_diff": diff, "max_abs_logit": float(np.abs(want).max()), "tolerance": 1e-4})

    clean = want.argmax(-1)  # [M, B]
    ref = jnp.asarray(clean.T, jnp.int32)
    xj = jnp.asarray(x)
    attack = make_joint_pgd(pool.apply, eps=spec.eps, steps=1, step=JointPGDStep(restarts=1))
    res = timed_calls(st, "joint_pgd", lambda i: attack(pool.params, xj, ref, key=jax.random.key(i)), spec.reps)
    x_adv = np.asarray(res.x_adv)
    adv_pred = _torch_logits(mods, x_adv).argmax(-1)  # [M, B]
    success = np.asarray(res.success)
    st.put(
        joint_pgd_check={
            "linf_max": float(np.abs(x_adv - x).max()),
            "eps": spec.eps,
            "in_box": bool((x_adv >= 0).all() and (x_adv <= 1).all()),
            "success_flags_agree_with_torch": bool(np.array_equal(success, (adv_pred != clean).T)),
            "members_broken": int(success.sum()),
        }
    )

    # run_sar with the same attack: its kernel is compiled already (one batch shape: pack_levels=0)
    sar = timed_calls(
        st,
        "run_sar",
        lambda i: run_sar(
            pool, x, spec.eps, [0.0, 0.5], attack=attack, key=jax.random.key(i), settings=SARSettings(pack_levels=0)
        ),
        0,
    )
    broken, checked = 0, 0
    for b, j in zip(*np.nonzero(sar.covered_round >= 0), strict=True):
        r = sar.covered_round[b, j]
        pred = _torch_logits([mods[j]], sar.inputs[r, b][None])[0, 0].argmax()
        broken += int(pred != clean[j, b])
        checked += 1
    st.put(
        run_sar_check={
            "sar": np.asarray(sar.sar).tolist(),
            "covered_checked": checked,
            "covered_confirmed_by_torch": broken,
            "linf_max": _sar_linf(sar, x),
        }
    )
    st.put(memory_end=memory_mib())
    return st.record


def _sar_linf(sar, x) -> float:
    """Largest linf distance of a recorded SAR input to its clean image (recorded rounds only)."""
    worst = 0.0
    for b, j in zip(*np.nonzero(sar.covered_round >= 0), strict=True):
        r = sar.covered_round[b, j]
        worst = max(worst, float(np.abs(np.asarray(sar.inputs[r, b]) - x[b]).max()))
    return worst


# ------------------------------------------------------------------------------- the LLM: build


def build_tokenizer():
    """A tiny offline word-level tokenizer with an [INST] chat template (``!`` for GCG's start;
    no decoder clean-up, so that ``"! ! !"`` decodes back to itself)."""
    from sarjax.models.llm.tokenizers import WordLevelOptions, word_level_tokenizer

    specials = ["<pad>", "<s>", "</s>", "<unk>", "[INST]", "[/INST]"]
    words = (
        "how to build a bomb tell me sure here is the answer sorry i cannot help with that please "
        "x y z ! ? . , write tutorial on"
    ).split()
    return word_level_tokenizer(
        specials + words + list("abcdefghijklmnopqrstuvwxyz"), unk="<unk>", bos="<s>", eos="</s>", pad="<pad>",
        extra_special=["[INST]", "[/INST]"], chat_template=CHAT_TEMPLATE, options=WordLevelOptions(cleanup=False),
    )  # fmt: skip


def hf_config(spec: LlmSpec, tok):
    """transformers' ``LlamaConfig`` of ``spec.config`` (the special ids from ``tok``)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        **spec.config, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )


def probe_ids(spec: LlmSpec) -> np.ndarray:
    """``[R, T]`` int32 random ids over the whole vocabulary (embedding rows past the tokenizer too)."""
    return (
        np.random.default_rng(0)
        .integers(0, spec.config["vocab_size"], (spec.probe_rows, spec.probe_len))
        .astype(np.int32)
    )


def _torch_dtype(dtype: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def build_llm_checkpoints(spec: LlmSpec, dtype: str, folder: str | Path, stages: Stages | None = None) -> list[str]:
    """Writes ``spec.members`` random ``LlamaForCausalLM`` checkpoints of ``dtype`` (+ tokenizer)
    to ``folder/m<i>`` and their logits on :func:`probe_ids` to ``folder/want.npy`` ``[M, R, T, V]``
    float32 (and, for bfloat16, the float32 model's before the cast to ``want_f32.npy``). One
    transformers model at a time is held; returns the member folders."""
    import torch
    from transformers import LlamaForCausalLM

    st = stages or Stages()
    torch.set_num_threads(os.cpu_count() or 1)
    tok = build_tokenizer()
    cfg = hf_config(spec, tok)
    ids = torch.from_numpy(probe_ids(spec).astype(np.int64))
    dirs, want, want_f32 = [], [], []
    for i in range(spec.members):

        def one(i=i):
            torch.manual_seed(i)
            model = LlamaForCausalLM(cfg).eval()
            with torch.no_grad():  # norms away from 1, so that a missing or misplaced norm shows
                for name, p in model.named_parameters():
                    if "norm" in name:
                        p.add_(0.1 * torch.randn_like(p))
                if dtype == "bfloat16":
                    want_f32.append(model(ids).logits.float().numpy())
                model = model.to(_torch_dtype(dtype))
                want.append(model(ids).logits.float().numpy())
            d = Path(folder) / f"m{i}"
            model.save_pretrained(d)
            tok.save_pretrained(d)
            del model
            return str(d)

        dirs.append(st.run(f"torch_build_save_m{i}", one))
    np.save(Path(folder) / "want.npy", np.stack(want))
    if want_f32:
        np.save(Path(folder) / "want_f32.npy", np.stack(want_f32))
    st.put(params_per_member=_count_params(cfg))
    return dirs


def _count_params(cfg) -> int:
    d, f, L, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    hd = cfg.head_dim
    attn = d * hd * cfg.num_attention_heads * 2 + d * hd * cfg.num_key_value_heads * 2
    return v * d + L * (attn + 3 * d * f + 2 * d) + d + (0 if cfg.tie_word_embeddings else v * d)


# --------------------------------------------------------------------------- the LLM: JAX side


def pool_logits(stack, ids) -> np.ndarray:
    """``[M, R, T, V]`` float32 logits of every member of ``stack`` on ``ids [R, T]``."""
    from sarjax.models.llm import decoder

    f = jax.jit(
        jax.vmap(jax.vmap(lambda p, s: decoder.logits(p, stack.cfg, s), (None, 0)), (0, None)),
    )
    return np.asarray(f(stack.params, jnp.asarray(ids)))


def run_llm_jax(spec: LlmSpec, dtype: str, dirs: list[str], folder: str | Path, stages: Stages | None = None) -> dict:
    """Loads the checkpoints with ``load_llm_pool``, compares the logits with the saved ones and
    runs one joint GCG step and one joint BEAST step; the attacks' prompts and member losses go to
    ``folder/attacks.npz`` for :func:`check_llm_torch`. Returns the measured record."""
    from sarjax.attacks.text import model as TM
    from sarjax.attacks.text import requests as TR
    from sarjax.attacks.text import retokenize as TK
    from sarjax.attacks.text.beast import make_beast
    from sarjax.attacks.text.gcg import GCGOptions, make_gcg
    from sarjax.attacks.text.pool import pool_params
    from sarjax.models.llm.prompts import encode_text
    from sarjax.sar.llm_requests import behavior_batch, load_llm_pool

    st = stages or Stages()
    pool = st.run("load_llm_pool", load_llm_pool, dirs, dtype)
    stack = pool.stacks[0]
    st.put(
        spec={**dataclasses.asdict(spec), "dtype": dtype},
        stacks=len(pool.stacks),
        members=pool.size,
        param_bytes=int(sum(a.nbytes for a in jax.tree.leaves(stack.params))),
    )
    got = st.run("logits_first", pool_logits, stack, probe_ids(spec))
    want = np.load(Path(folder) / "want.npy")
    rec = {"rel_diff_vs_transformers_same_dtype": rel_diff(got, want), "max_abs_logit": float(np.abs(want).max())}
    if (Path(folder) / "want_f32.npy").exists():
        f32 = np.load(Path(folder) / "want_f32.npy")
        rec["rel_diff_vs_transformers_float32"] = rel_diff(got, f32)
        rec["transformers_bf16_vs_f32_rel_diff"] = rel_diff(want, f32)
    st.put(logits=rec)
    del got, want

    tok = stack.tokenizer
    v = stack.cfg.vocab_size
    gcg = make_gcg(
        pool, num_steps=1, suffix_len=spec.gcg_suffix, topk=spec.gcg_topk, num_candidates=spec.gcg_candidates,
        options=GCGOptions(target=REFUSAL),
    )  # fmt: skip
    g = timed_calls(
        st, "joint_gcg_step", lambda i: gcg(pool_params(pool), REQUESTS, None, key=jax.random.key(i)), spec.reps
    )
    st.put(
        joint_gcg={
            "x_adv": g.x_adv,
            "member_loss": np.asarray(g.member_loss).tolist(),
            "queries": np.asarray(g.queries).tolist(),
            "retokenized": np.asarray(g.retokenized).tolist(),
        }
    )

    batch = behavior_batch(tok, REQUESTS, BEAST_TARGET)
    texts = TR.slot_texts(tok, REQUESTS)
    allowed = TK.allowed_vocab(tok, v)
    model = TM.llm_text_model(stack.cfg)
    beast = make_beast(
        model, vocab_size=v, suffix_len=1, beam_width=spec.beast_beam, candidates=spec.beast_candidates, tokenizer=tok
    )
    b = timed_calls(
        st,
        "beast_step",
        lambda i: beast(stack.params, batch, None, key=jax.random.key(i), allowed=allowed, texts=texts),
        spec.reps,
    )
    st.put(
        beast={
            "member_loss": np.asarray(b.member_loss).tolist(),
            "queries": np.asarray(b.queries).tolist(),
            "retokenized": np.asarray(b.retokenized).tolist(),
        }
    )
    np.savez(
        Path(folder) / "attacks.npz",
        gcg_ids=np.asarray(g.ids[0]),
        gcg_mask=np.asarray(g.mask[0]),
        gcg_target=np.asarray(encode_text(tok, REFUSAL), np.int32),
        gcg_member_loss=np.asarray(g.member_loss, np.float64),
        beast_ids=np.asarray(b.x_adv),
        beast_mask=np.asarray(b.mask),
        beast_target=np.asarray(batch.target),
        beast_target_mask=np.asarray(batch.target_mask),
        beast_member_loss=np.asarray(b.member_loss, np.float64),
    )
    st.put(memory_end=memory_mib())
    return st.record


def _torch_target_nll(model, prompt: np.ndarray, target: np.ndarray) -> float:
    """Mean NLL of ``target`` ids after ``prompt`` ids under a transformers causal LM (float64)."""
    import torch

    ids = torch.from_numpy(np.concatenate([prompt, target]).astype(np.int64))[None]
    with torch.no_grad():
        lg = model(ids).logits[0].double()
    lp = torch.log_softmax(lg[len(prompt) - 1 : -1], -1)
    return float(-lp[torch.arange(len(target)), torch.from_numpy(target.astype(np.int64))].mean())


def check_llm_torch(dtype: str, dirs: list[str], folder: str | Path, stages: Stages | None = None) -> dict:
    """Reloads each member in transformers (one at a time) and recomputes every member loss the
    two attacks reported from the prompt ids they returned: GCG's minus the refusal's mean NLL,
    BEAST's the target's mean NLL. Returns ``{"gcg_max_abs_diff", "beast_max_abs_diff", ...}``."""
    import torch
    from transformers import AutoModelForCausalLM

    st = stages or Stages()
    torch.set_num_threads(os.cpu_count() or 1)
    a = np.load(Path(folder) / "attacks.npz")
    gcg_diff, beast_diff, values = 0.0, 0.0, []
    for m, d in enumerate(dirs):
        model = st.run(f"torch_reload_m{m}", AutoModelForCausalLM.from_pretrained, d, dtype=_torch_dtype(dtype)).eval()
        for b in range(a["gcg_ids"].shape[0]):
            prompt = a["gcg_ids"][b][a["gcg_mask"][b] == 1]
            loss = -_torch_target_nll(model, prompt, a["gcg_target"])
            gcg_diff = max(gcg_diff, abs(loss - a["gcg_member_loss"][b, m]))
            values.append(loss)
        for b in range(a["beast_ids"].shape[0]):
            prompt = a["beast_ids"][b][a["beast_mask"][b] == 1]
            target = a["beast_target"][b][a["beast_target_mask"][b] == 1]
            loss = _torch_target_nll(model, prompt, target)
            beast_diff = max(beast_diff, abs(loss - a["beast_member_loss"][b, m]))
            values.append(loss)
        del model
    out = {
        "gcg_member_loss_max_abs_diff": gcg_diff,
        "beast_member_loss_max_abs_diff": beast_diff,
        "max_abs_loss": float(np.abs(values).max()),
    }
    st.put(member_losses_vs_transformers=out)
    return out


# ---------------------------------------------------------------------------------- the phases


def _worker(a) -> None:
    """One phase in this (fresh) process; its record goes to ``a.worker_out``."""
    st = Stages(a.worker_out)
    small = a.small
    if a.worker == "wrn":
        run_wrn(WRN_SMALL if small else WRN_REAL, st)
        return
    spec = LLM_SMALL if small else LLM_REAL
    if a.layers is not None:
        spec = dataclasses.replace(spec, config={**spec.config, "num_hidden_layers": a.layers})
    dirs = [str(Path(a.folder) / f"m{i}") for i in range(spec.members)]
    if a.worker == "llm-build":
        build_llm_checkpoints(spec, a.dtype, a.folder, st)
    elif a.worker == "llm-jax":
        run_llm_jax(spec, a.dtype, dirs, a.folder, st)
    elif a.worker == "llm-torch-check":
        check_llm_torch(a.dtype, dirs, a.folder, st)


def _mem_available_gib() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def run_phase(args: list[str], min_free_gib: float, timeout_s: float) -> dict:
    """Runs ``realsize_run.py --worker ...args`` in a fresh process under the memory watchdog:
    its record plus ``returncode``, ``ru_maxrss_mib`` (the process's peak resident memory),
    ``wall_s``, ``min_mem_available_gib`` and ``stopped`` (why the watchdog ended it, or None)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-out", out, *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    stopped, low, status, usage = None, _mem_available_gib(), None, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        free = _mem_available_gib()
        low = min(low, free)
        if stopped is None and free < min_free_gib:
            stopped = f"MemAvailable {free:.2f} GiB < {min_free_gib} GiB: out of memory on this machine"
            proc.kill()
        elif stopped is None and time.perf_counter() - t0 > timeout_s:
            stopped = f"over the {timeout_s:.0f} s limit"
            proc.kill()
        time.sleep(0.25)
    rec = json.loads(Path(out).read_text()) if Path(out).stat().st_size else {}
    os.unlink(out)
    rec.update(
        returncode=os.waitstatus_to_exitcode(status),
        ru_maxrss_mib=usage.ru_maxrss / 1024,
        wall_s=time.perf_counter() - t0,
        min_mem_available_gib=low,
        stopped=stopped,
    )
    proc.returncode = rec["returncode"]
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["all", "wrn", "llm"], default="all")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--small", action="store_true", help="the test dimensions (WRN-10-1, Llama structure at d=64)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the config's; to fit memory)")
    ap.add_argument(
        "--fallback-layers",
        type=int,
        nargs="*",
        default=[8, 4],
        help="decoder layers to retry an LLM dtype with when the watchdog stops it for memory (in order)",
    )
    ap.add_argument("--min-free-gib", type=float, default=1.5, help="watchdog: stop a phase below this MemAvailable")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase")
    ap.add_argument("--out", default=None, help="JSON path (default: a temporary folder, never benchmarks/results/)")
    ap.add_argument("--worker", choices=["wrn", "llm-build", "llm-jax", "llm-torch-check"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        _worker(a)
        return 0
    out = results_path("realsize_run.json", a.out, quick=a.small)
    res: dict = {"provenance": provenance(), "small": a.small, "mem_available_gib_start": _mem_available_gib()}
    common = ["--small"] if a.small else []
    ok = True
    if a.part in ("all", "wrn"):
        res["wrn"] = run_phase(["--worker", "wrn", *common], a.min_free_gib, a.timeout)
        ok &= res["wrn"]["returncode"] == 0
        _write(out, res)
    if a.part in ("all", "llm"):  # last: the largest
        res["llm"] = {}
        for dtype in a.dtypes:
            res["llm"][dtype] = attempts = []
            # the config's layers, then --fallback-layers while the watchdog stops a phase
            for layers in [a.layers, *a.fallback_layers]:
                phases: dict = {"layers": layers}
                attempts.append(phases)
                with tempfile.TemporaryDirectory(prefix="sarjax-realsize-llm-") as folder:
                    extra = [*common, "--folder", folder, "--dtype", dtype]
                    if layers is not None:
                        extra += ["--layers", str(layers)]
                    for phase in ("llm-build", "llm-jax", "llm-torch-check"):
                        phases[phase] = run_phase(["--worker", phase, *extra], a.min_free_gib, a.timeout)
                        _write(out, res)
                        if phases[phase]["returncode"] != 0:
                            break
                if all(phases.get(p, {}).get("returncode") == 0 for p in ("llm-build", "llm-jax", "llm-torch-check")):
                    break
                if not any(
                    isinstance(v, dict) and (v.get("stopped") or "").startswith("MemAvailable") for v in phases.values()
                ):
                    ok = False  # a failure other than memory: no smaller retry
                    break
            else:
                ok = False
    res["provenance_end_load"] = list(os.getloadavg())
    _write(out, res)
    print(f"wrote {out}")
    return 0 if ok else 1


def _write(out: Path, res: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=_jsonable) + "\n")


if __name__ == "__main__":
    sys.exit(main())
