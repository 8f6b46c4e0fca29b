"""An auto_perf_maxing-style keep/recompute baseline: a per-layer LP over
which op outputs of each decoder block to keep, rounded per layer and
applied through PyTorch's selective-checkpoint tags.

Why: adacc should be compared with the strongest published planner of the
same kind, not only with full checkpointing and PyTorch's partitioner.
torchtitan's graph trainer (pull requests 3942 and 4636,
``torchtitan/experiments/graph_trainer/auto_sac_offload_solver.py``) plans
activation memory in two levels: an outer LP that splits the memory budget
across the transformer blocks, with a forward-peak and a backward-peak row
at every block, and an inner step per block that turns the block's share
into keep / recompute / offload decisions (greedily, by recompute time per
byte), written into the graph as checkpoint tags. This module follows that
formulation with offload off (one GPU, no host-link model).

**Profile** (`profile_block`, one eager run of one decoder block with the
step's real inputs): every op call the block's forward makes, in the order
PyTorch's selective-checkpoint machinery sees them, keyed by (op, how many
calls of that op came before it in the block); for each, the bytes its
output would hold if kept (0 for views of an input) and its recompute cost
``c_i``, a roofline estimate ``max(FLOPs / peak FLOP/s, bytes read and
written / memory bandwidth)`` (FLOPs from ``torch.utils.flop_counter``'s
formulas; `Roofline` has the device figures). Also measured: ``h``, the
block input a checkpointed block keeps; ``a``, the bytes autograd saves for
one block without checkpointing (what the backward rematerialises); ``T``,
the peak of one block's forward; ``G``, the peak of one block's backward
above its saved values.

**LP** (`plan`, HiGHS): variables ``x[l,i]`` in [0, 1], the kept fraction
of op output ``i`` (``s_i`` bytes) in layer ``l``; ``K_l = sum_i s_i
x[l,i]``. Objective: minimise the recompute cost ``sum_l sum_i c_i (1 -
x[l,i])``. Rows, for every layer position ``l`` (``A`` = activation
budget, below):

* forward peak: ``sum_{m<=l} (h + K_m) + T <= A`` (kept activations of the
  layers so far and this layer's transient working set);
* backward peak: ``sum_{m<l} (h + K_m) + h + a + G <= A`` (kept activations
  of the layers below, this layer fully rematerialised, and its gradient
  working set).

**Rounding** (per layer, torchtitan's greedy inner step): the op outputs
of layer ``l`` ranked by cost per byte, highest first, each kept while it
fits in what the LP kept in that layer, ``sum_i s_i x*[l,i]``; then, since
rounding down leaves room, a second pass (last layer first) keeps any
further output that every row still admits. Every row holds after both
passes, so the plan's predicted peak is at most the budget.

**Applied** (`context_fn`): per layer, a policy for
``torch.utils.checkpoint.create_selective_checkpoint_contexts`` that says
MUST_SAVE for the kept (op, index) calls and PREFER_RECOMPUTE for every
other, counting op calls afresh at each forward and each recompute. An op
call the profile did not see (a compiled trace can differ from eager, e.g.
GQA's key/value expansion) is recomputed; the SDPA kernels count as one op
(`SDPA`), since eager and compiled code may pick different ones.

**Budget.** The budget is a byte budget for the step's peak, in the units
adacc's ``budget_scope="step"`` and `adacc_compile.measure` use: the peak
of the forward and backward above what was allocated before the step
(weights and optimizer state). What the step needs besides the blocks'
activations (parameter gradients, the logits and the loss's float copies,
the embedding output), ``F``, is subtracted: ``A = budget - F``. ``F`` is
measured where possible (`fixed_bytes_from_measured_floor`): the measured
peak of full per-block checkpointing minus the rows' prediction for it
(every ``x = 0``); else estimated (`estimated_fixed_bytes`: every
parameter's gradient, plus the logits in the model's dtype and two float32
copies for the loss and its gradient).

Where this differs from torchtitan's: the outer LP there has one keep
fraction per block (over the block's activation bytes) and this one a
fraction per op output per block, which the rounding then reads as the
block's byte allocation; torchtitan measures op runtimes by benchmarking the
graph's nodes, this uses a roofline estimate (deterministic, and the same
on a CPU); torchtitan tags the joint graph of a traced step and this tags op
calls through the public selective-checkpoint API; torchtitan estimates the
non-activation memory from the traced graph plus the optimizer state and
this calibrates it on a measured full-checkpointing step; no offload
variables, no parameter-unsharding terms (one GPU) and no separate loss
row (the loss's memory is in ``F``).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from adacc_compile.measure import measure_peak_bytes

OpKey = tuple[str, int]
"""(op name, how many calls of that op came before it in the block's forward)."""

SDPA = "aten._scaled_dot_product_*_attention"
"""The name every SDPA kernel goes by in an `OpKey`: eager and compiled
code may pick different kernels for the same attention (a compiled trace
that passes a mask cannot use flash attention on a GPU)."""


def op_name(func: Any) -> str:
    name = str(func)
    return SDPA if "scaled_dot_product" in name else name


@dataclass(frozen=True, slots=True)
class Roofline:
    """Device figures for the recompute-cost estimate."""

    flops_per_s: float
    bytes_per_s: float

    @classmethod
    def for_device(cls, device: torch.device | str) -> "Roofline":
        """An H100's dense bf16 matmul rate and HBM3 bandwidth on a GPU (the
        attainable, not the datasheet, figures); a few cores' on a CPU."""
        if torch.device(device).type == "cuda":
            return cls(flops_per_s=600e12, bytes_per_s=3.0e12)
        return cls(flops_per_s=100e9, bytes_per_s=20e9)

    def seconds(self, flops: int, bytes_moved: int) -> float:
        return max(flops / self.flops_per_s, bytes_moved / self.bytes_per_s)


@dataclass(frozen=True, slots=True)
class OpCall:
    op: str
    index: int
    bytes: int
    """Bytes its output holds if kept (0: a view of an input)."""
    flops: int
    cost_s: float
    """Estimated seconds to recompute it (`Roofline`)."""

    @property
    def key(self) -> OpKey:
        return (self.op, self.index)


@dataclass(frozen=True, slots=True)
class BlockProfile:
    calls: tuple[OpCall, ...]
    """Every op call of one block's forward, in order."""
    input_bytes: int
    """h: what a checkpointed block keeps (its hidden-state input)."""
    saved_bytes: int
    """a: what autograd saves for one block without checkpointing."""
    forward_peak_bytes: int
    """T: the peak of one block's forward."""
    backward_peak_bytes: int
    """G: the peak of one block's backward above its saved values."""

    @property
    def candidates(self) -> tuple[OpCall, ...]:
        """The op calls whose keeping costs memory."""
        return tuple(c for c in self.calls if c.bytes > 0)


@dataclass(frozen=True, slots=True)
class Plan:
    budget_bytes: int
    fixed_bytes: int
    """F: the step's memory besides the blocks' activations."""
    keep: tuple[frozenset[OpKey], ...]
    """Per layer: the op calls whose outputs it keeps."""
    kept_bytes: tuple[int, ...]
    lp_kept_bytes: tuple[float, ...]
    """What the LP kept in each layer before rounding."""
    predicted_peak_bytes: int
    binding_row: str
    recompute_seconds: float
    """Estimated recompute cost of the rounded plan (all layers)."""
    lp_recompute_seconds: float
    full_recompute_seconds: float
    """The same for recomputing every op (full checkpointing)."""
    solve_seconds: float


class InfeasibleBudget(ValueError):
    """No keep/recompute split fits: even recomputing everything needs
    ``floor_bytes`` (every layer's input kept, and the rows' working sets)."""

    def __init__(self, budget_bytes: int, floor_bytes: int):
        self.budget_bytes, self.floor_bytes = budget_bytes, floor_bytes
        super().__init__(
            f"budget {budget_bytes / 2**20:.1f} MiB is below what recomputing every op still needs "
            f"({floor_bytes / 2**20:.1f} MiB)"
        )


# --------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _op_flops(func: Any, args: Any, kwargs: Any, out: Any) -> int:
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(getattr(func, "_overloadpacket", None))
    if formula is None:
        if "scaled_dot_product" in str(func) and len(args) >= 2:  # CPU flash attention has no formula
            q, k = args[0], args[1]
            return 4 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * q.shape[-1]
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # noqa: BLE001  (a formula that does not fit this call: count it as memory-bound)
        return 0


def record_op_calls(run: Callable[[], Any], roofline: Roofline) -> list[OpCall]:
    """The op calls ``run()`` makes, as PyTorch's selective checkpointing
    sees them (through its policy hook, which is given each call's output)."""
    calls: list[OpCall] = []
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        name = op_name(func)
        inputs = _tensors((args, kwargs))
        in_storages = {_storage(t) for t in inputs}
        outputs = _tensors(ctx.op_output)
        fresh = [t for t in outputs if _storage(t) not in in_storages]
        out_bytes = sum(t.numel() * t.element_size() for t in fresh)
        moved = out_bytes + sum(t.numel() * t.element_size() for t in inputs)
        flops = _op_flops(func, args, kwargs, ctx.op_output)
        calls.append(OpCall(op=name, index=counts[name], bytes=out_bytes, flops=flops,
                            cost_s=roofline.seconds(flops, moved) if out_bytes else 0.0))
        counts[name] += 1
        return CheckpointPolicy.PREFER_RECOMPUTE

    forward_context, _ = create_selective_checkpoint_contexts(policy)
    with forward_context:
        run()
    return calls


def capture_block_call(model: torch.nn.Module, block: torch.nn.Module, run: Callable[[], Any]) -> tuple[tuple, dict]:
    """The arguments ``block`` is called with while ``run()`` runs the
    model (no gradients), detached: the block's real inputs, masks and
    position embeddings included."""
    captured: list[tuple[tuple, dict]] = []

    def hook(_module: Any, args: tuple, kwargs: dict) -> None:
        if not captured:
            captured.append((_detached(args), _detached(kwargs)))

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError("the block was not called")
    return captured[0]


def _first_tensor(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else _tensors(out)[0]


def profile_block(block: torch.nn.Module, args: tuple, kwargs: dict, roofline: Roofline) -> BlockProfile:
    """One eager run of ``block(*args, **kwargs)`` per measurement (see the
    module docstring). ``args[0]`` is the hidden state. Leaves no gradients."""
    device = args[0].device
    x = args[0].detach()
    rest = args[1:]
    params = {_storage(p) for p in block.parameters()}
    inputs = {_storage(t) for t in _tensors((args, kwargs))}

    def call(hidden: torch.Tensor) -> torch.Tensor:
        return _first_tensor(block(hidden, *rest, **kwargs))

    hidden = x.clone().requires_grad_(True)  # as in training
    calls = record_op_calls(lambda: call(hidden), roofline)
    with torch.no_grad():
        forward_peak = measure_peak_bytes(lambda: call(x), device)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        sid = _storage(t)
        if sid not in params and sid not in inputs:
            saved[sid] = t.untyped_storage().nbytes()
        return t

    hidden = x.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = call(hidden)
    grad = torch.ones_like(out)
    backward_peak = measure_peak_bytes(lambda: out.backward(grad), device)
    block.zero_grad(set_to_none=True)
    return BlockProfile(
        calls=tuple(calls),
        input_bytes=x.numel() * x.element_size(),
        saved_bytes=sum(saved.values()),
        forward_peak_bytes=forward_peak,
        backward_peak_bytes=backward_peak,
    )


# --------------------------------------------------------------------------
# rows, budget conversion
# --------------------------------------------------------------------------


def activation_rows(profile: BlockProfile, kept_bytes: Sequence[float]) -> list[tuple[str, float]]:
    """Each row's left-hand side (bytes, ``F`` not included) for the given
    kept bytes per layer."""
    h, rows, below = profile.input_bytes, [], 0.0
    for layer, kept in enumerate(kept_bytes):
        rows.append((f"backward {layer}", below + h + profile.saved_bytes + profile.backward_peak_bytes))
        below += h + kept
        rows.append((f"forward {layer}", below + profile.forward_peak_bytes))
    return rows


def floor_bytes(profile: BlockProfile, layers: int) -> int:
    """The rows' peak with nothing kept (every op recomputed)."""
    return int(max(v for _, v in activation_rows(profile, [0.0] * layers)))


def fixed_bytes_from_measured_floor(profile: BlockProfile, layers: int, measured_full_ac_peak: int) -> int:
    """``F`` from a measured step of full per-block checkpointing: its peak
    less what the rows predict for it."""
    return max(0, int(measured_full_ac_peak) - floor_bytes(profile, layers))


def estimated_fixed_bytes(model: torch.nn.Module, tokens: int, vocab_size: int) -> int:
    """``F`` without a measurement: every parameter's gradient, plus the
    logits in the model's dtype and two float32 copies (the loss's upcast
    and its gradient)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    dtype_bytes = next(model.parameters()).element_size()
    return params + tokens * vocab_size * (dtype_bytes + 8)


# --------------------------------------------------------------------------
# LP and rounding
# --------------------------------------------------------------------------


def _solve_lp(profile: BlockProfile, layers: int, activation_budget: float) -> list[list[float]]:
    """x[l][i] of the LP (candidates in `BlockProfile.candidates` order)."""
    import numpy as np
    import highspy

    from adacc_compile.passes.milp import _quiet_highs

    cands = profile.candidates
    n = len(cands)
    total_seconds = sum(c.cost_s for c in cands) or 1.0
    h = profile.input_bytes
    rows: list[tuple[float, list[int]]] = []  # (right-hand side, layers whose K the row sums)
    for l in range(layers):
        rows.append((activation_budget - (l + 1) * h - profile.forward_peak_bytes, list(range(l + 1))))
        if l > 0:
            rows.append((activation_budget - (l + 1) * h - profile.saved_bytes - profile.backward_peak_bytes,
                         list(range(l))))
    scale = 2.0**20  # MiB: small coefficients
    lp = highspy.HighsLp()
    lp.num_col_ = layers * n
    lp.num_row_ = len(rows)
    lp.col_cost_ = np.array([-c.cost_s / total_seconds for _ in range(layers) for c in cands])
    lp.col_lower_ = np.zeros(layers * n)
    lp.col_upper_ = np.ones(layers * n)
    lp.row_lower_ = np.full(len(rows), -np.inf)
    lp.row_upper_ = np.array([rhs / scale for rhs, _ in rows])
    starts, index, value = [0], [], []
    for _rhs, covered in rows:
        for l in covered:
            index.extend(l * n + i for i in range(n))
            value.extend(c.bytes / scale for c in cands)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = layers * n
    lp.a_matrix_.num_row_ = len(rows)
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
    lp.sense_ = highspy.ObjSense.kMinimize
    highs = _quiet_highs()
    highs.setOptionValue("threads", 1)  # as adacc's solves: HiGHS keeps one thread scheduler per process
    highs.passModel(lp)
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"the keep LP ended {highs.modelStatusToString(highs.getModelStatus())}")
    values = list(highs.getSolution().col_value)
    return [[min(1.0, max(0.0, v)) for v in values[l * n:(l + 1) * n]] for l in range(layers)]


def _rows_hold(profile: BlockProfile, kept: Sequence[float], activation_budget: float) -> bool:
    return all(v <= activation_budget for _, v in activation_rows(profile, kept))


def plan(profile: BlockProfile, layers: int, budget_bytes: int, fixed_bytes: int) -> Plan:
    """The keep plan for ``layers`` identical blocks at a step budget of
    ``budget_bytes`` (``F`` = ``fixed_bytes``); raises `InfeasibleBudget`
    below the floor."""
    start = time.perf_counter()
    activation_budget = float(budget_bytes - fixed_bytes)
    floor = floor_bytes(profile, layers)
    if floor > activation_budget:
        raise InfeasibleBudget(budget_bytes, floor + fixed_bytes)
    cands = profile.candidates
    x = _solve_lp(profile, layers, activation_budget)
    lp_kept = [sum(c.bytes * v for c, v in zip(cands, xs)) for xs in x]
    ranked = sorted(range(len(cands)), key=lambda i: (-cands[i].cost_s / cands[i].bytes, i))
    keep: list[set[int]] = []
    kept: list[int] = []
    for allocation in lp_kept:
        chosen, used = set(), 0
        for i in ranked:
            if used + cands[i].bytes <= allocation + 1e-6:
                chosen.add(i)
                used += cands[i].bytes
        keep.append(chosen)
        kept.append(used)
    for l in reversed(range(layers)):  # rounding down left room: fill it, last layer first
        for i in ranked:
            if i in keep[l]:
                continue
            trial = kept[:l] + [kept[l] + cands[i].bytes] + kept[l + 1:]
            if _rows_hold(profile, trial, activation_budget):
                keep[l].add(i)
                kept = trial
    rows = activation_rows(profile, kept)
    binding, peak = max(rows, key=lambda r: r[1])
    full = sum(c.cost_s for c in cands)
    return Plan(
        budget_bytes=int(budget_bytes),
        fixed_bytes=int(fixed_bytes),
        keep=tuple(frozenset(cands[i].key for i in chosen) for chosen in keep),
        kept_bytes=tuple(kept),
        lp_kept_bytes=tuple(lp_kept),
        predicted_peak_bytes=int(peak + fixed_bytes),
        binding_row=binding,
        recompute_seconds=sum(full - sum(cands[i].cost_s for i in chosen) for chosen in keep),
        lp_recompute_seconds=sum(sum(c.cost_s * (1 - v) for c, v in zip(cands, xs)) for xs in x),
        full_recompute_seconds=full * layers,
        solve_seconds=time.perf_counter() - start,
    )


# --------------------------------------------------------------------------
# applying a plan
# --------------------------------------------------------------------------


def keep_policy(keep: frozenset[OpKey]) -> Callable[..., CheckpointPolicy]:
    """A selective-checkpoint policy for one checkpointed call of a block:
    MUST_SAVE for the kept (op, index) calls, PREFER_RECOMPUTE otherwise;
    the forward and the recompute count their calls apart."""
    counts: dict[tuple[bool, str], int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        name = op_name(func)
        index = counts[(ctx.is_recompute, name)]
        counts[(ctx.is_recompute, name)] += 1
        return CheckpointPolicy.MUST_SAVE if (name, index) in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def context_fn(keep: frozenset[OpKey]) -> Callable[[], Any]:
    """``torch.utils.checkpoint.checkpoint(..., context_fn=...)`` for a
    block that keeps ``keep``: fresh call counts at every call."""
    return lambda: create_selective_checkpoint_contexts(keep_policy(keep))


def checkpoint_fn(keep: frozenset[OpKey]) -> Callable[..., Any]:
    """The checkpoint function of one block under the plan."""
    return functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False, context_fn=context_fn(keep))
