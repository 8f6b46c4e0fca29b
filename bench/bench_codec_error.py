"""Error of every float codec on synthetic activations, as a markdown table.

Why: each codec declares an ``error_bound`` that the planner trusts; this
script shows where that number comes from and how the codecs compare on the
same inputs. Value codecs are scored on ``x_hat`` against ``x``; derivative
codecs (few-bit GELU/SiLU) on their output against the exact derivative.
Only finite positions count (non-finite values round-trip exactly and are
tested separately).

Input kinds (each is paired with the `ApplyQuery` roles it can play, and a
codec is measured where it `applies` to one of them):

* gaussian: N(0, 1), rows x channels.
* llm-outlier: N(0, 1) with per-row scale variation and 0.5 % of channels
  (at least 2) holding consistently large values, 10-30x the median
  channel's RMS, like the "massive activation" channels of LLMs.
* llm-outlier-heavy: the same with 1.5 % outlier channels (within the 1/64 slots of int*_outlier).
* mlp-gelu: GELU of N(0, 1), the input of an MLP's down projection (skewed).
* softmax: softmax over the last dim of N(0, 2^2) logits.

Real activations from a pretrained transformer would need weights; no
installed package ships any, and nothing is downloaded, so none are used.

``int4_plain`` is not a codec: int4 group-wise without outlier channels
(`torch_int4_plain_roundtrip`), shown to measure what the outlier handling of
int4_outlier buys.

Run: ``python bench/bench_codec_error.py [--rows 1024] [--channels 1024] [--dtype bfloat16]``
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

import torch

from adacc_compile.kernels import REGISTRY, ApplyQuery, DecompressKind
from adacc_compile.kernels.int_outlier import torch_int4_plain_roundtrip
from adacc_compile.kernels.oplib import error_stats

#: Exact derivatives by the backward op a derivative codec replaces.
_DERIVATIVES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_backward": lambda x: torch.ops.aten.gelu_backward(torch.ones_like(x), x),
    "silu_backward": lambda x: torch.ops.aten.silu_backward(torch.ones_like(x), x),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class InputKind:
    name: str
    make: Callable[[int, int, torch.Generator], torch.Tensor]
    #: Producer op class when the tensor feeds a linear layer.
    producer: str
    #: Whether the tensor can also be the input of GELU/SiLU.
    activation_input: bool


def gaussian(rows: int, channels: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, channels, generator=generator)


def llm_outlier(
    rows: int, channels: int, generator: torch.Generator, fraction: float = 0.005
) -> torch.Tensor:
    """N(0, 1) plus a few channels 10-30x the median channel, mostly of one sign."""
    x = torch.randn(rows, channels, generator=generator)
    x *= torch.exp(0.3 * torch.randn(rows, 1, generator=generator))
    count = max(2, round(channels * fraction))
    index = torch.randperm(channels, generator=generator)[:count]
    magnitude = 10.0 + 20.0 * torch.rand(count, generator=generator)
    sign = torch.where(torch.rand(count, generator=generator) < 0.5, -1.0, 1.0)
    x[:, index] = magnitude * (sign + 0.25 * torch.randn(rows, count, generator=generator))
    return x


def llm_outlier_heavy(rows: int, channels: int, generator: torch.Generator) -> torch.Tensor:
    return llm_outlier(rows, channels, generator, fraction=0.015)


def mlp_gelu(rows: int, channels: int, generator: torch.Generator) -> torch.Tensor:
    return torch.nn.functional.gelu(torch.randn(rows, channels, generator=generator))


def softmax_probabilities(rows: int, channels: int, generator: torch.Generator) -> torch.Tensor:
    return torch.softmax(2.0 * torch.randn(rows, channels, generator=generator), dim=-1)


KINDS = (
    InputKind(name="gaussian", make=gaussian, producer="norm", activation_input=True),
    InputKind(name="llm-outlier", make=llm_outlier, producer="norm", activation_input=True),
    InputKind(name="llm-outlier-heavy", make=llm_outlier_heavy, producer="norm", activation_input=True),
    InputKind(name="mlp-gelu", make=mlp_gelu, producer="activation", activation_input=False),
    InputKind(name="softmax", make=softmax_probabilities, producer="softmax", activation_input=False),
)


def queries(kind: InputKind, x: torch.Tensor) -> list[ApplyQuery]:
    """The roles a tensor of this kind can play in a transformer."""
    shape, dtype = tuple(x.shape), x.dtype
    linear = ApplyQuery(shape=shape, dtype=dtype, producer_class=kind.producer, consumer_classes=("matmul",))
    roles = [linear]
    if kind.activation_input:
        for target in _DERIVATIVES:
            roles.append(
                ApplyQuery(
                    shape=shape,
                    dtype=dtype,
                    producer_class="matmul",
                    consumer_classes=("activation",),
                    consumer_targets=(f"aten.{target}.default",),
                )
            )
    return roles


def measure(codec_name: str, x: torch.Tensor, role: ApplyQuery) -> tuple[float, float, float]:
    """(relative error, SQNR dB, payload bytes per element) of one codec on x."""
    codec = REGISTRY.get(codec_name)
    packed = codec.compress(x)
    out = codec.decompress(packed)
    if codec.decompress_kind is DecompressKind.DERIVATIVE:
        target = role.consumer_targets[0].split(".")[1]
        reference = _DERIVATIVES[target](x.double())
    else:
        reference = x
    rel, sqnr = error_stats(reference, out)
    return rel, sqnr, packed.nbytes / max(1, x.numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--channels", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    print(
        f"Codec error, {args.rows} x {args.channels} {args.dtype}, seed {args.seed} "
        "(finite positions only)\n"
    )
    print("| codec | input | role | rel. error | SQNR dB | bytes/elem | declared bound |")
    print("|---|---|---|---:|---:|---:|---:|")
    for kind in KINDS:
        generator = torch.Generator().manual_seed(args.seed)
        x = kind.make(args.rows, args.channels, generator).to(dtype)
        for name in REGISTRY.names():
            codec = REGISTRY.get(name)
            role = next((q for q in queries(kind, x) if codec.applies(q)), None)
            if role is None:
                continue
            rel, sqnr, per_element = measure(name, x, role)
            derivative = codec.decompress_kind is DecompressKind.DERIVATIVE
            what = "derivative" if derivative else role.producer_class
            print(
                f"| {name} | {kind.name} | {what} | {rel:.4f} | {sqnr:.1f} | {per_element:.3f} "
                f"| {codec.error_bound:g} |"
            )
        if kind.producer != "softmax":
            x_hat, nbytes = torch_int4_plain_roundtrip(x)
            rel, sqnr = error_stats(x, x_hat)
            print(
                f"| int4_plain (helper) | {kind.name} | {kind.producer} | {rel:.4f} | {sqnr:.1f} "
                f"| {nbytes / x.numel():.3f} | - |"
            )
    print(
        f"\nOriginal: {dtype.itemsize} bytes/elem. Real pretrained activations: "
        "not measured (no installed package ships weights)."
    )


if __name__ == "__main__":
    main()
