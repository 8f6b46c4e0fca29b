"""`adacc plan` on the Llama-2-7B shape, timed as a user runs it.

    python bench/bench_cli_plan.py [--batches 1 2 4 8] [--gpus h100 h200]
        [--unfolded 1 8] [--out bench/results/cli_llama2_7b.md]

Each command runs in a fresh process (the ``adacc`` console script, cold:
imports, tracing under fake tensors, planning, the baselines), one after
another, with its wall time taken around the process. By default a deep
stack of identical blocks is traced with three blocks and planned at its
full depth (depth folding); ``--unfolded`` batches also run with
``--no-fold`` on the first GPU, tracing all 32 layers, and the report says
whether the two printed the same strategy table.

Writes the full output of every command and a summary table (wall seconds,
the phase times the report prints, each strategy's activation peak) to
``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import time

MODEL = "llama-2-7b"
SEQ = 4096
BUDGET = "60GiB"


def run(gpu: str, batch: int, fold: bool) -> dict:
    exe = shutil.which("adacc") or f"{sys.executable} -m adacc_compile"
    command = f"adacc plan {MODEL} --gpu {gpu} --budget {BUDGET} --batch {batch} --seq {SEQ}" + ("" if fold else " --no-fold")
    argv = exe.split() + command.split()[1:]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{command} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = done.stdout
    timing = re.search(r"traced in ([\d.]+) s .*planned in ([\d.]+) s \(MILP ([\d.]+) s", out)
    table = [line for line in out.splitlines() if re.match(r"  (adacc|no checkpointing|full AC|PyTorch memory)", line)]
    return {
        "command": command, "wall": wall, "output": out, "table": table,
        "trace": float(timing.group(1)) if timing else float("nan"),
        "plan": float(timing.group(2)) if timing else float("nan"),
        "milp": float(timing.group(3)) if timing else float("nan"),
        "peaks": [(re.findall(r"\d+\.\d+ [KMG]iB", line) + ["?", "?"])[1] for line in table],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--gpus", nargs="+", default=["h100", "h200"])
    parser.add_argument("--unfolded", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--out", default="bench/results/cli_llama2_7b.md")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    runs = []
    for gpu in args.gpus:
        for batch in args.batches:
            runs.append(run(gpu, batch, fold=True))
            print(f"{runs[-1]['command']}: {runs[-1]['wall']:.1f} s", flush=True)
            if gpu == args.gpus[0] and batch in args.unfolded:
                runs.append(run(gpu, batch, fold=False))
                print(f"{runs[-1]['command']}: {runs[-1]['wall']:.1f} s", flush=True)
    lines = [
        f"# `adacc plan` on {MODEL}, seq {SEQ}, budget {BUDGET}",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; `python bench/bench_cli_plan.py` "
        "(each command a fresh process, run one after another, wall time around the process).",
        "",
        "| command | wall s | traced in s | planned in s | MILP s | act. peak: adacc / no AC / full AC / PyTorch budget |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        lines.append(f"| `{r['command']}` | {r['wall']:.1f} | {r['trace']:.1f} | {r['plan']:.1f} | {r['milp']:.2f} | "
                     f"{' / '.join(r['peaks'])} |")
    folded = {r["command"]: r for r in runs if "--no-fold" not in r["command"]}
    same = []
    for r in runs:
        if "--no-fold" in r["command"]:
            twin = folded.get(r["command"].replace(" --no-fold", ""))
            if twin is not None:
                differ = [a.split("  ")[1].strip() if "  " in a else a for a, b in zip(twin["table"], r["table"]) if a != b]
                same.append(f"- `{twin['command']}` and its `--no-fold` run printed "
                            + ("the same strategy table, to the last digit." if not differ else
                               f"different rows for: {', '.join(differ)} (the rest identical; outputs below)."))
    lines += ["", *same, "", "## Outputs", ""]
    for r in runs:
        lines += [f"### `{r['command']}` ({r['wall']:.1f} s)", "", "```", r["output"].rstrip(), "```", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
