"""Shared plumbing for codec modules: kernel choice, validation, op registration.

Every codec module (bitmask, fp8, softmax_u8, int_outlier, fewbit) needs the
same four things, so they live here once:

* **Triton detection** (`triton_available`, `triton_jit`, `tl`): importing a
  codec module must work without Triton; its Triton entry points then raise
  a clear RuntimeError instead of an ImportError at import time.
* **Kernel choice per call** (`use_triton`): AUTO runs Triton only on CUDA
  tensors, TRITON forces it (CPU tensors need ``TRITON_INTERPRET=1`` set
  *before* the codec modules are imported, because ``triton.jit`` decides
  at decoration time whether a kernel is interpreted), TORCH never does.
* **Validation** (`check_input`, `check_payload`, `check_shape`,
  `check_output_dtype`): the graph rewrite calls the ops with whatever the
  planner chose, so a wrong dtype must fail loudly (TypeError) and a wrong
  device or payload layout must fail with ValueError, not with a kernel crash.
* **Op registration** (`register_codec_ops`, `OpCodec`): every codec exposes
  ``torch.ops.adacc.<codec>_compress(Tensor x) -> Tensor[]`` and
  ``torch.ops.adacc.<codec>_decompress(Tensor[] payload, SymInt[] shape,
  ScalarType dtype) -> Tensor``. One payload spec per codec (shape + dtype of
  each payload tensor as a function of the input shape and dtype) drives the
  fake kernels *and* `Codec.compressed_nbytes`, so the planner's byte count and
  the real payload can never disagree.

A kernel module typically reads::

    from .oplib import OpCodec, launch, register_codec_ops, tl, triton_jit

    @triton_jit
    def _pack_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr): ...

    def triton_mycodec_compress(x): ...; launch(_pack_kernel, grid, x, out, n, BLOCK=1024)
    def torch_mycodec_compress(x): ...
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .codec import Codec, CodecStats, KernelChoice, Packed, kernel_choice_from_env

try:  # Triton is optional: CPU-only installs run the torch references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None
    tl = None

__all__ = [
    "OP_NAMESPACE",
    "OpCodec",
    "PayloadSpec",
    "Workspace",
    "check_input",
    "check_output_dtype",
    "check_payload",
    "check_shape",
    "error_stats",
    "float32_result_scratch",
    "float32_scratch",
    "is_interpreted",
    "known_true",
    "launch",
    "numel_of",
    "register_codec_ops",
    "register_dispatched_ops",
    "require_triton",
    "rne_cast",
    "rows_channels",
    "runs_triton",
    "spec_nbytes",
    "tl",
    "triton_available",
    "triton_interpreting",
    "triton_jit",
    "use_triton",
]

#: Namespace of every codec op: ``torch.ops.adacc.<codec>_compress``.
OP_NAMESPACE = "adacc"

#: Payload layout: one (shape, dtype) per payload tensor, in payload order.
#: Shapes may hold SymInts when called from a fake kernel under dynamic shapes.
PayloadSpec = list[tuple[tuple[Any, ...], torch.dtype]]

_DEVICE_TYPES = ("cpu", "cuda")


# --------------------------------------------------------------------------
# Triton availability and kernel choice
# --------------------------------------------------------------------------


@functools.cache
def triton_available() -> bool:
    """True when ``triton`` and ``triton.language`` import and expose ``jit``.

    Cached because the answer cannot change within a process (imports are
    cached too) and this is asked on every op call.
    """
    return triton is not None and hasattr(triton, "jit") and tl is not None


def triton_interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1`` is set now.

    Kernels decorated before the variable was set are still compiled kernels;
    `require_triton` checks the kernel objects themselves for that reason.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_interpreted(kernel: object) -> bool:
    """Whether ``kernel`` was built by ``triton.jit`` in interpreter mode.

    Tests use it to know whether the Triton kernels can run on CPU tensors in
    this process (``TRITON_INTERPRET=1`` must precede the codec imports).
    """
    if not triton_available():
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def _is_traced(x: torch.Tensor) -> bool:
    """Whether ``x`` is a tracing stand-in (FakeTensor, FunctionalTensor, meta).

    The Triton interpreter executes kernels with numpy on real data, so it
    cannot run while torch.compile traces a graph with fake tensors.
    """
    return (
        type(x) not in (torch.Tensor, torch.nn.Parameter)
        or x.device.type == "meta"
        or torch.compiler.is_compiling()
    )


def use_triton(x: torch.Tensor, choice: KernelChoice | None = None) -> bool:
    """Decides, for one call on ``x``, whether to run the Triton kernels.

    Args:
        x: The tensor the op is about to read (its device decides AUTO).
        choice: Overrides ``ADACC_KERNELS``; None reads the environment on
            every call so tests and benchmarks can switch paths without
            re-importing anything.

    Returns:
        True for Triton, False for the torch reference.

    Raises:
        RuntimeError: TRITON was forced but cannot run here: Triton is not
            importable, or ``x`` is a CPU tensor and ``TRITON_INTERPRET=1``
            is not set, or a CPU graph is being traced (the interpreter runs
            on real data only).
    """
    choice = kernel_choice_from_env() if choice is None else choice
    if choice is KernelChoice.TORCH:
        return False
    if choice is KernelChoice.AUTO:
        return x.device.type == "cuda" and triton_available()
    if not triton_available():
        raise RuntimeError(
            "ADACC_KERNELS=triton (KernelChoice.TRITON) but Triton is not importable; "
            "install triton or use ADACC_KERNELS=auto|torch"
        )
    if x.device.type != "cuda":
        if not triton_interpreting():
            raise RuntimeError(
                "ADACC_KERNELS=triton on a non-CUDA tensor needs TRITON_INTERPRET=1, set "
                "before adacc_compile.kernels is imported"
            )
        if _is_traced(x):
            raise RuntimeError(
                "ADACC_KERNELS=triton cannot trace CPU tensors: the Triton interpreter "
                "runs on real data only; use ADACC_KERNELS=auto under torch.compile on CPU"
            )
    return True


def runs_triton(device_type: str, choice: KernelChoice | None = None) -> bool:
    """Whether calls on ``device_type`` tensors will run Triton (`use_triton`
    without a tensor), for planning: e.g. which workspace a node will need.

    Unlike `use_triton` it never raises: a forced TRITON that cannot run
    fails later, at the call.
    """
    choice = kernel_choice_from_env() if choice is None else choice
    if choice is KernelChoice.AUTO:
        return device_type == "cuda" and triton_available()
    return choice is KernelChoice.TRITON


def known_true(flag: torch.Tensor, x: torch.Tensor) -> bool:
    """``bool(flag)`` for a reference's shortcut (e.g. "every value is
    finite: skip the NaN/Inf passes"); False while ``x`` is being traced,
    where the data is unknown and the general path must be taken (a custom
    op's body is traced when torch.compile decomposes it)."""
    return not _is_traced(x) and bool(flag)


def require_triton(x: torch.Tensor, *kernels: object) -> None:
    """Raises a clear RuntimeError when ``kernels`` cannot run on ``x``.

    Called at the top of every ``triton_*`` entry point so a direct call (as
    in the tests) fails with an explanation instead of a driver error.
    """
    if not triton_available():
        raise RuntimeError("Triton is not importable; use the torch_* reference functions")
    if x.device.type == "cuda" or _is_traced(x):
        return
    if not all(is_interpreted(k) for k in kernels):
        raise RuntimeError(
            f"Triton kernels on {x.device.type} tensors need TRITON_INTERPRET=1 set before "
            "adacc_compile.kernels is imported (the kernels were compiled for a GPU)"
        )


class _MissingTritonKernel:
    """Stand-in for a ``triton.jit`` kernel when Triton is not installed."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        raise RuntimeError(f"Triton is not importable; cannot launch {self.fn.__name__}")


def triton_jit(fn: Callable[..., Any]) -> Any:
    """``triton.jit`` when Triton is importable, else a stub that raises on launch.

    Lets codec modules define their kernels at module level and still import
    on machines without Triton.
    """
    if triton_available():
        return triton.jit(fn)
    return _MissingTritonKernel(fn)


#: The widest row a one-pass kernel holds in one program (`row_tile`): every
#: hidden size of today's LLMs (up to 16384) and the MLP widths of 70B
#: models (28672). Wider rows are read twice (statistics, then codes).
ONE_PASS_MAX_COLUMNS = 32768


@dataclass(frozen=True, slots=True)
class RowTile:
    """How a row-wise kernel covers a [rows, cols] view (`row_tile`)."""

    rows: int
    """Rows per program (a power of two)."""
    block_cols: int
    """Columns per block (a power of two)."""
    one_pass: bool
    """Whether a whole row fits one block: the kernel then reads each
    element once, statistics and codes from the same registers."""
    num_warps: int
    """Warps per program: about 16 elements per thread on wide tiles, so a
    whole row stays in registers."""


def row_tile(rows: int, cols: int, *, tile: int = 2048) -> RowTile:
    """The tile of a kernel that needs a statistic of each whole row (its
    maximum) before writing that row's codes: one block per row up to
    `ONE_PASS_MAX_COLUMNS` columns (``tile`` elements per program, in whole
    rows), so the row is read once; wider rows are covered in blocks that
    wide, twice."""
    block_cols = min(_next_pow2(max(cols, 1)), _next_pow2(ONE_PASS_MAX_COLUMNS))
    per_program = max(1, min(tile // block_cols, _next_pow2(max(rows, 1))))
    elements = per_program * block_cols
    num_warps = min(16, max(4, _next_pow2(elements // (32 * 16))))
    return RowTile(rows=per_program, block_cols=block_cols, one_pass=cols <= block_cols, num_warps=num_warps)


def _next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """Launches ``kernel`` through ``torch.library.wrap_triton``.

    ``wrap_triton`` makes the launch visible to torch.compile inside a
    ``triton_op`` body (Inductor then schedules the kernel itself); in eager
    mode and under the interpreter it launches directly. Empty grids are
    skipped because Triton rejects a zero-sized grid.
    """
    if any(g == 0 for g in grid):
        return
    torch.library.wrap_triton(kernel)[grid](*args, **kwargs)


@triton_jit
def rne_cast(x, dtype: tl.constexpr):
    """Triton helper: float32 -> ``dtype`` rounding to nearest even everywhere.

    Why: the Triton interpreter truncates float32 -> bfloat16, so a plain
    ``x.to(tl.bfloat16)`` would differ from torch (and from the GPU) by one
    ulp; rounding by integer ops gives the same bits on every backend. Only
    valid for the canonical NaN (0x7FC00000), which is all codecs produce.
    """
    if dtype == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton_jit
def div_exact(numerator, denominator):
    """Triton helper: float32 ``numerator / denominator`` correctly rounded,
    as torch's eager division gives it.

    Why: on an H200 (Triton 3.6) ``tl.math.div_rn`` by a constant
    (``div_rn(amax, 126.0)``) gave scales one ulp off torch's in 66% of the
    blocks, while the same call with a tensor denominator was exact. The
    quotient is taken in float64 (``div.rn.f64``) and rounded once to
    float32, which is the correctly rounded float32 quotient (53 >= 2 * 24
    + 2). For a few values per block or row: the float64 cost is nothing.
    """
    wide = tl.zeros([1], dtype=tl.float64)  # either side may be a constant
    return ((numerator + wide) / (denominator + wide)).to(tl.float32)


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


def check_input(
    x: object, *, codec: str, dtypes: Sequence[torch.dtype], what: str = "input"
) -> torch.Tensor:
    """Checks a compress input; returns it typed as a Tensor.

    Raises:
        TypeError: ``x`` is not a tensor or its dtype is not in ``dtypes``.
        ValueError: ``x`` lives on a device other than CPU or CUDA.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{codec}: {what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        valid = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{codec}: {what} dtype {x.dtype} not supported; expected one of {valid}")
    if x.device.type not in _DEVICE_TYPES:
        raise ValueError(f"{codec}: {what} on device {x.device} not supported; use cpu or cuda")
    return x


def check_output_dtype(dtype: torch.dtype, *, codec: str, dtypes: Sequence[torch.dtype]) -> None:
    """Raises TypeError when ``dtype`` is not a dtype the codec decompresses to."""
    if dtype not in dtypes:
        valid = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{codec}: cannot decompress to {dtype}; expected one of {valid}")


def check_shape(shape: Sequence[Any], *, codec: str) -> tuple[Any, ...]:
    """Checks a decompress shape (ints or SymInts, none negative); returns a tuple."""
    out = tuple(shape)
    for s in out:
        if not isinstance(s, (int, torch.SymInt)) or isinstance(s, bool):
            raise TypeError(f"{codec}: shape entries must be ints, got {shape!r}")
        if isinstance(s, int) and s < 0:
            raise ValueError(f"{codec}: shape {shape!r} has a negative size")
    return out


def check_payload(payload: Sequence[object], spec: PayloadSpec, *, codec: str) -> None:
    """Checks payload tensors against the codec's payload spec.

    Raises:
        TypeError: An entry is not a tensor, or has the wrong dtype.
        ValueError: Wrong count, wrong numel, mixed devices or unsupported device.
    """
    if len(payload) != len(spec):
        raise ValueError(f"{codec}: payload has {len(payload)} tensors, expected {len(spec)}")
    devices = set()
    for i, (t, (shape, dtype)) in enumerate(zip(payload, spec)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{codec}: payload[{i}] is {type(t).__name__}, not a Tensor")
        if t.dtype != dtype:
            raise TypeError(f"{codec}: payload[{i}] has dtype {t.dtype}, expected {dtype}")
        expected = numel_of(shape)
        if isinstance(expected, int) and t.numel() != expected:
            raise ValueError(
                f"{codec}: payload[{i}] has {t.numel()} elements, expected {expected} "
                f"(shape {tuple(shape)}); was it compressed from a different shape?"
            )
        devices.add(t.device)
    if len(devices) > 1:
        raise ValueError(f"{codec}: payload tensors are on different devices {sorted(map(str, devices))}")
    for d in devices:
        if d.type not in _DEVICE_TYPES:
            raise ValueError(f"{codec}: payload on device {d} not supported; use cpu or cuda")


# --------------------------------------------------------------------------
# Sizes and error statistics
# --------------------------------------------------------------------------


def numel_of(shape: Sequence[Any]) -> Any:
    """Product of ``shape`` (1 for a 0-d shape); works with SymInts."""
    n: Any = 1
    for s in shape:
        n = n * s
    return n


def rows_channels(shape: Sequence[Any]) -> tuple[Any, Any]:
    """(R, C) of the rows x channels view the row-wise codecs work on: the
    last dim is a row; a 0-d tensor is one row of one channel (SymInts too)."""
    if len(shape) == 0:
        return 1, 1
    return numel_of(shape[:-1]), shape[-1]


def float32_scratch(shape: Sequence[int]) -> int:
    """Bytes of one float32 tensor of ``shape``: the owned copy that most torch
    references scale, clamp and round in place."""
    return 4 * int(numel_of(shape))


def float32_result_scratch(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Scratch of a decompress that builds its result in float32, patches it
    with one bool mask at a time, then casts it to ``dtype``.

    For float32 the buffer is the result and only a mask is scratch; for
    other dtypes the buffer (with a mask, or with the cast result beside it)
    is, minus the result itself.
    """
    numel = int(numel_of(shape))
    buffer, mask, result = 4 * numel, numel, numel * dtype.itemsize
    if dtype == torch.float32:
        return mask
    return max(buffer + mask - result, buffer)


def spec_nbytes(spec: PayloadSpec) -> int:
    """Total bytes of the tensors a payload spec describes."""
    return sum(
        int(numel_of(shape)) * torch.empty((), dtype=dtype).element_size() for shape, dtype in spec
    )


def error_stats(x: torch.Tensor, x_hat: torch.Tensor) -> tuple[float, float]:
    """(relative Frobenius error, SQNR in dB) of ``x_hat`` against ``x``.

    Only positions where ``x`` is finite count: non-finite values must round
    trip exactly (tested separately) and would otherwise make both numbers
    NaN. Computed in float64 so the statistic itself adds no error.
    """
    finite = torch.isfinite(x)
    ref = torch.where(finite, x, 0).double()
    err = torch.where(finite, x_hat.to(x.device), 0).double() - ref
    signal = float(ref.pow(2).sum())
    noise = float(err.pow(2).sum())
    if signal == 0.0:
        return (0.0 if noise == 0.0 else math.inf), (math.inf if noise == 0.0 else -math.inf)
    rel = math.sqrt(noise / signal)
    sqnr = math.inf if noise == 0.0 else 10.0 * math.log10(signal / noise)
    return rel, sqnr


# --------------------------------------------------------------------------
# Op registration and the shared codec base class
# --------------------------------------------------------------------------


def register_codec_ops(
    codec: str,
    *,
    compress: Callable[[torch.Tensor], list[torch.Tensor]],
    decompress: Callable[[list[torch.Tensor], list[int], torch.dtype], torch.Tensor],
    payload_spec: Callable[[Sequence[Any], torch.dtype], PayloadSpec],
    out_dtype: Callable[[torch.dtype], torch.dtype] | None = None,
) -> tuple[Any, Any]:
    """Registers ``adacc::<codec>_compress`` and ``adacc::<codec>_decompress``.

    Uses ``torch.library.triton_op`` when Triton is importable, so that under
    torch.compile the op is decomposed into its body (the ``wrap_triton``
    launches or the torch reference ops) and Inductor sees through it; without
    Triton it falls back to an opaque ``torch.library.custom_op``. Either way
    the fake kernels are built from ``payload_spec`` alone (shape in, empty
    tensors out), so shape propagation never runs the codec and agrees with
    `spec_nbytes` by construction.

    Args:
        codec: Codec name; becomes the op-name prefix.
        compress: ``(x) -> payload``; dispatches torch vs Triton per call.
        decompress: ``(payload, shape, dtype) -> x_hat``.
        payload_spec: ``(shape, dtype) -> [(shape, dtype), ...]`` of the payload.
        out_dtype: Maps the decompress ``dtype`` argument to the returned
            tensor's dtype (identity when None; DERIVATIVE codecs may differ).

    Returns:
        The two op objects (``CustomOpDef``), compress first.
    """
    define = torch.library.triton_op if triton_available() else torch.library.custom_op

    # Real annotations (not strings) so torch.library can infer the schema
    # regardless of ``from __future__ import annotations`` in the caller.
    def compress_impl(x: torch.Tensor) -> list[torch.Tensor]:
        return compress(x)

    def decompress_impl(
        payload: list[torch.Tensor], shape: list[int], dtype: torch.dtype
    ) -> torch.Tensor:
        return decompress(payload, shape, dtype)

    compress_impl.__annotations__ = {"x": torch.Tensor, "return": list[torch.Tensor]}
    decompress_impl.__annotations__ = {
        "payload": list[torch.Tensor],
        "shape": list[int],
        "dtype": torch.dtype,
        "return": torch.Tensor,
    }

    compress_op = define(f"{OP_NAMESPACE}::{codec}_compress", compress_impl, mutates_args=())
    decompress_op = define(f"{OP_NAMESPACE}::{codec}_decompress", decompress_impl, mutates_args=())

    def compress_fake(x: torch.Tensor) -> list[torch.Tensor]:
        return [x.new_empty(shape, dtype=dtype) for shape, dtype in payload_spec(x.shape, x.dtype)]

    def decompress_fake(
        payload: list[torch.Tensor], shape: list[int], dtype: torch.dtype
    ) -> torch.Tensor:
        if not payload:
            raise ValueError(f"{codec}: empty payload")
        result_dtype = dtype if out_dtype is None else out_dtype(dtype)
        return payload[0].new_empty(shape, dtype=result_dtype)

    compress_op.register_fake(compress_fake)
    decompress_op.register_fake(decompress_fake)
    return compress_op, decompress_op


CompressFn = Callable[[torch.Tensor], list[torch.Tensor]]
DecompressFn = Callable[[Sequence[torch.Tensor], Sequence[Any], torch.dtype], torch.Tensor]


def register_dispatched_ops(
    codec: str,
    *,
    dtypes: Sequence[torch.dtype],
    payload_spec: Callable[[Sequence[Any], torch.dtype], PayloadSpec],
    torch_impl: tuple[CompressFn, DecompressFn],
    triton_impl: tuple[CompressFn, DecompressFn],
    out_dtype: Callable[[torch.dtype], torch.dtype] | None = None,
) -> tuple[Any, Any]:
    """`register_codec_ops` for the usual codec: validate, then run Triton or
    the torch reference, chosen per call by `use_triton`.

    Args:
        codec: Codec name; becomes the op-name prefix.
        dtypes: Input dtypes compress accepts, and the dtypes decompress
            may be asked for.
        payload_spec: As for `register_codec_ops`.
        torch_impl: (compress, decompress) of the torch reference.
        triton_impl: (compress, decompress) of the Triton kernels.
        out_dtype: As for `register_codec_ops`.

    Returns:
        The two op objects, compress first.
    """
    torch_compress, torch_decompress = torch_impl
    triton_compress, triton_decompress = triton_impl

    def compress(x: torch.Tensor) -> list[torch.Tensor]:
        check_input(x, codec=codec, dtypes=dtypes)
        return triton_compress(x) if use_triton(x) else torch_compress(x)

    def decompress(payload: list[torch.Tensor], shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        check_output_dtype(dtype, codec=codec, dtypes=dtypes)
        check_payload(payload, payload_spec(check_shape(shape, codec=codec), dtype), codec=codec)
        if use_triton(payload[0]):
            return triton_decompress(payload, shape, dtype)
        return torch_decompress(payload, shape, dtype)

    return register_codec_ops(
        codec, compress=compress, decompress=decompress, payload_spec=payload_spec, out_dtype=out_dtype
    )


@dataclass(frozen=True, slots=True)
class Workspace:
    """Scratch bytes of one implementation: compress and decompress."""

    compress: int = 0
    decompress: int = 0


class OpCodec(Codec):
    """A `Codec` backed by its two custom ops and a payload spec.

    Subclasses set ``name``, ``lossless``, ``error_bound``, implement
    `payload_spec` and `applies`, and register the ops with
    `register_codec_ops` under the same name. `compress` / `decompress` go
    through the ops (the same path the rewritten graph takes), and
    `compressed_nbytes` is derived from the spec so it is exact by
    construction. `calibrate` measures the round-trip error on samples.
    """

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        raise NotImplementedError

    def compressed_nbytes(self, shape: Sequence[int], dtype: torch.dtype) -> int:
        return spec_nbytes(self.payload_spec(tuple(int(s) for s in shape), dtype))

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Scratch bytes of the Triton kernels (``triton``) or of the torch
        reference, for a contiguous input; see
        `Codec.compress_workspace_nbytes`. Default: none."""
        return Workspace()

    def compress_workspace_nbytes(
        self, shape: Sequence[int], dtype: torch.dtype, device_type: str
    ) -> int:
        shape = tuple(int(s) for s in shape)
        return self.workspace(shape, dtype, triton=runs_triton(device_type)).compress

    def decompress_workspace_nbytes(
        self, shape: Sequence[int], dtype: torch.dtype, device_type: str
    ) -> int:
        shape = tuple(int(s) for s in shape)
        return self.workspace(shape, dtype, triton=runs_triton(device_type)).decompress

    def compress(self, x: torch.Tensor) -> Packed:
        # Compression stores a value for backward; it is never differentiated.
        payload = self.compress_op(x.detach())
        return Packed(codec=self.name, payload=tuple(payload), shape=tuple(x.shape), dtype=x.dtype)

    def decompress(self, packed: Packed) -> torch.Tensor:
        if packed.codec != self.name:
            raise ValueError(f"{self.name}: cannot decompress a {packed.codec!r} payload")
        return self.decompress_op(list(packed.payload), list(packed.shape), packed.dtype)

    def calibrate(self, samples: Sequence[torch.Tensor], parameters: torch.Tensor | None = None) -> CodecStats:
        """Round-trips each sample; reports abs max, relative error and SQNR.

        ``relative_error`` is the Frobenius error over all samples together
        (finite positions only); ``extra`` holds ``sqnr_db``, the worst
        per-sample relative error and the non-finite fraction. With
        ``parameters`` (`Codec.calibration_parameters`), the samples go
        through the aten form with them: what a compiled graph runs.
        """
        signal = noise = 0.0
        worst = 0.0
        abs_max = 0.0
        nonfinite = total = 0
        for x in samples:
            if parameters is None:
                x_hat = self.decompress(self.compress(x))
            else:
                payload = self.aten_compress(x.detach(), parameters.to(x.device))
                x_hat = self.aten_decompress(payload, list(x.shape), x.dtype)
            finite = torch.isfinite(x)
            ref = torch.where(finite, x, 0).double()
            err = torch.where(finite, x_hat.to(x.device), 0).double() - ref
            s, n = float(ref.pow(2).sum()), float(err.pow(2).sum())
            signal, noise = signal + s, noise + n
            worst = max(worst, math.sqrt(n / s) if s > 0 else 0.0)
            if ref.numel():
                abs_max = max(abs_max, float(ref.abs().max()))
            nonfinite += int((~finite).sum())
            total += x.numel()
        rel = math.sqrt(noise / signal) if signal > 0 else 0.0
        sqnr = 10.0 * math.log10(signal / noise) if noise > 0 and signal > 0 else math.inf
        return CodecStats(
            codec=self.name,
            abs_max=abs_max,
            relative_error=rel,
            extra={
                "sqnr_db": sqnr,
                "worst_sample_relative_error": worst,
                "nonfinite_fraction": nonfinite / total if total else 0.0,
            },
        )
