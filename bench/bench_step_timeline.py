"""Where a step's memory goes: adacc's simulated timeline beside the
allocator's, op by op, and full activation checkpointing's beside it.

    python bench/bench_step_timeline.py [--family llama|gpt2|qwen2] [--layers 4]
        [--d-model 64] [--vocab 512] [--seq-len 64] [--batch 4] [--labels]
        [--planner milp|full_ac] [--budget 1B] [--tag T]

One process, CPU, random weights, eager graphs (``adacc_eager``: one aten
op per graph node, so the allocator's level during each op lines up with
the simulator's after each node). For a Hugging Face model:

* full AC (``gradient_checkpointing_enable``): the measured level during
  each top-level aten op of its second step;
* adacc at ``--budget`` (``budget_scope="step"``; 1 byte: its lowest plan)
  or running ``--planner full_ac``: the simulated level after each node of
  its split graphs (``memory_timeline.json`` of its dump) beside the
  measured level during the op that node ran.

The report lists both peaks and the ops around them, and every node where
simulation and measurement part by more than 1% of the peak: the first such
node is where the model of the step goes wrong (this is how the logits'
gradient and the logits themselves were found mis-held beside a loss).

Outputs bench/results/step_timeline_{family}{tag}.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import re
import tempfile
import warnings
from dataclasses import dataclass

import torch

from adacc_compile import compat_memory
from adacc_compile.measure import profile_memory_of

_NODE = re.compile(r"^\s*(\w+)(?::[^=]*)? = torch\.ops\.aten\.(\w+)\.")


@dataclass(frozen=True, slots=True)
class Row:
    phase: str
    node: str
    op: str
    simulated: int
    measured: int | None


def _model(args: argparse.Namespace) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=args.vocab, use_cache=False)
    if args.family == "gpt2":
        config = transformers.GPT2Config(
            **common, n_embd=args.d_model, n_layer=args.layers, n_head=4, n_positions=args.seq_len,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
        return transformers.GPT2LMHeadModel(config).train()
    config_class = transformers.Qwen2Config if args.family == "qwen2" else transformers.LlamaConfig
    config = config_class(
        **common, hidden_size=args.d_model, intermediate_size=int(args.d_model * 2.7) // 4 * 4,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=args.seq_len,
    )
    model_class = transformers.Qwen2ForCausalLM if args.family == "qwen2" else transformers.LlamaForCausalLM
    return model_class(config).train()


def _step(model, ids: torch.Tensor, labels: bool):
    def run() -> None:
        if labels:
            model(input_ids=ids, labels=ids).loss.backward()
        else:
            model(input_ids=ids).logits.float().mean().backward()

    return run


def measured_levels(model: torch.nn.Module, step) -> list[tuple[str, int]]:
    """The second step's level during each top-level aten op, the first
    step's gradients freed before the window."""
    step()
    model.zero_grad(set_to_none=True)
    return compat_memory.allocator_levels_by_op(profile_memory_of(step))


def _graph_ops(source: str) -> dict[str, str]:
    """Node name -> ``aten::<op>`` from a dumped graph's readable code."""
    ops = {}
    for line in source.splitlines():
        match = _NODE.match(line)
        if match:
            ops[match.group(1)] = f"aten::{match.group(2)}"
    return ops


def align(events: list[list], ops: dict[str, dict[str, str]], levels: list[tuple[str, int]]) -> list[Row]:
    """Each simulated node beside the measured level of the op it ran as:
    the nodes in order, each matched to the next profiled op of its name
    (ops with no node, such as the autograd engine's own, are skipped).
    ``ops``: phase -> node -> op (the backward's placeholders share the
    names of the forward nodes they were saved from)."""
    rows, j = [], 0
    for phase, node, live, _activation in events:
        op = ops.get(phase, {}).get(node)
        if op is None:
            continue
        k = j
        while k < len(levels) and levels[k][0] != op:
            k += 1
        if k == len(levels):
            rows.append(Row(phase, node, op, live, None))
            continue
        rows.append(Row(phase, node, op, live, levels[k][1]))
        j = k + 1
    return rows


def compiled_with_dumps(model: torch.nn.Module, args: argparse.Namespace, dump_dir: str):
    """``model`` compiled by adacc_eager with its dumps in ``dump_dir``, and
    a function listing the graphs' dump folders."""
    import adacc_compile  # noqa: F401  (registers the backends)

    options = {"budget_scope": "step", "measure_step": False, "device_profile": "h100", "dump_dir": dump_dir}
    options.update({"planner": args.planner} if args.planner != "milp" else {"memory_budget": args.budget})
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="adacc_eager", options=options)
    return compiled, lambda: sorted(pathlib.Path(dump_dir).glob("graph_*"))


def run(args: argparse.Namespace) -> dict:
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(0))
    full_ac = _model(args)
    full_ac.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    full_ac_levels = measured_levels(full_ac, _step(full_ac, ids, args.labels))
    with tempfile.TemporaryDirectory() as dump_dir:
        model = _model(args)
        compiled, folders = compiled_with_dumps(model, args, dump_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a 1-byte budget warns by design
            ours_levels = measured_levels(model, _step(compiled, ids, args.labels))
        graphs = []
        for folder in folders():
            timeline = json.loads((folder / "memory_timeline.json").read_text())
            ops = {phase: _graph_ops((folder / f"{phase}.py").read_text()) for phase in ("forward", "backward")}
            summary = json.loads((folder / "summary.json").read_text())
            graphs.append((folder.name, timeline, ops, summary))
    # One graph: align its whole step. Several (a graph break): each is
    # aligned on its own, against the whole trace, which is only a guide.
    sections = []
    for name, timeline, ops, summary in graphs:
        rows = align(timeline["events"], ops, ours_levels)
        sections.append({"graph": name, "rows": rows, "summary": summary, "simulated_peak": timeline["peak_bytes"]})
    return {"full_ac": full_ac_levels, "ours": ours_levels, "graphs": sections}


def _around(levels: list[tuple[str, int]], width: int = 8) -> list[str]:
    peak = max(range(len(levels)), key=lambda i: levels[i][1])
    return [f"| {i} | {levels[i][0]} | {levels[i][1]:,} |" for i in range(max(0, peak - width), min(len(levels), peak + 3))]


def report(args: argparse.Namespace, result: dict) -> str:
    full_ac_peak = max(level for _, level in result["full_ac"])
    ours_peak = max(level for _, level in result["ours"])
    what = f"planner={args.planner}" if args.planner != "milp" else f"memory_budget={args.budget}"
    lines = [
        f"# Step timeline: HF {args.family}, {args.layers} layers, d_model {args.d_model}, vocab {args.vocab}, "
        f"seq {args.seq_len}, batch {args.batch}, {'labels=' if args.labels else 'logits.mean()'}",
        "",
        f"{datetime.date.today()}, {platform.machine()} CPU, torch {torch.__version__}; adacc_eager, "
        f"budget_scope=\"step\", {what}. Command: `python bench/bench_step_timeline.py "
        f"--family {args.family} --layers {args.layers} --d-model {args.d_model} --vocab {args.vocab} "
        f"--seq-len {args.seq_len} --batch {args.batch}{' --labels' if args.labels else ''} "
        f"--planner {args.planner} --budget {args.budget}`",
        "",
        "| step | measured peak (bytes) | vs full AC |",
        "|---|---:|---:|",
        f"| full AC (HF checkpointing) | {full_ac_peak:,} | 1.000 |",
        f"| adacc | {ours_peak:,} | {ours_peak / full_ac_peak:.3f} |",
    ]
    for section in result["graphs"]:
        rows, summary = section["rows"], section["summary"]
        lines += [
            "",
            f"## adacc, {section['graph']}: plan source {summary.get('plan_source')}, simulated peak "
            f"{section['simulated_peak']:,} bytes",
            "",
            f"Nodes where simulation and measurement part by more than 1% of the measured peak "
            f"({ours_peak:,} bytes); the first is where the model goes wrong:",
            "",
            "| phase | node | op | simulated | measured | simulated - measured |",
            "|---|---|---|---:|---:|---:|",
        ]
        apart = [r for r in rows if r.measured is not None and abs(r.simulated - r.measured) > 0.01 * ours_peak]
        for r in apart[:25]:
            lines.append(f"| {r.phase} | {r.node} | {r.op} | {r.simulated:,} | {r.measured:,} | {r.simulated - r.measured:+,} |")
        lines.append(f"\n{len(apart)} of {len(rows)} aligned nodes part by more than 1%.")
    lines += ["", "## Full AC's ops around its measured peak", "", "| op # | op | level |", "|---:|---|---:|"]
    lines += _around(result["full_ac"])
    lines += ["", "## adacc's ops around its measured peak", "", "| op # | op | level |", "|---:|---|---:|"]
    lines += _around(result["ours"])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=["llama", "gpt2", "qwen2"], default="llama")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--labels", action="store_true", help="the loss in the graph (labels=)")
    parser.add_argument("--planner", choices=["milp", "full_ac"], default="milp")
    parser.add_argument("--budget", default="1B")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    text = report(args, run(args))
    out = pathlib.Path(args.out_dir) / f"step_timeline_{args.family}{args.tag}.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
