"""Will a training job fit on a GPU: the memory of one rank's whole step.

Why: a budget on activations answers a narrower question than the one
people ask before renting ("does my job fit on N of these GPUs?"). The
rest of the step is plain arithmetic on the parameter count, and is what
decides it at 7B and above (AdamW's fp32 states alone are 8 bytes a
parameter: 54 GB for 7B). `adacc plan` without ``--budget`` plans the
activations into what the GPU has left (`budget_for`), and prints
`JobMemory`'s breakdown.

Figures used, per rank:

* **weights**: parameters x their bytes: 4 with ``fp32-master`` (fp32
  parameters, bf16 compute), 2 with ``bf16`` (parameters kept in bf16).
* **gradients**: the same dtype as the parameters.
* **optimizer state**: AdamW two states, SGD (momentum) one, in the
  parameters' dtype as ``torch.optim`` keeps them (8 bytes a parameter for
  AdamW with fp32 parameters, 4 with bf16); 8-bit AdamW two one-byte
  states (bitsandbytes' blockwise scales, 4 bytes per 2,048 values, are
  left out: 0.2%).
* **FSDP2 on N ranks** (``--gpus N --fsdp``): weights, gradients and
  optimizer state divided by N, plus what is unsharded at once: the
  current and the prefetched block's parameters all-gathered in bf16, and
  one block's unsharded gradients before their reduce-scatter.
* **activations**: without FSDP, adacc's simulated step peak (which holds
  the gradients as the backward makes them, in the traced dtype: where the
  gradients are fp32 the difference is added); with FSDP, the activation
  peak (the gradients are the sharded term above).
* **the optimizer's step**: torch's AdamW (its default, multi-tensor
  path) makes one temporary the size of a state (``_foreach_sqrt`` of the
  second moments) while the gradients are still held and the
  activations are gone; SGD with momentum and 8-bit AdamW work in place.
  Where that phase needs more than the backward's peak, the difference is
  its own row, so the parts still add up to the step's peak.
* **reserve**: the CUDA context and library workspaces (`CONTEXT_BYTES`)
  and the caching allocator's fragmentation (`FRAGMENTATION` of the
  capacity), which ``max_memory_allocated`` does not show but the GPU
  must hold.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GIB = 1 << 30

GPU_CAPACITY_BYTES: dict[str, int] = {
    "a100-40gb": int(39.4 * GIB),
    "a100": int(79.2 * GIB),
    "h100": int(79.2 * GIB),
    "h200": int(139.8 * GIB),
}
"""What ``torch.cuda.get_device_properties(0).total_memory`` reports for
each (A100 40 GB and 80 GB SXM, H100 80 GB SXM, H200 141 GB), rounded
down to 0.1 GiB; ``--gpu-memory`` overrides it for any other GPU."""

GPU_PROFILE: dict[str, str] = {"a100-40gb": "a100"}
"""The cost model (`device_profile.BUILTIN_PROFILES`) of a GPU listed
above, where its name is not the profile's."""


def profile_of(gpu: str) -> str:
    return GPU_PROFILE.get(gpu, gpu)


CONTEXT_BYTES = int(0.75 * GIB)
"""CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers, outside the
caching allocator (typically 0.5-1 GiB with torch 2.x on an H100)."""

FRAGMENTATION = 0.05
"""Share of the capacity the caching allocator holds beyond what is
allocated (block rounding and fragmentation)."""

OPTIMIZERS = ("adamw", "adamw8bit", "sgd", "none")
PRECISIONS = ("fp32-master", "bf16")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSetup:
    """How the job trains, as far as memory goes."""

    optimizer: str = "adamw"
    precision: str = "fp32-master"
    gpus: int = 1
    fsdp: bool = False

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, not {self.optimizer!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {self.precision!r}")
        if self.gpus < 1:
            raise ValueError(f"gpus must be positive, not {self.gpus}")

    @property
    def shards(self) -> int:
        """Ranks the parameters, gradients and optimizer state are split over."""
        return self.gpus if self.fsdp else 1

    @property
    def parameter_dtype_bytes(self) -> int:
        return 4 if self.precision == "fp32-master" else 2

    def optimizer_step_bytes_per_parameter(self) -> int:
        """Temporaries of the optimizer's step (module docstring)."""
        return self.parameter_dtype_bytes if self.optimizer == "adamw" else 0

    def optimizer_bytes_per_parameter(self) -> int:
        if self.optimizer == "adamw":
            return 2 * self.parameter_dtype_bytes
        if self.optimizer == "adamw8bit":
            return 2
        if self.optimizer == "sgd":
            return self.parameter_dtype_bytes
        return 0


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMemory:
    """One rank's step, part by part (bytes); ``total_peak_bytes`` is their sum."""

    gpu_capacity_bytes: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    unsharded_in_flight_bytes: int
    activation_peak_bytes: int
    optimizer_step_excess_bytes: int = 0
    """What the optimizer's step needs beyond the backward's peak (0 where
    the backward peaks higher)."""
    reserve_bytes: int

    @property
    def total_peak_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_state_bytes
                + self.unsharded_in_flight_bytes + self.activation_peak_bytes + self.optimizer_step_excess_bytes
                + self.reserve_bytes)

    @property
    def fits_gpu(self) -> bool:
        return self.total_peak_bytes <= self.gpu_capacity_bytes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total_peak_bytes": self.total_peak_bytes, "fits_gpu": self.fits_gpu}

    def rows(self, *, fsdp: bool) -> list[tuple[str, int]]:
        """(part, bytes), in the order the report prints them. Without FSDP
        the plan's step peak holds the gradients as the backward makes them
        (in the traced dtype); the gradients' row is what fp32 adds."""
        if fsdp:
            return [
                ("weights (shard)", self.weights_bytes),
                ("gradients (shard)", self.gradients_bytes),
                ("optimizer state (shard)", self.optimizer_state_bytes),
                ("unsharded blocks in flight", self.unsharded_in_flight_bytes),
                ("activations (adacc's plan)", self.activation_peak_bytes),
                ("optimizer step, beyond that peak", self.optimizer_step_excess_bytes),
                ("CUDA context + allocator reserve", self.reserve_bytes),
            ]
        return [
            ("weights", self.weights_bytes),
            ("optimizer state", self.optimizer_state_bytes),
            ("adacc's step (activations, gradients)", self.activation_peak_bytes),
            ("gradients beyond the traced dtype", self.gradients_bytes),
            ("optimizer step, beyond that peak", self.optimizer_step_excess_bytes),
            ("CUDA context + allocator reserve", self.reserve_bytes),
        ]


def reserve_bytes(capacity: int) -> int:
    return CONTEXT_BYTES + int(FRAGMENTATION * capacity)


def static_bytes(setup: TrainingSetup, parameters: int, block_parameters: int) -> dict[str, int]:
    """Weights, gradients, optimizer state and FSDP's unsharded blocks of one
    rank: what the step holds besides its activations."""
    shards = setup.shards
    dtype = setup.parameter_dtype_bytes
    in_flight = 0
    if setup.fsdp and setup.gpus > 1:
        in_flight = 2 * block_parameters * 2 + block_parameters * dtype
    return {
        "weights_bytes": -(-parameters * dtype // shards),
        "gradients_bytes": -(-parameters * dtype // shards),
        "optimizer_state_bytes": -(-parameters * setup.optimizer_bytes_per_parameter() // shards),
        "unsharded_in_flight_bytes": in_flight,
    }


def budget_for(capacity: int, setup: TrainingSetup, parameters: int, block_parameters: int,
               traced_gradient_bytes: int) -> tuple[int, str]:
    """The activation budget (bytes, and the ``budget_scope`` it bounds)
    that fills the GPU: its capacity less the reserve and the static
    parts. Without FSDP it bounds the step peak, which already holds the
    gradients (``traced_gradient_bytes``, in the traced dtype)."""
    parts = static_bytes(setup, parameters, block_parameters)
    left = capacity - reserve_bytes(capacity) - parts["weights_bytes"] - parts["optimizer_state_bytes"]
    left -= parts["unsharded_in_flight_bytes"]
    if setup.fsdp and setup.gpus > 1:
        return left - parts["gradients_bytes"], "activations"
    return left - max(parts["gradients_bytes"] - traced_gradient_bytes, 0), "step"


def job_memory(capacity: int, setup: TrainingSetup, parameters: int, block_parameters: int, *,
               step_peak_bytes: int, activation_peak_bytes: int, traced_gradient_bytes: int) -> JobMemory:
    """One rank's step: the static parts beside adacc's plan of the
    activations (module docstring). Without FSDP the plan's step peak
    stands for activations and gradients together, so the gradients'
    row holds only what fp32 gradients add to the traced ones."""
    parts = static_bytes(setup, parameters, block_parameters)
    # The optimizer's step: weights, all gradients, the states and the
    # step's temporaries, the activations gone.
    optimizer_step = (parts["weights_bytes"] + parts["gradients_bytes"] + parts["optimizer_state_bytes"]
                      + -(-parameters * setup.optimizer_step_bytes_per_parameter() // setup.shards))
    if not (setup.fsdp and setup.gpus > 1):
        parts["gradients_bytes"] = max(parts["gradients_bytes"] - traced_gradient_bytes, 0)
        activation_peak_bytes = step_peak_bytes
    backward = sum(parts.values()) + activation_peak_bytes
    return JobMemory(gpu_capacity_bytes=capacity, activation_peak_bytes=activation_peak_bytes,
                     optimizer_step_excess_bytes=max(optimizer_step - backward, 0),
                     reserve_bytes=reserve_bytes(capacity), **parts)
