"""Budget sweep of the measured step peak and step time under Inductor on
CPU: adacc against no checkpointing (Inductor's default partitioner), full
per-block activation checkpointing and PyTorch's ``activation_memory_budget``
partitioner, side by side in one process (steps interleaved, medians).

    python bench/bench_peak.py [--models gpt llama hf_gpt2] [--budgets 1.0 0.7 0.5 0.3 0.1]
        [--torch-budgets 0.5 0.3 0.1] [--repeats 3] [--out bench/results/peak_sweep.md]
        [--step-budget]

``--step-budget`` adds a second round per model: full AC again, and adacc
with ``budget_scope="step"`` at full AC's peak measured in the first round
(the budget of a user who has that much memory), its peak measured after
the warm-up steps in which graphs split by a graph break re-plan.

Models: GPT-style and Llama-style (adacc_examples.models: 4 layers, d_model
256, seq 256, batch 8, vocab 512) and, if transformers is installed, Hugging
Face GPT-2 with 6 layers, d_model 384, 6 heads, seq 256, batch 8 (vocab
50257; random weights; Dynamo compiles its body and its loss as two graphs),
and ``hf_llama``, ``hf_qwen2``, ``hf_gpt2_8k``: the same shape with vocab
8192, where activations rather than the logits dominate the step.
Peak: the profiler's allocator trace of one fw+bw step
(`adacc_compile.measure`). Headlines: the fastest adacc plan whose measured
peak is at most full AC's, against full AC; adacc against PyTorch's
partitioner at each budget both ran at. Writes a markdown table, a JSON file
and a PNG of peak against step time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

import torch

import _examples_path  # noqa: F401  (examples/ on sys.path)
from adacc_examples.benchmarking import Variant, run_variants
from adacc_examples.models import GPT, GPTConfig, Llama, LlamaConfig, gpt_batch, init_weights


class HFCausalLM(torch.nn.Module):
    """Hugging Face causal LM as ``forward(ids, labels) -> loss``, with the
    ``checkpoint_blocks`` switch the benchmark harness uses for full AC."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    @property
    def checkpoint_blocks(self) -> bool:
        return bool(getattr(self.model, "is_gradient_checkpointing", False))

    @checkpoint_blocks.setter
    def checkpoint_blocks(self, on: bool) -> None:
        if on:
            self.model.config.use_cache = False
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, labels=labels).loss


def workload(name: str, steps: int):
    gen = torch.Generator().manual_seed(0)
    if name == "hf_gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=6, n_embd=384, n_head=6, n_positions=256, use_cache=False)
        model = HFCausalLM(GPT2LMHeadModel(cfg))
        batches = [
            (ids := torch.randint(0, cfg.vocab_size, (8, 256), generator=gen), ids) for _ in range(steps)
        ]
        return model, batches, "HF GPT-2: 6 layers, d_model 384, seq 256, batch 8, vocab 50257"
    if name in ("hf_llama", "hf_gpt2_8k", "hf_qwen2"):
        return hf_activation_bound(name, steps, gen)
    common = dict(n_layer=4, d_model=256, n_head=4, seq_len=256, vocab_size=512)
    if name == "gpt":
        cfg = GPTConfig(**common, dropout=0.1)
        model = init_weights(GPT(cfg))
    else:
        cfg = LlamaConfig(**common, ffn_dim=688)
        model = init_weights(Llama(cfg))
    return model, [gpt_batch(cfg, 8, gen) for _ in range(steps)], f"{name}: 4 layers, d_model 256, seq 256, batch 8"


def hf_activation_bound(name: str, steps: int, gen: torch.Generator):
    """Hugging Face models where activations, not the vocabulary, dominate
    the step: 6 layers, d_model 384, 6 heads, vocab 8192, seq 256, batch 8
    (random weights from a config)."""
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=8192, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                  num_key_value_heads=6, max_position_embeddings=256, use_cache=False)
    if name == "hf_llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, intermediate_size=1024))
    elif name == "hf_qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, intermediate_size=1024))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=8192, n_embd=384, n_layer=6, n_head=6, n_positions=256, use_cache=False))
    batches = [(ids := torch.randint(0, 8192, (8, 256), generator=gen), ids) for _ in range(steps)]
    return HFCausalLM(model), batches, f"{name}: 6 layers, d_model 384, 6 heads, seq 256, batch 8, vocab 8192"


def variants(budgets, torch_budgets) -> list[Variant]:
    out = [Variant(name="no checkpointing", kind="inductor"), Variant(name="full AC", kind="full_ac")]
    out += [Variant(name=f"torch budget @{b:g}", kind="torch_budget", budget=b, solver="dp") for b in torch_budgets]
    out += [Variant(name=f"adacc @{b:g}", kind="adacc", options={"memory_budget": b}) for b in budgets]
    return out


def step_budget_round(model, batches, full_ac_peak: int, repeats: int, *, caches: bool = False):
    """Full AC and adacc with ``budget_scope="step"`` at full AC's measured
    peak, in one run: the budget a user with that much memory would give.
    With graph breaks the earlier graphs re-plan in the warm-up step
    (docs/budget.md, *Graph breaks*), so the peak is measured from the third step."""
    step = Variant(
        name=f"adacc step budget {full_ac_peak / 2**20:.1f} MiB (full AC's peak)", kind="adacc",
        options={"memory_budget": int(full_ac_peak), "budget_scope": "step"},
    )
    return run_variants(
        model, batches, [Variant(name="full AC", kind="full_ac"), step], timing_repeats=repeats, caches=caches
    )


def raw_entries(results, step_round) -> list[dict]:
    """The JSON entries of one model: each strategy with the round it ran
    in (1, or 2 for the step-budget round, whose adacc is compared with the
    full AC it was interleaved with, `bench/results_table.py`)."""
    return [
        {"name": r.name, "round": round_, "peak_bytes": r.peak_bytes, "step_seconds": r.step_seconds,
         "losses": r.losses, "compile_seconds": r.compile_seconds, "planning_seconds": r.planning_seconds,
         "summaries": [x["summary"] for x in r.reports]}
        for round_, group in ((1, results), (2, step_round)) for r in group
    ]


def step_budget_lines(results) -> list[str]:
    full, ours = results
    return [
        f"step budget at full AC's measured peak ({ours.name}): measured {ours.peak_bytes / 2**20:.1f} MiB "
        f"against full AC's {full.peak_bytes / 2**20:.1f} MiB in this round, step time "
        f"{ours.median_step_seconds / full.median_step_seconds:.2f}x full AC's; graphs planned: "
        + ", ".join(f"{x['summary']['graph_index']} (saves {x['summary']['planned_saved_bytes'] / 2**20:.1f} MiB)" for x in ours.reports)
    ]


def table(results, reference: str) -> str:
    ref = next(r for r in results if r.name == reference)
    lines = [
        "| strategy | measured peak MiB | vs default | step ms (median) | vs default | adacc predicted act. peak MiB (per graph) | planning s | final loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        predicted = ", ".join(f"{s['predicted_activation_peak_bytes'] / 2**20:.1f}" for s in (x["summary"] for x in r.reports))
        lines.append(
            f"| {r.name} | {r.peak_bytes / 2**20:.1f} | {r.peak_bytes / ref.peak_bytes:.2f} | "
            f"{1e3 * r.median_step_seconds:.0f} | {r.median_step_seconds / ref.median_step_seconds:.2f} | "
            f"{predicted} | {'' if r.planning_seconds is None else f'{r.planning_seconds:.1f}'} | {r.losses[-1]:.4f} |"
        )
    return "\n".join(lines)


def headlines(results) -> list[str]:
    by = {r.name: r for r in results}
    out = []
    full = by["full AC"]
    fitting = [r for r in results if r.name.startswith("adacc") and r.peak_bytes <= full.peak_bytes]
    if fitting:
        best = min(fitting, key=lambda r: r.median_step_seconds)
        out.append(
            f"at or below full AC's measured peak ({full.peak_bytes / 2**20:.1f} MiB): {best.name} peaks at "
            f"{best.peak_bytes / 2**20:.1f} MiB with step time {best.median_step_seconds / full.median_step_seconds:.2f}x full AC's"
        )
    else:
        lowest = min((r for r in results if r.name.startswith("adacc")), key=lambda r: r.peak_bytes)
        out.append(
            f"no adacc budget reached full AC's measured peak ({full.peak_bytes / 2**20:.1f} MiB); the lowest, "
            f"{lowest.name}, peaks at {lowest.peak_bytes / full.peak_bytes:.2f}x it"
        )
    for name, r in by.items():
        if not name.startswith("torch budget @"):
            continue
        budget = name.split("@")[1]
        ours = by.get(f"adacc @{budget}")
        if ours:
            out.append(
                f"@{budget}: adacc / PyTorch measured peak {ours.peak_bytes / r.peak_bytes:.2f}, "
                f"step time {ours.median_step_seconds / r.median_step_seconds:.2f}"
            )
    return out


def plot(sections, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(sections), figsize=(6 * len(sections), 4.5), squeeze=False)
    for ax, (title, results) in zip(axes[0], sections):
        for r in results:
            marker = "o" if r.name.startswith("adacc") else ("s" if r.name.startswith("torch") else "^")
            ax.scatter(r.peak_bytes / 2**20, 1e3 * r.median_step_seconds, marker=marker)
            ax.annotate(r.name, (r.peak_bytes / 2**20, 1e3 * r.median_step_seconds), fontsize=7)
        ax.set_xlabel("measured step peak (MiB)")
        ax.set_ylabel("step time (ms, median)")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["gpt", "llama", "hf_gpt2"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.7, 0.5, 0.3, 0.1])
    parser.add_argument("--torch-budgets", type=float, nargs="+", default=[0.5, 0.3, 0.1])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/peak_sweep.md")
    parser.add_argument(
        "--step-budget", action="store_true",
        help="also run adacc with budget_scope='step' at full AC's measured peak, beside full AC (a second round)",
    )
    parser.add_argument(
        "--caches", choices=("on", "off"), default="on",
        help="torch's compile caches: 'on' leaves them as torch sets them (its default, what users run), "
             "'off' compiles every strategy from nothing",
    )
    args = parser.parse_args(argv)
    import torch._inductor.config as inductor_config

    caches = args.caches == "on"

    command = f"python bench/bench_peak.py {' '.join(sys.argv[1:] if argv is None else argv)}"
    sections, text = [], []
    raw: dict = {"meta": {
        "date": str(datetime.date.today()), "command": command, "device": f"{platform.machine()} CPU",
        "cpus": os.cpu_count(), "torch": torch.__version__, "caches": args.caches, "titles": {},
    }}
    for name in args.models:
        if name == "hf_gpt2":
            try:
                import transformers  # noqa: F401
            except ImportError:
                print("transformers is not installed: skipping HF GPT-2", flush=True)
                continue
        model, batches, title = workload(name, args.steps)
        with inductor_config.patch(fallback_random=True):
            results = run_variants(
                model, batches, variants(args.budgets, args.torch_budgets), timing_repeats=args.repeats, caches=caches
            )
        lines = headlines(results)
        if args.step_budget:
            full_ac = next(r for r in results if r.name == "full AC")
            with inductor_config.patch(fallback_random=True):
                step_round = step_budget_round(model, batches, full_ac.peak_bytes, args.repeats, caches=caches)
            lines += step_budget_lines(step_round)
        else:
            step_round = []
        shown = results + step_round[1:]
        sections.append((title, shown))
        raw["meta"]["titles"][name] = title
        block = f"### {title}\n\n" + table(shown, "no checkpointing") + "\n\n" + "\n".join(
            f"- {line}" for line in lines
        )
        text.append(block)
        print(block, flush=True)
        raw[name] = raw_entries(results, step_round)
    header = (
        f"## Budget sweep under Inductor — {datetime.date.today()} — {platform.machine()} CPU, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, compile caches {args.caches}\n\nCommand: `{command}`\n"
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(header + "\n" + "\n\n".join(text) + "\n")
    base = os.path.splitext(args.out)[0]
    with open(base + ".json", "w") as f:
        json.dump(raw, f, indent=1, default=str)
    plot(sections, base + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
