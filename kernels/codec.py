"""The codec contract and registry.

A codec turns one saved activation into a few smaller payload tensors in the
forward pass and back into a tensor in the backward pass. The planner
(`adacc_compile.passes`) only talks to codecs through this contract: it asks
each registered codec whether it `applies` to a value, how many bytes the
payload takes (`compressed_nbytes`, exact and known before the data is seen),
how long compress + decompress take (`cost_seconds`), and how much error it
declares (`error_bound`). The graph rewrite then inserts the codec into the
forward and backward graphs: as plain aten ops
(`aten_compress`, `aten_decompress`; Inductor fuses them with their
neighbours), or as its two custom ops ``torch.ops.adacc.<name>_compress``
and ``torch.ops.adacc.<name>_decompress`` (`Codec.compress_op`; the
hand-written Triton kernels on CUDA), whichever
`adacc_compile.passes.codec_form.graph_form` picks.

Why a registry of objects instead of an if-chain: new codecs plug in without
touching the planner (STYLE.md point 5), and tests can register toy codecs.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch


class KernelChoice(enum.Enum):
    """Which implementation a codec runs.

    AUTO uses Triton on CUDA tensors when Triton is importable, else the torch
    reference. TRITON forces the Triton kernels (under ``TRITON_INTERPRET=1``
    they also run on CPU tensors: that is how the kernels are tested without a
    GPU). TORCH forces the pure-torch reference everywhere.
    """

    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"


def kernel_choice_from_env() -> KernelChoice:
    """Reads ``ADACC_KERNELS`` (auto | triton | torch); defaults to AUTO."""
    raw = os.environ.get("ADACC_KERNELS", "auto").lower()
    try:
        return KernelChoice(raw)
    except ValueError:
        valid = ", ".join(c.value for c in KernelChoice)
        raise ValueError(f"ADACC_KERNELS={raw!r} is not one of: {valid}") from None


class DecompressKind(enum.Enum):
    """What a codec's decompress returns.

    VALUE: an approximation of the original tensor (most codecs).
    DERIVATIVE: the approximate derivative of an activation function at the
    original tensor (few-bit GELU/SiLU); the rewrite multiplies it with the
    incoming gradient instead of calling the activation's backward.
    """

    VALUE = "value"
    DERIVATIVE = "derivative"


@dataclass(frozen=True, slots=True, kw_only=True)
class Packed:
    """A compressed tensor: payload tensors plus what decompression needs.

    ``payload`` holds every tensor that is stored between forward and backward;
    its total bytes equal ``Codec.compressed_nbytes(shape, dtype)`` exactly.
    """

    codec: str
    payload: tuple[torch.Tensor, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.payload)


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecStats:
    """Statistics a codec derives from sample activations (calibration)."""

    codec: str
    outlier_channels: tuple[int, ...] = ()
    outlier_fraction: float = 0.0
    abs_max: float = 0.0
    relative_error: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyQuery:
    """What the planner knows about a candidate value when asking `applies`.

    ``producer_class`` / ``consumer_classes`` are op-class names from the
    annotate pass (e.g. "norm", "matmul", "activation", "softmax", "mask",
    "dropout", "elementwise"); ``consumer_targets`` are the string names of
    the backward ops that read the value (e.g. "aten.gelu_backward.default");
    ``producer_target`` names the op that made it (e.g.
    "aten._log_softmax.default": same op class as softmax, other values).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    producer_class: str
    producer_target: str = ""
    consumer_classes: tuple[str, ...] = ()
    consumer_targets: tuple[str, ...] = ()


class Codec:
    """Base class; one subclass per codec module in this package.

    Subclasses set the class attributes and implement the methods that raise
    NotImplementedError here.
    """

    name: str = ""
    lossless: bool = False
    #: Declared bound on the relative error ||x_hat - x|| / ||x|| (Frobenius) on
    #: finite inputs whose values it applies to; 0.0 for lossless codecs.
    error_bound: float = 0.0
    decompress_kind: DecompressKind = DecompressKind.VALUE

    @property
    def feeds_recompute(self) -> bool:
        """May a recomputation start from the decompressed value?

        Only when decompression gives the value back exactly: a lossy codec
        bounds the error of the value itself, not of everything recomputed
        from it (errors grow through the chain and reach the gradients of
        earlier layers), and a few-bit codec gives back a derivative. A
        lossy codec that can bound its effect on a recomputation may
        override this; none does."""
        return self.lossless and self.decompress_kind is DecompressKind.VALUE

    def applies(self, query: ApplyQuery) -> bool:
        raise NotImplementedError

    def compressed_nbytes(self, shape: Sequence[int], dtype: torch.dtype) -> int:
        raise NotImplementedError

    def compress(self, x: torch.Tensor) -> Packed:
        raise NotImplementedError

    def decompress(self, packed: Packed) -> torch.Tensor:
        raise NotImplementedError

    def calibrate(self, samples: Sequence[torch.Tensor], parameters: torch.Tensor | None = None) -> CodecStats:
        """Round-trips the samples; ``parameters``: what
        `calibration_parameters` measured (codecs that take none ignore it)."""
        raise NotImplementedError

    def calibration_refusal(self, stats: CodecStats) -> str | None:
        """Why statistics measured on a real value (`calibrate`) put it
        outside the range where the declared bound holds, or None (the
        default: the measured error decides alone). The calibrate pass drops
        a refused option as it drops one over its bound."""
        return None

    def calibration_parameters(self, x: torch.Tensor) -> torch.Tensor | None:
        """Parameters of this codec measured on a real value ``x``, or None
        (the default: the codec takes none).

        Why: a statistic that the compress would otherwise take from the
        value on every call (which channels are outliers, for instance)
        costs a full pass over it before the first code can be written.
        Measured once on the calibration batch instead
        (`adacc_compile.passes.calibrate`), it enters the compiled graph as
        a constant and the compress reads the value once. The tensor's
        shape and dtype depend on ``x``'s shape and dtype only (one trace
        serves every value alike); `aten_compress` takes it as
        ``parameters``."""
        return None

    def triton_calibrated_compress(self, x: torch.Tensor, parameters: torch.Tensor) -> list[torch.Tensor] | None:
        """The hand-written Triton compress with ``parameters`` (what
        `calibration_parameters` measured), which then reads ``x`` once; None
        (the default) where the codec has none. The same payload as
        `aten_compress` with those parameters, bit for bit. Timed beside
        Inductor's code of the calibrated aten form by `bench/gpu_check.py`."""
        return None

    def aten_compress(self, x: torch.Tensor, parameters: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Compress written as plain, functional torch ops for Inductor.

        What a compiled graph runs: the graph rewrite traces it into aten
        ops (`adacc_compile.kernels.aten_graphs`) and splices them in place
        of the custom op, so that Inductor fuses it with the producer. It
        must give the same payload as `compress` (bit for bit), build every
        constant from ops or Python scalars (no ``torch.tensor`` of Python
        data: a traced graph holds no tensor constants), and avoid what
        Inductor compiles badly (see `adacc_compile.kernels.aten_graphs`).
        ``parameters``: what `calibration_parameters` measured, or None
        (the compress then measures them on ``x`` itself, as the custom op
        does). The default calls the custom op, which stays opaque to
        Inductor."""
        if parameters is not None:
            raise ValueError(f"{self.name}: takes no calibrated parameters")
        return list(self.compress_op(x))

    def aten_decompress(
        self, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        """Decompress written for Inductor (see `aten_compress`)."""
        return self.decompress_op(list(payload), list(shape), dtype)

    @property
    def replaced_op(self) -> Any:
        """For a `DecompressKind.DERIVATIVE` codec: the aten activation
        backward (an ``OpOverload``, ``(grad, x) -> grad of x``) that the
        rewrite replaces with the gradient times the decompressed derivative;
        None for a codec that returns the value. Inductor's decomposition
        table splits these ops into erf/exp products before a partitioner
        sees the joint graph, where no rewrite could find them again; so
        while the options allow such a codec the joint graph keeps them
        whole (`partitioner.whole_ops`, `compat_inductor.inductor_compile`), where
        the memory model has been checked on them."""
        return None

    def replaced_backward(self, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`replaced_op` applied: the gradient of the activation's input. Its
        time is credited against the codec's decompress in the cost model
        (`adacc_compile.passes.codec_timing`): the backward runs either way,
        only its form changes."""
        if self.replaced_op is None:
            raise NotImplementedError(f"{self.name}: its decompress returns the value; it replaces no backward")
        return self.replaced_op(grad, x)

    def compress_workspace_nbytes(
        self, shape: Sequence[int], dtype: torch.dtype, device_type: str
    ) -> int:
        """Upper bound of the bytes compress allocates and frees again inside one call.

        Why: the memory simulator counts each node's outputs, but a codec op
        may need scratch tensors while it runs (the torch reference on CPU
        works on a float32 copy of ``x``, for instance). They raise the peak
        without being part of the live set afterwards, so the simulator adds
        them at the compress node only. The bound is for the implementation
        that runs on ``device_type`` ("cpu" or "cuda", see `KernelChoice`),
        for an input of ``shape`` and ``dtype`` that is contiguous (a
        non-contiguous one may add one copy of itself). Measured as the peak
        allocated during the call minus the input and the payload.

        The default, 0, suits codecs whose kernels write the payload directly.
        """
        return 0

    def decompress_workspace_nbytes(
        self, shape: Sequence[int], dtype: torch.dtype, device_type: str
    ) -> int:
        """Like `compress_workspace_nbytes`, for decompressing a payload of a
        value of ``shape`` and ``dtype`` (the payload and the result excluded)."""
        return 0

    def cost_seconds(
        self, shape: Sequence[int], dtype: torch.dtype, bandwidth_bytes_per_s: float
    ) -> float:
        """Compress + decompress time of one fused kernel each, as bytes over
        bandwidth: compress runs in the epilogue of the kernel producing the
        value (which holds it already) and writes the payload; decompress
        reads the payload and writes the value once for its reader (a
        matmul reads it from memory; a pointwise reader would not even need
        that write). Neither costs a launch of its own."""
        numel = 1
        for s in shape:
            numel *= int(s)
        moved = numel * torch.empty((), dtype=dtype).element_size()
        moved += 2 * self.compressed_nbytes(shape, dtype)
        return moved / bandwidth_bytes_per_s

    @property
    def compress_op(self) -> Callable[..., list[torch.Tensor]]:
        """``torch.ops.adacc.<name>_compress.default``: (Tensor x) -> Tensor[]."""
        return getattr(torch.ops.adacc, f"{self.name}_compress").default

    @property
    def decompress_op(self) -> Callable[..., torch.Tensor]:
        """``torch.ops.adacc.<name>_decompress.default``:
        (Tensor[] payload, SymInt[] shape, ScalarType dtype) -> Tensor."""
        return getattr(torch.ops.adacc, f"{self.name}_decompress").default


@dataclass(slots=True)
class CodecRegistry:
    """Name -> codec. One instance lives in `adacc_compile.kernels`."""

    codecs: dict[str, Codec] = field(default_factory=dict)

    def register(self, codec: Codec) -> Codec:
        if codec.name in self.codecs:
            raise ValueError(f"codec {codec.name!r} is already registered")
        self.codecs[codec.name] = codec
        return codec

    def get(self, name: str) -> Codec:
        try:
            return self.codecs[name]
        except KeyError:
            valid = ", ".join(sorted(self.codecs)) or "(none)"
            raise ValueError(f"unknown codec {name!r}; available: {valid}") from None

    def names(self) -> list[str]:
        return sorted(self.codecs)
