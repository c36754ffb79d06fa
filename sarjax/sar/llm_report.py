"""The report and plots of an LLM SAR run (:class:`sarjax.sar.llm.LLMSARRun`): the JSON summary
(:func:`llm_sar_report`) and the SAR paper's Figure 5 style panels (:func:`plot_llm_sar`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sarjax.cover.plots import save_figure
from sarjax.sar.llm import LLMSARRun


def llm_sar_report(run: LLMSARRun, tokenizer: Any = None, names: Sequence[str] | None = None) -> dict[str, Any]:
    """JSON-ready report: the SAR summary per delta, ``1 - mean ASR``, the clean-broken members
    per request and the recorded prompts (decoded with ``tokenizer`` when given)."""
    res = run.result
    d = res.to_json_dict()
    for b, s in enumerate(d["samples"]):
        s["behavior"] = run.behaviors[b]
        s["clean_broken_names"] = [names[j] for j in s["clean_broken"]] if names else None
        if res.inputs is not None:
            for rec in s["inputs"]:
                x = np.asarray(res.inputs[rec["round"], b]).ravel()
                x = x[x >= 0]
                rec["prompt"] = tokenizer.decode(x.tolist()) if tokenizer is not None and x.size else None
    d["clean_broken_share"] = float(res.clean_broken[res.valid].mean()) if res.valid.any() else None
    d["clean_generations"] = run.clean_generations
    if run.asr is not None:
        d["asr"] = [float(a) for a in run.asr]
        d["mean_asr"] = float(np.mean(run.asr))
        d["one_minus_asr"] = 1.0 - float(np.mean(run.asr))
    d["members"] = list(names) if names else None
    return d


def plot_llm_sar(run: LLMSARRun, path: str | os.PathLike, title: str | None = None) -> Path:
    """Two panels: the ``k_hat`` histogram per delta (not reached: ``k = M + 1``) and the mean SAR
    (± standard error) against delta beside ``1 - mean ASR`` (the SAR paper, Figure 5 style)."""
    import matplotlib  # here: the Agg backend must be chosen before pyplot is first imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use("Agg")

    res = run.result
    m, v = res.num_members, res.valid
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    bins = np.arange(m + 3) - 0.5
    for j, delta in enumerate(res.deltas):
        k = np.where(res.reached[v, j], res.k_hat[v, j], m + 1)
        ax0.hist(k, bins=bins, alpha=0.5, label=f"delta={delta:g}")
    ax0.set_xlabel(f"k_hat (inputs to break a (1-delta) share; {m + 1} = not reached)")
    ax0.set_ylabel("requests")
    ax0.legend(fontsize=8)
    stats = res.sar_stats()
    ds = np.asarray(res.deltas)
    order = np.argsort(ds)
    mean = np.asarray([np.nan if s["mean_sar"] is None else s["mean_sar"] for s in stats])[order]
    se = np.asarray([0.0 if s["se_sar"] is None else s["se_sar"] for s in stats])[order]
    ax1.errorbar(ds[order], mean, yerr=se, marker="o", label="mean SAR")
    if run.asr is not None:
        ax1.axhline(1.0 - float(np.mean(run.asr)), linestyle="--", color="gray", label="1 - mean ASR")
    ax1.set_xlabel("delta")
    ax1.set_ylabel("SAR / robustness")
    ax1.set_ylim(0, 1.05)
    ax1.legend(fontsize=8)
    return save_figure(fig, path, title)


__all__ = ["llm_sar_report", "plot_llm_sar"]
