"""Activation codecs: torch references, Triton kernels, custom-op registration.

Installed as ``adacc_compile.kernels``. Public contract (used by the planner
and by outside tools)::

    from adacc_compile.kernels import available_codecs, get_codec
    codec = get_codec("int4_outlier")
    packed = codec.compress(x)          # Packed(payload=(...), shape, dtype)
    x_hat = codec.decompress(packed)
    codec.compressed_nbytes(x.shape, x.dtype) == packed.nbytes

Importing this package never needs Triton or a GPU; Triton entry points raise
a clear error when Triton is unusable (see `KernelChoice`).
"""

from .codec import (
    ApplyQuery,
    Codec,
    CodecRegistry,
    CodecStats,
    DecompressKind,
    KernelChoice,
    Packed,
    kernel_choice_from_env,
)

REGISTRY = CodecRegistry()

# Each codec module registers its codecs into REGISTRY on import.
# (codec modules are imported below, one line per group)
from . import bitmask, fp8, softmax_u8  # noqa: E402,F401
from . import int_outlier, int_channel, int4_channel, fewbit, int8_smooth  # noqa: E402,F401


def available_codecs() -> list[str]:
    """Names of every registered codec, sorted."""
    return REGISTRY.names()


def get_codec(name: str) -> Codec:
    """The codec registered under ``name``; ValueError listing the valid names."""
    return REGISTRY.get(name)


__all__ = [
    "ApplyQuery",
    "Codec",
    "CodecStats",
    "DecompressKind",
    "KernelChoice",
    "Packed",
    "REGISTRY",
    "available_codecs",
    "get_codec",
    "kernel_choice_from_env",
]
