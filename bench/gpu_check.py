"""The GPU check: codec kernels and whole training steps on one GPU, one command.

    python bench/gpu_check.py              # one GPU, under 8 minutes (H200 sized)
    python bench/gpu_check.py --smoke      # tiny sizes; runs on CPU too (tests)

Writes ``gpu_check.md`` (and ``gpu_check.json``) to ``--out`` (default: env
``OUT``, else the current directory), rewritten after every section so a run
cut short still leaves what it measured.

1. **Codec kernels.** For every codec (bfloat16 values; bool for bitmask):
   the hand-written Triton kernels (the custom ops under
   ``ADACC_KERNELS=triton``) and the aten form compiled by Inductor (what a
   compiled plan runs) against the torch reference: payload and
   decompressed value bit for bit (any NaN equals any NaN), else how many
   elements differ. Then compress and decompress time of each form as a
   fraction of a device copy of the value (copy time / codec time: 1.0
   means copy speed), and which form is faster: what `codec_form` would
   pick from a measured profile.
2. **Training steps.** GPT- and Llama-style models of a few hundred million
   parameters in bfloat16: step time (median of interleaved repeats) and
   ``torch.cuda.max_memory_allocated`` above the weights, under no
   checkpointing, full activation checkpointing, PyTorch's
   ``activation_memory_budget`` partitioner and adacc lossless / balanced,
   at each of ``--budgets`` (`adacc_examples.benchmarking.run_variants`).

On a GPU the codec section and each model run side by side, each in a
process of its own (``--jobs``; ``--jobs 1`` runs them in turn): they
compile in parallel on the CPUs and take turns at the GPU for every timing
and peak measurement. Their logs, ``parts/<part>.log`` under ``--out``, say
where two forms' bits differ. A codec or variant that fails is reported in
its table and the rest go on.

``--time-budget-s`` (default 450) stops starting new work once spent; the
skipped parts are listed in the output. Without a GPU (``--smoke`` on CPU)
the Triton column needs ``TRITON_INTERPRET=1`` set before start, else it
reads "n/a".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from adacc_compile import compat_inductor
import _examples_path  # noqa: F401  (examples/ on sys.path)
from adacc_examples.benchmarking import Variant, error_line, results_table, run_variants
from adacc_compile.kernels import available_codecs, get_codec
from adacc_compile.kernels.aten_graphs import codec_graphs
from adacc_compile.kernels.oplib import is_interpreted, triton_available
from adacc_examples.models import GPT, GPTConfig, Llama, LlamaConfig, count_parameters, gpt_batch, init_weights

LOCK_ENV = "ADACC_GPU_CHECK_LOCK"

# --------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizes:
    codec_shape: tuple[int, int]
    gpt: GPTConfig
    llama: LlamaConfig
    batch: int
    steps: int
    """Training steps before timing (the first compiles)."""
    timing_repeats: int


FULL = Sizes(
    codec_shape=(8192, 4096),
    gpt=GPTConfig(vocab_size=32000, seq_len=1024, n_layer=2, n_head=16, d_model=2048, dropout=0.1),
    llama=LlamaConfig(vocab_size=32000, seq_len=1024, n_layer=2, n_head=16, d_model=2048, ffn_dim=5632),
    batch=4,
    steps=2,
    timing_repeats=5,
)
SMOKE = Sizes(
    codec_shape=(64, 256),
    gpt=GPTConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=2, d_model=32, dropout=0.1),
    llama=LlamaConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=2, d_model=32, ffn_dim=64),
    batch=2,
    steps=2,
    timing_repeats=2,
)


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------


@dataclass(slots=True)
class Report:
    """Markdown + JSON under ``out``, rewritten after every section."""

    out: pathlib.Path
    stem: str = "gpu_check"
    sections: list[str] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add(self, markdown: str, key: str | None = None, value: Any = None) -> None:
        self.sections.append(markdown)
        if key is not None:
            self.data[key] = value
        print(markdown, flush=True)
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{self.stem}.md").write_text("\n\n".join(self.sections) + "\n")
        (self.out / f"{self.stem}.json").write_text(json.dumps(self.data, indent=1, default=str))


def machine_line(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    triton = "none"
    if triton_available():
        import triton

        triton = triton.__version__
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{stamp}, {device.type} ({name}), torch {torch.__version__}, triton {triton}, {torch.get_num_threads()} CPU threads"


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """Holds the GPU for one measurement: with ``--jobs`` > 1 the codec
    section and each model run in their own processes, which compile side
    by side on the CPUs but take turns at timing and peak measurement
    (an exclusive lock on the file named by env ``ADACC_GPU_CHECK_LOCK``)."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------
# 1. codec kernels
# --------------------------------------------------------------------------


def _differing(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks of the elements (same shape and dtype) whose values differ and
    of those equal but for the sign of a zero; any NaN equals any NaN."""
    if not a.is_floating_point():
        return a != b, torch.zeros_like(a, dtype=torch.bool)
    nan_a, nan_b = a.isnan(), b.isnan()
    value = (nan_a != nan_b) | (~nan_a & ~nan_b & (a != b))
    return value, ~nan_a & ~nan_b & (a == b) & (a.signbit() != b.signbit())


def same(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, int, int]:
    """(identical, number of differing elements, how many of those differ
    only in the sign of a zero)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, max(a.numel(), b.numel()), 0
    value, sign = _differing(a, b)
    count, zeros = int((value | sign).sum()), int(sign.sum())
    return count == 0, count, zeros


def describe_difference(label: str, got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, first: int = 4) -> str:
    """Where two forms' outputs differ: count, largest difference and the
    first few positions (with the input value where the shapes match), for
    the log of a run on a borrowed GPU that cannot be repeated at will."""
    got, want, x = got.detach().cpu(), want.detach().cpu(), x.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{label}: {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}"
    g, w = got.reshape(-1).double(), want.reshape(-1).double()
    value, sign = _differing(g, w)
    differ = value | sign
    where = differ.nonzero().flatten()
    if where.numel() == 0:
        return f"{label}: same"
    finite = differ & g.isfinite() & w.isfinite()
    largest = float((g[finite] - w[finite]).abs().max()) if finite.any() else float("nan")
    flat_x = x.reshape(-1).double() if x.numel() == got.numel() else None
    shown = []
    for i in where[:first].tolist():
        pos = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), got.shape))
        shown.append(f"{pos} got {g[i].item():.9g} want {w[i].item():.9g}"
                     + (f" (x {flat_x[i].item():.9g})" if flat_x is not None else ""))
    return f"{label}: {where.numel()} of {g.numel()} differ, max |diff| {largest:.3g}; " + "; ".join(shown)


def _verdict(results: Sequence[tuple[bool, int, int]]) -> str:
    """"exact"; "exact but the sign of N zeros" when only signed zeros
    differ; else "differs: " and the count per output (payload...,
    decompressed)."""
    if all(ok for ok, _, _ in results):
        return "exact"
    if all(count == zeros for _, count, zeros in results):
        return f"exact but the sign of {sum(z for _, _, z in results)} zeros"
    return "differs: " + ", ".join(str(n) for _, n, _ in results)


def codec_sample(name: str, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """A realistic value of the kind each codec is offered for, with NaN and
    ±Inf planted (they must survive every form alike)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    if name == "bitmask":
        return (x > 0.1).to(device)
    if name == "softmax_u8":
        x = (3 * x).softmax(-1)
    else:
        x[:, 7] *= 40  # an outlier channel
    x = x.to(torch.bfloat16)
    flat = x.view(-1)
    flat[1], flat[5], flat[9], flat[13] = float("nan"), float("inf"), float("-inf"), -0.0
    return x.to(device)


def device_seconds(fn: Callable[[], object], device: torch.device, *, inner: int, repeats: int = 5) -> float:
    """Fastest of ``repeats`` timings of ``inner`` back-to-back calls, per call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            best = min(best, (time.perf_counter() - t0) / inner)
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecCheck:
    codec: str
    dtype: str
    triton_vs_reference: str
    inductor_vs_reference: str
    copy_gbps: float
    triton_compress: float | None
    triton_decompress: float | None
    inductor_compress: float
    inductor_decompress: float
    error: str | None = None

    @property
    def faster(self) -> str:
        if self.error is not None:
            return "n/a"
        if self.triton_compress is None or self.triton_decompress is None:
            return "inductor (only form timed)"
        triton = 1 / self.triton_compress + 1 / self.triton_decompress  # in copy times
        inductor = 1 / self.inductor_compress + 1 / self.inductor_decompress
        return "triton" if triton < inductor else "inductor"


def triton_runs_here(device: torch.device) -> bool:
    if not triton_available():
        return False
    if device.type == "cuda":
        return True
    from adacc_compile.kernels import fp8

    return is_interpreted(fp8._fp8_compress_kernel)


def compare(
    codec: str, form: str, outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], x: torch.Tensor
) -> str:
    """``form``'s outputs (payload..., decompressed) against the reference's:
    the verdict for the table; where they differ, also prints where
    (`describe_difference`) and each decompressed value's relative error."""
    verdict = _verdict([same(g, w) for g, w in zip(outputs, reference)])
    if verdict == "exact":
        return verdict
    labels = [f"payload[{i}]" for i in range(len(outputs) - 1)] + ["decompressed"]
    for label, g, w in zip(labels, outputs, reference):
        print(f"{codec} {form} {describe_difference(label, g, w, x)}")
    if x.is_floating_point():
        finite = x.isfinite()
        norm = float(x[finite].float().norm())
        errors = [float((v[finite].float() - x[finite].float()).norm()) / max(norm, 1e-30) for v in (outputs[-1], reference[-1])]
        print(f"{codec} {form} relative error vs x: {errors[0]:.6g} (reference {errors[1]:.6g})", flush=True)
    return verdict


def check_codec(name: str, shape: tuple[int, int], device: torch.device, inner: int) -> CodecCheck:
    codec = get_codec(name)
    x = codec_sample(name, shape, device)
    dims = list(x.shape)
    os.environ["ADACC_KERNELS"] = "torch"
    reference = list(codec.compress_op(x))
    expected = codec.decompress_op(reference, dims, x.dtype)
    graphs = codec_graphs(codec, x)
    compress = compat_inductor.inductor_compile_inference(graphs.compress, [x])
    decompress = compat_inductor.inductor_compile_inference(graphs.decompress, reference)
    payload = list(compress(x))
    (restored,) = decompress(*reference)
    inductor_verdict = compare(name, "inductor", payload + [restored], reference + [expected], x)
    triton_verdict = "n/a (no Triton here)"
    triton = triton_runs_here(device)
    if triton:
        os.environ["ADACC_KERNELS"] = "triton"
        t_payload = list(codec.compress_op(x))
        t_restored = codec.decompress_op(reference, dims, x.dtype)
        triton_verdict = compare(name, "triton", t_payload + [t_restored], reference + [expected], x)
    with measuring():
        copy = device_seconds(lambda: x.clone(), device, inner=inner)
        timings: dict[str, float | None] = {
            "inductor_compress": copy / device_seconds(lambda: compress(x), device, inner=inner),
            "inductor_decompress": copy / device_seconds(lambda: decompress(*reference), device, inner=inner),
            "triton_compress": None,
            "triton_decompress": None,
        }
        if triton:
            timings["triton_compress"] = copy / device_seconds(lambda: codec.compress_op(x), device, inner=inner)
            timings["triton_decompress"] = copy / device_seconds(
                lambda: codec.decompress_op(reference, dims, x.dtype), device, inner=inner
            )
    os.environ["ADACC_KERNELS"] = "auto"
    return CodecCheck(
        codec=name,
        dtype=str(x.dtype).removeprefix("torch."),
        triton_vs_reference=triton_verdict,
        inductor_vs_reference=inductor_verdict,
        copy_gbps=2 * x.numel() * x.element_size() / copy / 1e9,
        **timings,  # type: ignore[arg-type]
    )


#: Row label of a codec's compress with calibrated parameters.
CALIBRATED = " (calibrated)"


def check_calibrated_codec(name: str, shape: tuple[int, int], device: torch.device, inner: int) -> CodecCheck | None:
    """The compress a calibrated plan runs (parameters measured beforehand,
    a graph input), compiled for ``device``, against the same aten form run
    eagerly on the CPU (which the CPU tests hold bit-exact to the torch
    reference with those parameters); beside it the codec's hand-written
    Triton compress with the same parameters (`Codec.triton_calibrated_compress`,
    one read of the value), where it has one; None for a codec that takes
    none. The decompress is the codec's own (timed in its plain row)."""
    codec = get_codec(name)
    x = codec_sample(name, shape, device)
    parameters = codec.calibration_parameters(x)
    if parameters is None:
        return None
    graphs = codec_graphs(codec, x, parameters)
    compress = compat_inductor.inductor_compile_inference(graphs.compress, [x, parameters])
    payload = list(compress(x, parameters))
    reference = codec.aten_compress(x.cpu(), parameters.cpu())
    verdict = _verdict([same(g, w) for g, w in zip(payload, reference)])
    if verdict != "exact":
        for i, (g, w) in enumerate(zip(payload, reference)):
            print(f"{name}{CALIBRATED} inductor {describe_difference(f'payload[{i}]', g, w, x)}", flush=True)
    triton_verdict, triton = "n/a (no Triton here)", None
    if triton_runs_here(device):
        triton = codec.triton_calibrated_compress(x, parameters)
        triton_verdict = "n/a (per call only)" if triton is None else _verdict(
            [same(g, w) for g, w in zip(triton, reference)]
        )
    with measuring():
        copy = device_seconds(lambda: x.clone(), device, inner=inner)
        speed = copy / device_seconds(lambda: compress(x, parameters), device, inner=inner)
        triton_speed = None if triton is None else copy / device_seconds(
            lambda: codec.triton_calibrated_compress(x, parameters), device, inner=inner
        )
    return CodecCheck(
        codec=name + CALIBRATED, dtype=str(x.dtype).removeprefix("torch."), triton_vs_reference=triton_verdict,
        inductor_vs_reference=verdict, copy_gbps=2 * x.numel() * x.element_size() / copy / 1e9,
        triton_compress=triton_speed, triton_decompress=None, inductor_compress=speed,
        inductor_decompress=float("nan"),
    )


def check_codec_or_error(
    name: str, shape: tuple[int, int], device: torch.device, inner: int, *, calibrated: bool = False
) -> CodecCheck | None:
    """`check_codec` (`check_calibrated_codec` with ``calibrated``), or a
    row that says why it failed: one codec's failure must not cost the rest
    of a run on a borrowed GPU."""
    try:
        if calibrated:
            return check_calibrated_codec(name, shape, device, inner)
        return check_codec(name, shape, device, inner)
    except Exception as exc:  # noqa: BLE001  (reported in the table)
        traceback.print_exc()
        os.environ["ADACC_KERNELS"] = "auto"
        return CodecCheck(
            codec=name + (CALIBRATED if calibrated else ""), dtype="", triton_vs_reference="",
            inductor_vs_reference="", copy_gbps=float("nan"),
            triton_compress=None, triton_decompress=None, inductor_compress=float("nan"),
            inductor_decompress=float("nan"), error=error_line(exc),
        )


def codec_table(checks: Sequence[CodecCheck]) -> str:
    def fmt(v: float | None) -> str:
        return "n/a" if v is None or v != v else f"{v:.3g}"

    rows = [
        "| codec | dtype | Triton = reference | Inductor = reference | copy GB/s | Triton compress | Triton decompress "
        "| Inductor compress | Inductor decompress | faster |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in checks:
        if c.error is not None:
            rows.append(f"| {c.codec} | failed: {c.error.replace('|', '/')} |  |  |  |  |  |  |  |  |")
            continue
        rows.append(
            f"| {c.codec} | {c.dtype} | {c.triton_vs_reference} | {c.inductor_vs_reference} | {c.copy_gbps:.0f} "
            f"| {fmt(c.triton_compress)} | {fmt(c.triton_decompress)} | {fmt(c.inductor_compress)} "
            f"| {fmt(c.inductor_decompress)} | {c.faster} |"
        )
    return "\n".join(rows)


# --------------------------------------------------------------------------
# 2. training steps
# --------------------------------------------------------------------------


def model_variants(budgets: Sequence[float], device_profile: str) -> list[Variant]:
    variants = [Variant(name="no checkpointing", kind="inductor"), Variant(name="full AC", kind="full_ac")]
    for budget in budgets:
        variants.append(Variant(name=f"torch budget @{budget:g}", kind="torch_budget", budget=budget, solver="dp"))
    for accuracy in ("lossless", "balanced"):
        for budget in budgets:
            variants.append(
                Variant(
                    name=f"adacc {accuracy} @{budget:g}",
                    kind="adacc",
                    options={"memory_budget": budget, "accuracy": accuracy, "device_profile": device_profile},
                )
            )
    return variants


def build_model(name: str, sizes: Sizes, device: torch.device) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, ...]]]:
    cfg = sizes.gpt if name == "gpt" else sizes.llama
    model = init_weights(GPT(cfg) if name == "gpt" else Llama(cfg))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = model.to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    batches = [tuple(t.to(device) for t in gpt_batch(cfg, sizes.batch, gen)) for _ in range(sizes.steps)]
    return model, batches


def model_section(
    name: str, sizes: Sizes, device: torch.device, budgets: Sequence[float], device_profile: str
) -> tuple[str, Any]:
    model, batches = build_model(name, sizes, device)
    params = count_parameters(model)
    cfg = sizes.gpt if name == "gpt" else sizes.llama
    start = time.perf_counter()
    results = run_variants(
        model,
        batches,
        model_variants(budgets, device_profile),
        timing_repeats=sizes.timing_repeats,
        device=device.type,
        measuring=measuring,
        keep_going=True,
    )
    dtype = next(model.parameters()).dtype
    head = (
        f"### {name}: {params / 1e6:.0f} M parameters, {cfg.n_layer} layers, d_model {cfg.d_model}, "
        f"seq {cfg.seq_len}, batch {sizes.batch}, {str(dtype).removeprefix('torch.')} "
        f"({time.perf_counter() - start:.0f} s)\n\n"
        "peak = max allocated during one step above what was allocated before it (the weights); "
        "ratios against no checkpointing.\n\n"
    )
    data = [dataclasses.asdict(r) | {"median_step_seconds": r.median_step_seconds} for r in results]
    for row in data:
        row.pop("reports", None)
    return head + results_table(results), data


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def model_section_or_error(
    name: str, sizes: Sizes, device: torch.device, budgets: Sequence[float], device_profile: str
) -> tuple[str, Any]:
    """`model_section`, or a heading that says why it failed."""
    try:
        return model_section(name, sizes, device, budgets, device_profile)
    except Exception as exc:  # noqa: BLE001  (reported in the output)
        traceback.print_exc()
        return f"### {name}: failed: {error_line(exc)}", {"error": error_line(exc)}


def codec_section(names: Sequence[str], sizes: Sizes, device: torch.device, in_time: Callable[..., bool]) -> tuple[str, Any]:
    inner = 20 if device.type == "cuda" else 3
    checks = []
    for name in names:
        for calibrated in (False, True):
            if in_time(f"codec {name}" + (CALIBRATED if calibrated else "")):
                check = check_codec_or_error(name, sizes.codec_shape, device, inner, calibrated=calibrated)
                checks += [] if check is None else [check]
    shape = "x".join(map(str, sizes.codec_shape))
    markdown = (
        f"## Codec kernels ({shape})\n\nTriton / Inductor columns: copy time / codec time (1.00 = as fast as "
        f"copying the value).\n\n" + codec_table(checks)
    )
    return markdown, [dataclasses.asdict(c) | {"faster": c.faster} for c in checks]


def run_parts_side_by_side(args: argparse.Namespace, argv: Sequence[str], report: Report, started: float) -> list[str]:
    """The codec section and each model in a process of its own (``--part``):
    they compile side by side on the CPUs and take turns at the GPU for
    every measurement (`measuring`). Each part's output goes to
    ``<out>/parts/<part>.log``; a part still running ``--hard-stop-s``
    after the start is killed and reported as such. Returns what was
    skipped or stopped."""
    out = pathlib.Path(args.out)
    parts_dir = out / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    lock = tempfile.NamedTemporaryFile(prefix="gpu_check_", suffix=".lock", delete=False)
    lock.close()
    env = {**os.environ, LOCK_ENV: lock.name, "PYTHONUNBUFFERED": "1"}
    parts = (["codecs"] if args.codecs != [] else []) + list(args.models)
    running: dict[str, subprocess.Popen[bytes]] = {}
    for part in parts:
        with open(parts_dir / f"{part}.log", "wb") as log:
            command = [sys.executable, str(pathlib.Path(__file__).resolve()), *argv,
                       "--jobs", "1", "--part", part, "--out", str(parts_dir)]
            running[part] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    missing: list[str] = []
    for part, process in running.items():
        try:
            process.wait(timeout=max(1.0, started + args.hard_stop_s - time.perf_counter()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        markdown, data = parts_dir / f"{part}.md", parts_dir / f"{part}.json"
        if data.exists():
            values = json.loads(data.read_text())
            report.sections.append(markdown.read_text().strip())
            report.data.update({k: v for k, v in values.items() if k != "skipped"})
            missing.extend(values.get("skipped", []))
            report.write()
        else:
            missing.append(f"{part} (exit code {process.returncode}; see parts/{part}.log)")
        markdown.unlink(missing_ok=True)
        data.unlink(missing_ok=True)
    os.unlink(lock.name)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU is fine)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="output folder (default: $OUT or .)")
    parser.add_argument("--codecs", nargs="*", default=None, help="subset of codecs (default: all; none: skip them)")
    parser.add_argument("--models", nargs="*", default=["gpt", "llama"], choices=["gpt", "llama"],
                        help="models to train (none: the codec section only)")
    parser.add_argument("--budgets", nargs="*", type=float, default=[0.5, 0.25])
    parser.add_argument("--time-budget-s", type=float, default=450.0,
                        help="start nothing new past this; a model is skipped when the previous one's "
                        "duration would overrun it")
    parser.add_argument("--hard-stop-s", type=float, default=None,
                        help="with --jobs > 1: kill parts still running this long after the start "
                        "(default: time budget + 90 s)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes: >1 runs the codec section and each model side by side, "
                        "measuring in turns (default: one per part on a GPU, 1 with --smoke)")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device-profile", default=None,
                        help="adacc's cost model (default: auto on a GPU, h100 with --smoke: a CPU "
                        "profile would compile and time every codec first)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        print("no GPU here: use --smoke for a CPU run", file=sys.stderr)
        return 2
    sizes = SMOKE if args.smoke else FULL
    profile = args.device_profile or ("h100" if args.smoke else "auto")
    skipped: list[str] = []

    def in_time(what: str, expected_s: float = 0.0) -> bool:
        if time.perf_counter() - started + expected_s < args.time_budget_s:
            return True
        skipped.append(what)
        return False

    if args.part is not None:  # one part, for run_parts_side_by_side
        report = Report(pathlib.Path(args.out), stem=args.part)
        if args.part == "codecs":
            text, data = codec_section(args.codecs or available_codecs(), sizes, device, in_time)
        else:
            text, data = model_section_or_error(args.part, sizes, device, args.budgets, profile)
        report.data["skipped"] = skipped
        report.add(text, "codecs" if args.part == "codecs" else f"model_{args.part}", data)
        return 0

    report = Report(pathlib.Path(args.out))
    report.add(f"# GPU check\n\n{machine_line(device)}; command: `python bench/gpu_check.py {' '.join(argv)}`",
               "machine", machine_line(device))
    jobs = args.jobs or (1 if args.smoke or device.type != "cuda" else 1 + len(args.models))
    if jobs > 1:
        if args.hard_stop_s is None:
            args.hard_stop_s = args.time_budget_s + 90.0
        skipped += run_parts_side_by_side(args, argv, report, started)
    else:
        if args.codecs != []:
            text, data = codec_section(args.codecs or available_codecs(), sizes, device, in_time)
            report.add(text, "codecs", data)
        last_model_s = 0.0
        for name in args.models:
            if in_time(f"model {name}", expected_s=last_model_s):
                model_start = time.perf_counter()
                text, data = model_section_or_error(name, sizes, device, args.budgets, profile)
                report.add(text, f"model_{name}", data)
                last_model_s = time.perf_counter() - model_start
    total = time.perf_counter() - started
    mode = f"{jobs} processes side by side, measuring in turns" if jobs > 1 else "one process"
    tail = f"Total {total:.0f} s ({mode})." + (f" Skipped or stopped: {', '.join(skipped)}." if skipped else "")
    report.add(tail, "seconds", total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
