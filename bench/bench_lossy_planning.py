"""Planning time of a lossy plan against depth: calibration and the plan
stage of ``accuracy="balanced"`` on an HF Llama at several depths.

    python bench/bench_lossy_planning.py [--layers 4 16 32] [--budget 0.5] [--out FILE.md]

Why: a lossy plan measures its codec options on the real batch before it
plans (`passes.calibrate`, `passes.gradient_sensitivity`), and that work
once grew with every layer. The model is `gpu_step`'s CPU size (d_model
256, 4/2 heads, SwiGLU 688, vocab 512, seq 128, batch 4, random weights)
at each depth, compiled with ``backend="adacc_eager"`` (planning without
Inductor's code generation) and the H100 cost model; one process per
depth is not needed (each compile is its own partitioner). Reported per
depth: the first step's wall time (Dynamo, AOTAutograd, planning), the
calibrate and plan stages' seconds, the values calibrated and how many
took another block's verdict (``stand_ins``), the rejected options, the
block classes, the MILP's rows, and the codecs the plan uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import platform
import sys
import time
from typing import Any

import torch

import _examples_path  # noqa: F401  (examples/ on sys.path)
import gpu_step
from adacc_compile.config import AdaccConfig
from adacc_compile.partitioner import AdaccPartitioner


def plan_once(layers: int, budget: float, accuracy: str) -> dict[str, Any]:
    sizes = dataclasses.replace(gpu_step.SIZES["cpu4"], layers=layers)
    model, batches = gpu_step.build_model(sizes, torch.device("cpu"))
    ids, labels = batches[0]
    partitioner = AdaccPartitioner(AdaccConfig.from_options(
        {"memory_budget": budget, "accuracy": accuracy, "device_profile": "h100"}))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=partitioner.backend(eager=True))
    start = time.perf_counter()
    compiled(ids, labels).backward()
    seconds = time.perf_counter() - start
    summary = partitioner.reports[0]["summary"]
    calibration = summary["calibration"]
    return {
        "layers": layers,
        "first_step_s": seconds,
        "calibrate_s": summary["stage_seconds"]["calibrate"],
        "plan_s": summary["stage_seconds"]["plan"],
        "values": calibration.get("values", 0),
        "stand_ins": calibration.get("stand_ins", 0),
        "rejected": len(calibration.get("rejected", [])),
        "classes": summary["block_reuse"]["classes"],
        "blocks": summary["block_reuse"]["blocks"],
        "rows": summary["planning"]["rows"],
        "codecs": summary["codecs"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", nargs="+", type=int, default=[4, 16, 32])
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--accuracy", default="balanced")
    parser.add_argument("--out", default=None, help="markdown file (a .json beside it)")
    args = parser.parse_args(argv)
    rows = [plan_once(n, args.budget, args.accuracy) for n in args.layers]
    command = "python bench/bench_lossy_planning.py " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "command": command, "budget": args.budget, "accuracy": args.accuracy,
    }
    lines = [
        f"# Lossy planning against depth ({meta['date']})", "", f"`{command}`", "", meta["machine"], "",
        "| layers | first step s | calibrate s | plan s | values | stand-ins | rejected | classes x blocks | MILP rows | codecs |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        codecs = ", ".join(f"{k} {v}" for k, v in sorted(r["codecs"].items()))
        lines.append(
            f"| {r['layers']} | {r['first_step_s']:.1f} | {r['calibrate_s']:.1f} | {r['plan_s']:.1f} | {r['values']} "
            f"| {r['stand_ins']} | {r['rejected']} | {r['classes']} x {r['blocks']} | {r['rows']} | {codecs} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = pathlib.Path(args.out)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
