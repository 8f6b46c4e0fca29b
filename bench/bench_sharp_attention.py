"""Gradient error of lossy plans when the activations drift mid-training.

    python bench/bench_sharp_attention.py [--steps 30] [--sharpen-at 12] [--scale 30]
        [--drift sharpen|saturate] [--backend adacc_eager] [--accuracy balanced aggressive]
        [--out PATH.md] [--without-lossy-use-rule] [--without-gradient-check]

HF GPT-2 (2 layers, n_embd 128, seq 64, batch 4, random weights), compiled
with ``memory_budget=0.3, accuracy=<each --accuracy mode>,
allow_recompute=False, adapt=True, adapt_every=4``, trained with SGD. At ``--sharpen-at`` the
query and key projections are scaled by ``--scale`` (attention near
one-hot); with ``--drift saturate`` every block's second layer norm weight
is scaled instead (``--scale`` 1e4: an fp8 scale calibrated before is far
past its headroom). Every step, an eager copy with the same weights and batch gives
the reference gradients; printed: the relative error of the whole gradient
and of the worst parameter, the attention's mean max probability at the
start and at the sharpening, the re-plans (those that recompiled and the
recalibrations that did not), and the plan's codecs.
``--without-lossy-use-rule`` empties `passes.lossy_uses`' rules and
``--without-gradient-check`` turns calibration's gradient check off
(`passes.gradient_sensitivity`): what ran before each. `tests/e2e/test_sharp_attention.py` runs a short `run`.
"""

from __future__ import annotations

import argparse
import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

import adacc_compile  # noqa: F401  (first: drops the repo root, whose kernels/ shadows Hugging Face's)

CONFIG = dict(vocab_size=256, n_embd=128, n_layer=2, n_head=4, n_positions=64, use_cache=False,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


@dataclass
class SharpRun:
    errors: list[float] = field(default_factory=list)
    """Relative error of the whole gradient, per step."""
    sharpness: dict[int, list[float]] = field(default_factory=dict)
    """Step -> the attention's mean max probability per layer."""
    model: torch.nn.Module | None = None


def run(*, steps: int, sharpen_at: int, scale: float = 30.0, backend: str = "adacc_eager",
        adapt_every: int = 4, accuracy: str = "balanced", drift: str = "sharpen",
        report: Callable[[str], None] = lambda line: None) -> SharpRun:
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)).train()
    reference = copy.deepcopy(model)
    options = {"memory_budget": 0.3, "accuracy": accuracy, "allow_recompute": False, "adapt": True,
               "adapt_every": adapt_every, "device_profile": "h100"}
    compiled = torch.compile(model, backend=backend, options=options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    result = SharpRun(model=model)

    def sharpness(ids):
        eager = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG, attn_implementation="eager"))
        eager.load_state_dict(model.state_dict())
        with torch.no_grad():
            return [round(a.max(-1).values.mean().item(), 3) for a in eager(input_ids=ids, output_attentions=True).attentions]

    for step in range(steps):
        if step == sharpen_at:
            with torch.no_grad():
                for block in model.transformer.h:
                    if drift == "sharpen":
                        block.attn.c_attn.weight[:, : 2 * CONFIG["n_embd"]] *= scale
                    else:
                        block.ln_2.weight *= scale
        ids = torch.randint(0, CONFIG["vocab_size"], (4, 64), generator=generator)
        if step in (0, sharpen_at):
            result.sharpness[step] = sharpness(ids)
            report(f"step {step}: attention mean max probability per layer {result.sharpness[step]}")
        reference.load_state_dict(model.state_dict())
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        reference(input_ids=ids, labels=ids).loss.backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(input_ids=ids, labels=ids).loss.backward()
        errors = {
            name: ((p.grad - q.grad).norm() / q.grad.norm()).item()
            for (name, p), q in zip(model.named_parameters(), reference.parameters())
            if q.grad is not None and q.grad.norm() > 0
        }
        ours = torch.cat([p.grad.flatten() for p in model.parameters()])
        theirs = torch.cat([q.grad.flatten() for q in reference.parameters()])
        result.errors.append(((ours - theirs).norm() / theirs.norm()).item())
        if not math.isfinite(result.errors[-1]):  # training has diverged: nothing more to compare
            report(f"step {step}: gradient error {result.errors[-1]}: diverged, stopping")
            break
        name = max(errors, key=errors.get)
        report(f"step {step}: gradient error {result.errors[-1]:.4f}, worst parameter {name} {errors[name]:.4f}")
        optimizer.step()
    return result


def _worst(errors: list[float]) -> float:
    """The largest error, or NaN where one is not finite (max() with a NaN
    depends on where it stands)."""
    if any(not math.isfinite(e) for e in errors):
        return math.nan
    return max(errors, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sharpen-at", type=int, default=12)
    parser.add_argument("--scale", type=float, help="default 30 (sharpen), 1e4 (saturate)")
    parser.add_argument("--drift", choices=("sharpen", "saturate"), default="sharpen")
    parser.add_argument("--backend", default="adacc_eager")
    parser.add_argument("--accuracy", nargs="+", default=["balanced"], choices=("balanced", "aggressive"))
    parser.add_argument("--out", help="write a table per mode to this .md (and the per-step errors beside, .json)")
    parser.add_argument("--without-lossy-use-rule", action="store_true")
    parser.add_argument("--without-gradient-check", action="store_true")
    args = parser.parse_args()
    if args.scale is None:
        args.scale = 30.0 if args.drift == "sharpen" else 1e4
    from adacc_compile.adaptation import graphs_of
    from adacc_compile.plan_records import plans

    if args.without_lossy_use_rule:
        from adacc_compile.passes import lossy_uses

        lossy_uses._BY_OP = {}
    if args.without_gradient_check:
        from adacc_compile.passes import calibrate

        calibrate.with_gradient_errors = lambda gm, info, candidates, calibration, real_inputs: calibration
    rows, raw = [], {}
    for accuracy in args.accuracy:
        print(f"== accuracy={accuracy}", flush=True)
        result = run(steps=args.steps, sharpen_at=args.sharpen_at, scale=args.scale, backend=args.backend,
                     accuracy=accuracy, drift=args.drift, report=lambda line: print(line, flush=True))
        replans = sum(graph.replans for graph in graphs_of(result.model))
        recompiles = sum(graph.compiles - 1 for graph in graphs_of(result.model))
        codecs = sorted({c for plan in plans(result.model) for c in plan.codecs})
        print(f"worst gradient error {_worst(result.errors):.4f}")
        for graph in graphs_of(result.model):
            print(f"re-plans {graph.replans}: {[(c.step, c.action, c.drifts) for c in graph.checks if c.drifts]}")
        for plan in plans(result.model):
            print(f"codecs {plan.codecs}, decisions {plan.decisions}")
        before, after = result.errors[: args.sharpen_at], result.errors[args.sharpen_at:]
        rows.append(
            f"| {accuracy} | {_worst(before):.4f} | {_worst(after):.4f}"
            f"{'' if len(result.errors) == args.steps else f' (diverged at step {len(result.errors) - 1})'} | "
            f"{result.sharpness[0]} -> {result.sharpness.get(args.sharpen_at)} | {replans} | {recompiles} | "
            f"{', '.join(codecs)} |"
        )
        raw[accuracy] = {"errors": result.errors, "sharpness": result.sharpness, "replans": replans,
                         "recompiles": recompiles, "codecs": codecs}
    if args.out:
        import json
        import os
        import sys

        header = [
            f"Command: `python bench/bench_sharp_attention.py {' '.join(sys.argv[1:])}`", "",
            f"Gradient error of the whole gradient against eager's (a lossless plan's), per step; the drift "
            f"({args.drift}, x{args.scale:g}) at step {args.sharpen_at} of {args.steps}. Re-plans: all plan changes; "
            "recompiles: those that compiled the graph again (a recalibration swaps codec parameters in place).", "",
            "| accuracy | worst error before | worst error after | attention mean max probability | re-plans "
            "| recompiles | codecs |",
            "|---|---:|---:|---|---:|---:|---|",
        ]
        with open(args.out, "w") as f:
            f.write("\n".join(header + rows) + "\n")
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
