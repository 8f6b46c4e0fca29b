"""`adacc plan` without ``--budget``: will the job fit, timed as a user runs it.

    python bench/bench_job_fit.py [--models llama-2-7b llama-3-8b llama-2-70b]
        [--setups 1 8-fsdp] [--batch 2] [--seq 4096] [--gpu h100] [--tag T]

Each command (``adacc plan MODEL --gpu GPU --batch B --seq S --optimizer
adamw --json``, with ``--gpus 8 --fsdp`` for the ``8-fsdp`` setup) runs in
a fresh process, cold, one after another; its wall time is taken around
the process. The table gives the answer (fits or not, one rank's total
against the GPU's memory, the parts) and the time to answer (goal: under
60 s on this 2-core CPU).

Writes bench/results/job_fit{tag}.md and .json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import shutil
import subprocess
import sys
import time

GIB = 1 << 30


def run(model: str, setup: str, args: argparse.Namespace) -> dict:
    exe = shutil.which("adacc") or f"{sys.executable} -m adacc_compile"
    command = f"plan {model} --gpu {args.gpu} --batch {args.batch} --seq {args.seq} --optimizer adamw --json"
    if setup != "1":
        ranks = setup.split("-")[0]
        command += f" --gpus {ranks}" + (" --fsdp" if setup.endswith("fsdp") else "")
    start = time.perf_counter()
    done = subprocess.run(exe.split() + command.split(), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"model": model, "setup": setup, "command": f"adacc {command}", "wall_seconds": wall,
                "error": done.stderr.strip().splitlines()[-1:]}
    return {"model": model, "setup": setup, "command": f"adacc {command}", "wall_seconds": wall,
            **json.loads(done.stdout)}


def table(rows: list[dict]) -> str:
    lines = [
        "| model | GPUs | fits | one rank's total / GPU (GiB) | weights | gradients | optimizer | in flight "
        "| activations (plan) | optimizer step beyond | reserve | largest batch | time to answer (s) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['setup']} | error: {r['error']} | | | | | | | | | | {r['wall_seconds']:.1f} |")
            continue
        g = lambda key: f"{r[key] / GIB:.2f}"  # noqa: E731
        lines.append(
            f"| {r['model']} | {r['setup']} | {'yes' if r['fits_gpu'] else 'no'} | "
            f"{r['total_peak_bytes'] / GIB:.2f} / {r['gpu_capacity_bytes'] / GIB:.2f} | {g('weights_bytes')} | "
            f"{g('gradients_bytes')} | {g('optimizer_state_bytes')} | {g('unsharded_in_flight_bytes')} | "
            f"{g('activation_peak_bytes')} | {g('optimizer_step_excess_bytes')} | {g('reserve_bytes')} | "
            f"{r['largest_batch']} | {r['wall_seconds']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama-2-7b", "llama-3-8b", "llama-2-70b"])
    parser.add_argument("--setups", nargs="+", default=["1", "8-fsdp"], help="1, or N-fsdp")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    rows = []
    for model in args.models:
        for setup in args.setups:
            rows.append(run(model, setup, args))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    header = (
        f"# adacc plan without --budget: will the job fit ({datetime.date.today()}, {platform.machine()}, "
        f"{platform.processor() or 'cpu'})\n\nGPU {args.gpu}, batch {args.batch} x seq {args.seq}, AdamW, "
        "fp32 parameters and states (fp32-master), activations bf16. Each command in a fresh process.\n\n"
    )
    out = pathlib.Path(args.out_dir)
    (out / f"job_fit{args.tag}.md").write_text(header + table(rows) + "\n\nCommands:\n\n" + "\n".join(
        f"    {r['command']}" for r in rows) + "\n")
    (out / f"job_fit{args.tag}.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {out / f'job_fit{args.tag}.md'}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
