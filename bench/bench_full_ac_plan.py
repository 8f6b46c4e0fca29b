"""Full activation checkpointing as one of adacc's plans: how the model and
the simulator price it, and where adacc's lowest plan lands beside it.

    python bench/bench_full_ac_plan.py [--families llama gpt] [--layers 4]
        [--d-model 128] [--seq-len 128] [--vocab 512] [--batch 4] [--tag T]

For the project's own Llama and GPT (random weights, loss inside the
graph, eager graphs so the allocator trace is the plan as adacc ran it),
one process, CPU: the measured step peak (`adacc_compile.measure`) of

* full AC: `torch.utils.checkpoint` around each block (``checkpoint_blocks``);
* adacc running full AC's plan (``planner="full_ac"``), beside the split
  graphs' simulated peak (``predicted_peak_bytes``) and the MILP's linear
  model of it (``modelled_activation_peak_bytes``);
* adacc's lowest plan (a 1-byte step budget: the reachable minimum).

Outputs bench/results/full_ac_plan{tag}.md.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import warnings

import torch

import _examples_path  # noqa: F401
from adacc_compile.measure import second_step_peak_bytes
from adacc_compile.partitioner import AdaccPartitioner
from adacc_compile.config import AdaccConfig
from adacc_examples.models import GPT, GPTConfig, Llama, LlamaConfig, gpt_batch, init_weights


def _model(family: str, args: argparse.Namespace):
    torch.manual_seed(0)
    common = dict(n_layer=args.layers, d_model=args.d_model, n_head=4, seq_len=args.seq_len, vocab_size=args.vocab)
    if family == "llama":
        cfg = LlamaConfig(**common, ffn_dim=int(8 * args.d_model / 3) // 8 * 8)
        return init_weights(Llama(cfg)), cfg
    cfg = GPTConfig(**common, dropout=0.0)
    return init_weights(GPT(cfg)), cfg


def _peak(model, fn, batch) -> int:
    """The second step's peak (`measure.second_step_peak_bytes`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 1-byte budget warns by design
        return second_step_peak_bytes(model, lambda: fn(*batch).backward())


def _adacc(family, args, batch, options):
    model, _ = _model(family, args)
    partitioner = AdaccPartitioner(AdaccConfig.from_options(
        {"budget_scope": "step", "device_profile": "h100", "measure_step": False, **options}
    ))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=partitioner.backend(eager=True))
    measured = _peak(model, compiled, batch)
    return measured, partitioner.reports[-1]["summary"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["llama", "gpt"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "results"))
    args = parser.parse_args()
    rows = []
    for family in args.families:
        checkpointed, cfg = _model(family, args)
        checkpointed.checkpoint_blocks = True
        batch = gpt_batch(cfg, args.batch, torch.Generator().manual_seed(0))
        full_ac = _peak(checkpointed, checkpointed, batch)
        plan_run, plan = _adacc(family, args, batch, {"planner": "full_ac", "memory_budget": "1GB"})
        low_run, low = _adacc(family, args, batch, {"memory_budget": "1B"})
        rows.append(
            f"| {family} | {full_ac / 2**20:.2f} | {plan_run / 2**20:.2f} ({plan_run / full_ac:.3f}x) "
            f"| {plan['predicted_peak_bytes'] / plan_run:.3f} | {plan['modelled_activation_peak_bytes'] / plan_run:.3f} "
            f"| {low_run / 2**20:.2f} ({low_run / full_ac:.3f}x) | {low['predicted_peak_bytes'] / low_run:.3f} |"
        )
        print(rows[-1], flush=True)
    header = (
        f"{datetime.date.today()} · {platform.machine()} CPU · torch {torch.__version__} · "
        f"{args.layers} layers, d_model {args.d_model}, seq {args.seq_len}, vocab {args.vocab}, batch {args.batch}, "
        f"adacc_eager, step peaks from the allocator trace (MiB)\n\n"
        "| model | full AC (torch.utils.checkpoint) | adacc running full AC's plan (vs full AC) "
        "| its simulated / measured | its linear model / measured | adacc's lowest plan (vs full AC) "
        "| its simulated / measured |\n|---|---|---|---|---|---|---|\n"
    )
    out = pathlib.Path(args.out_dir) / f"full_ac_plan{args.tag}.md"
    out.write_text(header + "\n".join(rows) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
