"""Where a GPU training step's memory goes, against what adacc predicted.

    python bench/gpu_memory_probe.py --models llama gpt --budget 0.8   # one GPU, ~2 minutes
    python bench/gpu_memory_probe.py --smoke                           # tiny sizes, CPU-only checks

Why: on an H200 (bench/RESULTS.md, 2026-12-04) adacc's simulator, fitted
to Inductor's CPU code, over-predicted the step peak of its @0.8 plans by
47-48%, so on a GPU the budget does not yet bound the real peak. Fixing
the memory model needs to know which buffers are live at the real peak,
and that takes a GPU. For each model (the `gpu_check` sizes) this compiles
no checkpointing and adacc lossless at ``--budget`` and, for one training
step after warm-up, writes under ``--out`` (default: env ``OUT``):

    <model>_<variant>.pickle     the CUDA allocator's trace of that step with
                                 Python stacks (`compat_memory.cuda_memory_snapshot`;
                                 opens in pytorch.org/memory_viz); each
                                 Inductor buffer's stack ends at the line of
                                 the generated wrapper that allocates it
    code/                        those generated wrapper files, so the lines
                                 can be read offline
    dump_<model>/                adacc's dumps of the plan (plan.json,
                                 memory_timeline.json, summary.json, ...)
    memory_probe.json            measured peak above the weights, adacc's
                                 predicted peak, per variant
    codec_code/<codec>.py        with ``--codec-code``: Inductor's generated
                                 compress and decompress of those codecs

Without a GPU (``--smoke``) only the measured and predicted peaks are
written (no allocator trace exists on the CPU), which keeps the script
runnable in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import shutil
import sys
import time
from typing import Any

import torch

import gpu_check
from adacc_compile import compat_inductor, compat_memory
from adacc_compile.config import AdaccConfig
from adacc_compile.partitioner import AdaccPartitioner


def _inductor_files(snapshot: dict[str, Any]) -> set[str]:
    """Generated-code files named in the trace's stacks."""
    files = set()
    for device_trace in snapshot.get("device_traces", []):
        for event in device_trace:
            for frame in event.get("frames", []):
                name = frame.get("filename", "")
                if "torchinductor" in name and name.endswith(".py"):
                    files.add(name)
    return files


def probe(
    model_name: str, variant: str, sizes: gpu_check.Sizes, device: torch.device, budget: float, out: pathlib.Path
) -> dict[str, Any]:
    """One variant's step: measured peak above the weights, adacc's
    prediction, and (on a GPU) the allocator trace."""
    model, batches = gpu_check.build_model(model_name, sizes, device)
    partitioner = None
    if variant == "adacc":
        options = {
            "memory_budget": budget,
            "accuracy": "lossless",
            "device_profile": "auto" if device.type == "cuda" else "h100",
            "dump_dir": str(out / f"dump_{model_name}"),
        }
        partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
        fn = torch.compile(model, backend=partitioner.backend())
    else:
        fn = torch.compile(model, backend="inductor")
    start = time.perf_counter()
    for batch in batches:  # the first compiles
        model.zero_grad(set_to_none=True)
        fn(*batch).backward()
    compile_s = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    record = {"model": model_name, "variant": variant, "compile_s": round(compile_s, 1)}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        compat_memory.record_cuda_memory_history(True)
        fn(*batches[0]).backward()
        torch.cuda.synchronize(device)
        snapshot = compat_memory.cuda_memory_snapshot()
        compat_memory.record_cuda_memory_history(False)
        record["measured_peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
        record["base_bytes"] = base
        with open(out / f"{model_name}_{variant.replace(' ', '_')}.pickle", "wb") as handle:
            pickle.dump(snapshot, handle)
        code = out / "code"
        code.mkdir(exist_ok=True)
        for name in _inductor_files(snapshot):
            shutil.copy(name, code / os.path.basename(name))
    else:
        from adacc_compile.measure import measure_peak_bytes

        record["measured_peak_bytes"] = measure_peak_bytes(lambda: fn(*batches[0]).backward(), device)
    if partitioner is not None and partitioner.reports:
        summaries = [r["summary"] for r in partitioner.reports]
        record["predicted_peak_bytes"] = sum(s["predicted_peak_bytes"] for s in summaries)
        record["planned_saved_bytes"] = sum(s["planned_saved_bytes"] for s in summaries)
    torch._dynamo.reset()
    return record


def codec_code(names: list[str], device: torch.device, out: pathlib.Path) -> None:
    """Inductor's generated code for each codec's compress (with calibrated
    parameters where it takes them: what a calibrated plan runs) and
    decompress on ``device``, on the `gpu_check` sample value, written to
    ``codec_code/<codec>.py``: where a codec kernel loses time against a
    copy is read there."""
    from adacc_compile.kernels import get_codec
    from adacc_compile.kernels.aten_graphs import codec_graphs

    folder = out / "codec_code"
    folder.mkdir(exist_ok=True)
    shape = (64, 256) if device.type == "cpu" else gpu_check.FULL.codec_shape
    for name in names:
        codec = get_codec(name)
        x = gpu_check.codec_sample(name, shape, device)
        parameters = codec.calibration_parameters(x)
        inputs = [x] if parameters is None else [x, parameters]
        graphs = codec_graphs(codec, x, parameters)
        payload: list[torch.Tensor] = []

        def compile_and_run() -> None:
            payload.extend(compat_inductor.inductor_compile_inference(graphs.compress, inputs)(*inputs))
            compat_inductor.inductor_compile_inference(graphs.decompress, payload)(*payload)

        sources = compat_inductor.generated_code(compile_and_run)
        (folder / f"{name}.py").write_text("\n\n# ---- next module ----\n\n".join(sources))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU is fine)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--models", nargs="*", default=["llama", "gpt"], choices=["gpt", "llama"])
    parser.add_argument("--budget", type=float, default=0.8)
    parser.add_argument("--codec-code", nargs="*", default=[], help="codecs whose generated code to write")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    sizes = gpu_check.SMOKE if args.smoke else gpu_check.FULL
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.codec_code:
        codec_code(args.codec_code, device, out)
    records = []
    for model_name in args.models:
        for variant in ("no checkpointing", "adacc"):
            try:
                records.append(probe(model_name, variant, sizes, device, args.budget, out))
            except Exception as exc:  # noqa: BLE001  (a borrowed GPU: record and go on)
                records.append({"model": model_name, "variant": variant, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(json.dumps(records[-1]), flush=True)
            report = {"machine": gpu_check.machine_line(device), "records": records}
            (out / "memory_probe.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
