"""The one typed configuration of the adacc backend.

Built from ``torch.compile(..., options={...})`` by `AdaccConfig.from_options`.
Every field is validated up front so that a typo fails at ``torch.compile``
time with the list of valid choices, instead of silently planning with a
default. The config is frozen and hashable: `AdaccPartitioner.uuid()` hashes
it so Inductor's FX graph cache never returns a graph planned under other
options.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

PLANNERS = ("milp", "greedy", "recompute_all", "keep_all", "full_ac")
ACCURACY_MODES = ("lossless", "balanced", "aggressive")
ON_INFEASIBLE = ("warn", "error")
BUDGET_SCOPES = ("activations", "step")


def parse_bytes(text: str) -> int:
    """Parses "12GiB", "800MB", "1.5 gb", "4096" into a byte count."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if match is None:
        raise ValueError(
            f"memory_budget={text!r} is not a size; use e.g. '12GiB', '800MB', "
            f"an int number of bytes, or a ratio in (0, 1]"
        )
    number, unit = match.groups()
    unit = (unit or "b").lower()
    if unit not in _UNITS:
        valid = ", ".join(k.upper().replace("I", "i") for k in _UNITS)
        raise ValueError(f"unknown size unit {unit!r} in {text!r}; valid units: {valid}")
    return int(float(number) * _UNITS[unit])


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBudget:
    """Either an absolute byte count or a ratio of what PyTorch's default
    partitioner holds (`passes.budget` resolves it)."""

    bytes: int | None = None
    """Bytes the step's activation peak may reach."""
    ratio: float | None = None
    """Fraction of the default partitioner's activation peak (1.0 = never
    more than the default)."""

    def resolve(self, baseline_saved_bytes: int) -> int:
        """The budget in bytes against an anchor of ``baseline_saved_bytes``."""
        if self.bytes is not None:
            return self.bytes
        assert self.ratio is not None
        return int(self.ratio * baseline_saved_bytes)

    def describe(self) -> str:
        return f"{self.bytes} B" if self.bytes is not None else f"ratio {self.ratio:g}"

    @staticmethod
    def parse(value: Any) -> "MemoryBudget":
        if isinstance(value, MemoryBudget):
            return value
        if isinstance(value, bool):
            raise ValueError("memory_budget must be bytes, a size string or a ratio, not bool")
        if isinstance(value, int):  # always bytes: an int never changes meaning at 1
            if value <= 0:
                raise ValueError(f"memory_budget={value} bytes must be positive")
            return MemoryBudget(bytes=value)
        if isinstance(value, float):
            if not 0.0 < value <= 1.0:
                raise ValueError(
                    f"memory_budget={value} as a float is a ratio and must lie in (0, 1]; "
                    f"give bytes as an int or a string such as '12GiB'"
                )
            return MemoryBudget(ratio=value)
        if isinstance(value, str):
            if value.strip().endswith("%"):
                try:
                    percent = float(value.strip()[:-1])
                except ValueError:
                    raise ValueError(f"memory_budget={value!r} is not a percentage such as '50%'") from None
                return MemoryBudget.parse(percent / 100.0)
            try:
                as_float = float(value)
            except ValueError:
                return MemoryBudget(bytes=parse_bytes(value))
            return MemoryBudget.parse(as_float if "." in value else int(as_float))
        raise ValueError(
            f"memory_budget={value!r} ({type(value).__name__}) is not bytes (int), "
            f"a size string ('12GiB') or a ratio in (0, 1]"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AdaccConfig:
    """Options of the adacc backend (``torch.compile(options=...)`` keys)."""

    memory_budget: MemoryBudget = field(default_factory=lambda: MemoryBudget(ratio=1.0))
    """The activation peak of the training step (or the whole step's peak:
    ``budget_scope``): bytes (an int, always; or a size string such as
    "12GiB"), or a ratio of what PyTorch's default partitioner holds (its
    activation peak, and its saved bytes): a float in (0, 1] or a
    percentage string ("50%")."""

    budget_scope: str = "activations"
    """What ``memory_budget`` bounds: "activations" (the step's activation
    peak: saved values, forward temporaries, recomputed and decompressed
    values) or "step" (everything the step allocates, the peak a memory
    profiler shows less the parameters and inputs: the backward's gradients
    too). Under "step" the memory model holds what the backward's own
    values hold at each of its positions, so the planner keeps a plan's
    working set away from where gradients are large (on a 2-layer Llama,
    d_model 256, a plan with a lower activation peak had a step peak
    1.9 MiB higher, at the logits' gradient). A ratio is then of the
    default partitioner's step peak, as modelled."""

    planner: str = "milp"
    """Decision policy: "milp" (HiGHS), "greedy", "recompute_all", "keep_all",
    "full_ac" (each block's input kept, the block recomputed in its backward)."""

    solver_time_limit_s: float = 120.0
    """HiGHS time limit, a safety net; on expiry the best incumbent is used
    (with a warning: another process may stop elsewhere), or greedy."""

    solver_node_limit: int = 1000
    """Branch-and-bound nodes HiGHS may explore; at the limit its best plan
    is used. The limit that keeps plans the same in every process: it stops
    every solve at the same point, a time limit where the machine's load
    lets it."""

    mip_rel_gap: float = 1e-4
    """Relative optimality gap at which HiGHS stops."""

    on_infeasible: str = "warn"
    """Budget below the reachable minimum: "warn" (use the minimum-memory plan
    and warn with the reachable minimum) or "error" (raise)."""

    accuracy: str = "lossless"
    """Which codecs the planner may use: "lossless" (recompute and lossless
    codecs only: gradients equal eager's), "balanced" (+ int8_outlier, int8_channel),
    "aggressive" (+ fp8, int4, softmax_u8, few-bit activations); see
    `passes.codec_options`. Lossless by default: a compiler backend keeps
    numerics unless asked otherwise."""

    calibrate_codecs: bool = True
    """Measure each lossy codec on this model's real activations (one extra
    no-grad forward at compile time, on the batch being compiled for) and
    drop options whose error exceeds the codec's declared bound. Off, or
    without real inputs, the declared bounds are trusted."""

    codecs: tuple[str, ...] | None = None
    """Restrict the codec choice to these names (None = all that the accuracy
    mode allows; () = no compression)."""

    device_profile: str = "auto"
    """Cost model: "auto" (built-in profile for the detected GPU, else the
    measured profile of this machine), a built-in name ("a100", "h100",
    "h200"), "cpu" (measured once per machine and cached on disk, so plans
    repeat across processes: `passes.profile_cache`), or "calibrate"
    (measured now; replaces the cached figures)."""

    dump_dir: str | None = None
    """Write per-graph artifacts here (also from env ADACC_DUMP_DIR)."""

    solver_threads: int = 1
    """HiGHS threads; 1 keeps the plan deterministic across ranks."""

    allow_recompute: bool = True
    """False: the planner may only keep or compress (free view recomputation
    aside) — the "compression alone" baseline."""

    measure_step: bool = True
    """Under ``budget_scope="step"``: measure each graph's first training
    step and, where the measured peak is over the budget (or far under a
    budget that binds), re-plan once at the next step with the model's cap
    moved by the difference (`adacc_compile.step_measure`). On a CPU the
    step is measured with the profiler (once); False leaves the model's
    prediction unchecked."""

    peak_fit_solves: int = 1
    """Further MILP solves (each a split and a simulation of the graphs)
    that move the model's cap until the split graphs' simulated activation
    peak is within the budget and no more than 3% under it
    (`passes.plan_search`); the cheapest plan tried that fits is used. 0
    trusts the model's plan as it is. One by default: each costs a split
    of the whole graph (3.7 s of a 32-layer HF Llama's planning on this
    CPU; three of them were 15 of its 25 s, bench/bench_planning.py)."""

    place_backward_only_views_early: bool = True
    """A view only the backward reads (an attention's probabilities or a
    weight, transposed for a gradient) is taken where the forward is done
    with its base instead of at the forward's end, so that a compressed
    one is compressed there (`passes.early_placement`): under Inductor on
    CPU the model otherwise kept every such compress chain in the
    forward's last kernel group (a GPT compress-only plan predicted
    15.5 MiB above its measured step peak, exact with this). False keeps
    the joint graph's order (for A/B runs)."""

    place_backward_only_early: bool = True
    """Under Inductor, a value only the backward reads that the forward
    computes (a norm's normalised input, a SwiGLU's backward factors) goes
    to the forward kernel Inductor fuses it into: the first one, after its
    inputs exist, that reads one of them (`passes.early_placement`). The
    joint graph puts it at the forward's end, where it held its inputs
    alive in the model while Inductor computed it early: a 3-layer GPT
    d256 mixed plan @0.4 measured 40.56 MiB for a predicted 38.55 (over
    the budget); with this, 37.82 for 39.56 (bench/RESULTS.md). Such
    values get lossless codecs only (`passes.codec_options`). The eager
    realisation fuses nothing and keeps them in joint order (views still
    move, ``place_backward_only_views_early``). False keeps them in joint
    order under Inductor too (for A/B runs)."""

    inductor_buffer_reuse: bool = False
    """Let Inductor's generated code hand a freed buffer to a later
    allocation of the same size (Inductor's ``allow_buffer_reuse``). Off
    under adacc: the freed buffer stays allocated from its last use until
    that later allocation, wherever Inductor's own peak estimate (which
    counts the parameters as graph inputs) allows it, so the step's real
    peak exceeds the plan's model, which frees a value after its last
    reader. On a 2-layer Llama (d_model 256) a recompute-only plan peaked
    at 32.2 MiB with reuse and 26.8 MiB without (bench/RESULTS.md); in a
    25-step A/B the step times differed within this machine's noise.
    True restores Inductor's default."""

    block_reuse: bool = True
    """Solve one instance of each set of identical blocks and replicate it
    (Lynx HEU); False forces the full MILP (for comparison)."""

    # --- communication windows (Lynx) -----------------------------

    overlap_recompute: bool = True
    """Run recomputation inside the backward's communication windows (after a
    collective is issued, before its wait). False keeps the same plan but
    recomputes on demand, right before first use (the A/B baseline)."""

    comm_profile: str = "auto"
    """Link cost model for the windows: "auto" (NCCL -> "nvlink", else
    "gloo_cpu"), a built-in link ("nvlink3", "nvlink4", "pcie4", "pcie5",
    "ib_hdr", "ib_ndr", "gloo_cpu"; aliases "nvlink", "pcie", "infiniband",
    "gloo"), or "calibrate" (time all-reduces on the group at compile time)."""

    plan_check_timeout_s: float = 300.0
    """With torch.distributed initialised, how long to wait for the other
    ranks' plan hashes before raising (a mismatch raises at once)."""

    # --- adaptive re-planning (`adacc_compile.adaptation`) -------------------

    adapt: bool = False
    """Watch the compressed activations during training and re-plan when
    they drift from the statistics the plan was calibrated on (codec error
    above its bound, more outlier channels than the payload has slots for),
    or when `adacc_compile.replan` asks. Off by default: it costs a sampled
    forward every `adapt_every` steps."""

    adapt_every: int = 100
    """Measure the compressed values every this many calls of a graph (one
    no-grad forward of the planned graph on that call's inputs). A check
    cost 1.2 Inductor steps on CPU (bench/results/adaptive.md): 100 keeps
    the overhead near 1% of step time, 50 was 2.4%."""

    adapt_patience: int = 2
    """Hysteresis: a value must be over its threshold on this many
    consecutive checks before a re-plan fires, so one noisy batch does not."""

    adapt_max_replans: int = 3
    """At most this many re-plans per graph (each recompiles it once)."""

    # ------------------------------------------------------------------------

    @staticmethod
    def from_options(options: Mapping[str, Any] | None) -> "AdaccConfig":
        """Validates ``options`` and builds the config; env ADACC_DUMP_DIR is
        used when ``dump_dir`` is not given."""
        options = dict(options or {})
        names = {f.name for f in dataclasses.fields(AdaccConfig)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ValueError(
                f"unknown adacc option(s) {unknown}; valid options: {sorted(names)}"
            )
        kwargs: dict[str, Any] = {}
        if "memory_budget" in options:
            kwargs["memory_budget"] = MemoryBudget.parse(options["memory_budget"])
        for name in ("planner", "on_infeasible", "accuracy", "device_profile", "comm_profile", "budget_scope"):
            if name in options:
                kwargs[name] = str(options[name])
        for name in ("overlap_recompute", "block_reuse", "allow_recompute", "calibrate_codecs", "adapt",
                     "inductor_buffer_reuse", "place_backward_only_early", "place_backward_only_views_early",
                     "measure_step"):
            if name in options:
                kwargs[name] = _bool(name, options[name])
        for name in ("solver_time_limit_s", "mip_rel_gap", "plan_check_timeout_s"):
            if name in options:
                kwargs[name] = _positive_float(name, options[name])
        for name in ("solver_threads", "solver_node_limit", "adapt_every", "adapt_patience"):
            if name in options:
                kwargs[name] = _positive_int(name, options[name])
        for name in ("adapt_max_replans", "peak_fit_solves"):
            if name in options:
                kwargs[name] = _non_negative_int(name, options[name])
        if "codecs" in options:
            value = options["codecs"]
            if value is not None:
                if isinstance(value, str):
                    value = tuple(v for v in value.split(",") if v)
                value = tuple(str(v) for v in value)
            kwargs["codecs"] = value
        dump_dir = options.get("dump_dir", os.environ.get("ADACC_DUMP_DIR"))
        kwargs["dump_dir"] = str(dump_dir) if dump_dir else None
        config = AdaccConfig(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        _choice("planner", self.planner, PLANNERS)
        _choice("on_infeasible", self.on_infeasible, ON_INFEASIBLE)
        _choice("budget_scope", self.budget_scope, BUDGET_SCOPES)
        _choice("accuracy", self.accuracy, ACCURACY_MODES)
        from adacc_compile.passes.device_profile import BUILTIN_PROFILES

        _choice("device_profile", self.device_profile.lower(), (*BUILTIN_PROFILES, "cpu", "calibrate", "auto"))
        from adacc_compile.passes.comm_model import LINK_CHOICES

        _choice("comm_profile", self.comm_profile.lower(), LINK_CHOICES)
        if self.codecs:
            from adacc_compile.kernels import available_codecs

            bad = sorted(set(self.codecs) - set(available_codecs()))
            if bad:
                raise ValueError(
                    f"unknown codec(s) {bad}; available codecs: {available_codecs()}"
                )

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) used for hashing and dumps."""
        data = dataclasses.asdict(self)
        return json.dumps(data, sort_keys=True, default=str)


def _choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not one of: {', '.join(valid)}")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    raise ValueError(f"{name}={value!r} must be a bool")


def _positive_float(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a positive number") from None
    if not out > 0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return out


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be an int >= 0")
    return value
