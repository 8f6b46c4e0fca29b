"""Side-by-side training runs of adacc and its baselines.

Shared by the demo (``python examples/demo.py``) and
``bench/``. Every variant trains its own copy of the same initial weights on
the same batches; step times are measured interleaved across variants (one
step of each in turn, repeated) and reported as medians, because the
machines are shared and noisy. Peak memory is measured separately, one step
per variant, with `adacc_compile.measure`. Inductor's FX-graph and
AOTAutograd caches are off so that every variant really plans.

Variants (by name):
    eager            no compile, no checkpointing
    inductor         torch.compile, PyTorch's default min-cut partitioner
    full_ac          torch.compile + torch.utils.checkpoint on every block
    torch_dp / torch_ilp   torch.compile with PyTorch's activation_memory_budget
                     at the same ratio (its "dp" / "ilp" knapsack solvers)
    adacc            backend="adacc" (MILP) at the budget
    adacc_recompute_all / adacc_keep_all   adacc with those planners
    checkpoint_policy  torch.compile of a model whose ``Variant.prepare`` set
                     up its own activation checkpointing (a selective-checkpoint
                     policy per block, say), under an Inductor backend of its own
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from adacc_compile import compat
from adacc_compile.config import AdaccConfig
from adacc_compile.measure import measure_peak_bytes
from adacc_compile.partitioner import AdaccPartitioner

Batch = tuple[torch.Tensor, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    name: str
    kind: str
    """"eager", "inductor", "full_ac", "torch_budget", "adacc", "adacc_eager", "checkpoint_policy"."""
    budget: float = 1.0
    solver: str = "dp"
    options: dict[str, Any] = field(default_factory=dict)
    prepare: Callable[[torch.nn.Module], None] | None = None
    """Kind "checkpoint_policy": called on the variant's own copy of the
    model before it is compiled (to install its checkpointing)."""


@dataclass(slots=True, kw_only=True)
class VariantResult:
    name: str
    peak_bytes: int = 0
    step_peak_bytes: int | None = None
    """Peak of a whole training step (forward, backward and the optimizer
    step) above what was allocated before it, ``run_variants(step_peak=True)``
    only; ``peak_bytes`` is the forward and backward's."""
    predicted_peak_bytes: int | None = None
    planned_saved_bytes: int | None = None
    baseline_saved_bytes: int | None = None
    estimated_added_seconds: float | None = None
    planning_seconds: float | None = None
    compile_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    kernel_seconds: dict[str, float] = field(default_factory=dict)
    """Self CPU seconds per step of each profiled kernel or op (by name),
    filled by ``run_variants(kernel_profile_steps=...)``."""
    error: str | None = None
    """Why this variant has no figures (``run_variants(keep_going=True)``
    only): the exception that stopped it, in one line."""

    @property
    def median_step_seconds(self) -> float:
        return statistics.median(self.step_seconds) if self.step_seconds else float("nan")


def standard_variants(
    budget: float, *, include_ilp: bool = True, extra_adacc: bool = False, accuracy: str = "lossless"
) -> list[Variant]:
    variants = [
        Variant(name="no checkpointing", kind="inductor"),
        Variant(name="full AC", kind="full_ac"),
        Variant(name=f"torch budget dp @{budget:g}", kind="torch_budget", budget=budget, solver="dp"),
    ]
    if include_ilp:
        variants.append(Variant(name=f"torch budget ilp @{budget:g}", kind="torch_budget", budget=budget, solver="ilp"))
    label = f"adacc @{budget:g}" + ("" if accuracy == "lossless" else f" {accuracy}")
    variants.append(Variant(name=label, kind="adacc", options={"memory_budget": budget, "accuracy": accuracy}))
    if extra_adacc:
        variants.append(
            Variant(name="adacc recompute_all", kind="adacc", options={"memory_budget": budget, "planner": "recompute_all"})
        )
    return variants


@contextlib.contextmanager
def compile_caches(on: bool) -> Iterator[None]:
    """torch's FX graph and AOTAutograd caches as torch sets them (``on``),
    or off: every compile from nothing."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    if on:
        yield
        return
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


@contextlib.contextmanager
def _each_variant_compiled_once(count: int) -> Iterator[None]:
    """Every variant is a deep copy of one model, so all of them share one
    ``forward`` code object and Dynamo's per-code-object recompile limit (8):
    past it a copy silently runs eagerly, and resetting Dynamo between
    variants drops the ones compiled before, which then recompile at their
    next step (outside the per-variant config a PyTorch-budget variant
    compiled under). So: one reset before the run, room for ``count``
    compiled copies, and a hard error instead of a silent eager fallback."""
    import torch._dynamo.config as dynamo_config

    limits = {
        "recompile_limit": count + 8,
        "accumulated_recompile_limit": 16 * (count + 8),
        "fail_on_recompile_limit_hit": True,
    }
    torch._dynamo.reset()
    with dynamo_config.patch(**{k: v for k, v in limits.items() if hasattr(dynamo_config, k)}):
        yield


@dataclass(slots=True)
class _Runner:
    variant: Variant
    model: torch.nn.Module
    fn: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    partitioner: AdaccPartitioner | None
    result: VariantResult

    def compile_context(self) -> contextlib.AbstractContextManager[Any]:
        if self.variant.kind == "torch_budget":
            import torch._functorch.config as functorch_config

            return functorch_config.patch(
                activation_memory_budget=self.variant.budget,
                activation_memory_budget_solver=self.variant.solver,
            )
        return contextlib.nullcontext()

    def train_step(self, batch: Batch, seed: int = 0) -> float:
        # Same seed per step in every variant: identical dropout masks (with
        # Inductor's fallback_random), so lossless variants agree on the loss.
        torch.manual_seed(seed)
        self.optimizer.zero_grad(set_to_none=True)
        with self.compile_context():
            loss = self.fn(*batch)
            loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def _inductor_at_budget(variant: Variant) -> Callable[..., Any]:
    """Inductor under PyTorch's ``activation_memory_budget``, as a backend
    of its own: model copies share ``forward`` and (with inlined nn modules)
    its compiled code, and Dynamo tells cached code apart by backend, so a
    PyTorch-budget variant compiled with ``backend="inductor"`` would run
    the default's code at budget 1.0."""
    import torch._functorch.config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        with functorch_config.patch(
            activation_memory_budget=variant.budget, activation_memory_budget_solver=variant.solver
        ):
            return compile_fx(gm, example_inputs)

    return backend


def _own_inductor_backend() -> Callable[..., Any]:
    """Inductor under a backend object of its own, so that Dynamo never runs
    one variant's cached code for another's copy of the model (see
    `_inductor_at_budget`)."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return compile_fx(gm, example_inputs)

    return backend


OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def _make_runner(
    variant: Variant, base_model: torch.nn.Module, lr: float, optimizer: OptimizerFactory | None = None
) -> _Runner:
    model = copy.deepcopy(base_model)
    partitioner = None
    if variant.kind == "eager":
        fn: Callable[..., torch.Tensor] = model
    elif variant.kind == "torch_budget":
        fn = torch.compile(model, backend=_inductor_at_budget(variant))
    elif variant.kind in ("inductor", "full_ac"):
        if variant.kind == "full_ac":
            model.checkpoint_blocks = True
        fn = torch.compile(model, backend="inductor")
    elif variant.kind in ("adacc", "adacc_eager"):
        partitioner = AdaccPartitioner(AdaccConfig.from_options(variant.options))
        fn = torch.compile(model, backend=partitioner.backend(eager=variant.kind == "adacc_eager"))
    elif variant.kind == "checkpoint_policy":
        if variant.prepare is None:
            raise ValueError(f"variant {variant.name!r} of kind 'checkpoint_policy' needs a prepare function")
        variant.prepare(model)
        fn = torch.compile(model, backend=_own_inductor_backend())
    else:
        raise ValueError(f"unknown variant kind {variant.kind!r}")
    opt = optimizer(model.parameters()) if optimizer is not None else torch.optim.SGD(model.parameters(), lr=lr)
    return _Runner(variant, model, fn, opt, partitioner, VariantResult(name=variant.name))


def error_line(exc: BaseException) -> str:
    """One line for a failure: the root cause (Dynamo's compiler error wraps
    the backend's exception in ``inner_exception``, and its message is the
    useful one), type and first line of its message."""
    while (inner := exc.__cause__ or getattr(exc, "inner_exception", None)) is not None:
        exc = inner
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def run_variants(
    base_model: torch.nn.Module,
    batches: Sequence[Batch],
    variants: Sequence[Variant],
    *,
    timing_repeats: int = 5,
    lr: float = 1e-2,
    device: str = "cpu",
    kernel_profile_steps: int = 0,
    measuring: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    keep_going: bool = False,
    caches: bool = False,
    optimizer: OptimizerFactory | None = None,
    step_peak: bool = False,
    should_start: Callable[[Variant], bool] | None = None,
    progress: Callable[[list[VariantResult]], None] | None = None,
) -> list[VariantResult]:
    """Trains every variant on ``batches`` (one step each, first step
    compiles), then measures peak memory and interleaved step times.

    ``kernel_profile_steps`` > 0 also runs that many steps of each variant
    under the profiler, after the timed ones, and fills
    ``VariantResult.kernel_seconds``; compile under
    ``torch._inductor.config.cpp.enable_kernel_profile`` to see Inductor's
    generated CPU kernels there by name (else only the ops they call).

    ``measuring`` is entered around the peak and timing phases (for example
    a lock that keeps other processes off a shared GPU while this one
    measures); compiling runs outside it. ``keep_going=True`` records a
    variant that raises in ``VariantResult.error`` and goes on with the
    others, for runs too costly to repeat (a borrowed GPU).

    ``caches=True`` leaves torch's compile caches (FX graph and AOTAutograd
    caches) as torch sets them, on by default: what a user's run does. Off,
    every variant compiles from nothing, so compile times compare.

    ``optimizer`` makes each variant's optimizer from its parameters
    (default: SGD at ``lr``). ``step_peak=True`` also measures the peak of a
    whole step, the optimizer's included (`VariantResult.step_peak_bytes`).
    For runs on a clock: ``should_start(variant)`` is asked before each
    variant compiles, and a variant it refuses is reported as not run;
    ``progress(results)`` is called after each variant's compile, after the
    peaks and after the timing, so that a run cut short has written what it
    measured."""
    measuring = measuring or contextlib.nullcontext
    report = progress or (lambda results: None)
    # Checkpointed Hugging Face blocks compile whole: their attention writes a
    # module-level variable, which otherwise breaks the graph at every block
    # and runs full AC's blocks eagerly (3.5x slower steps on HF Llama).
    with compile_caches(caches), _each_variant_compiled_once(len(variants)), \
            compat.checkpoint_side_effects_not_replayed():
        runners = [_make_runner(v, base_model, lr, optimizer) for v in variants]
        live = list(runners)
        results = [r.result for r in runners]

        def each(action: Callable[[_Runner], None]) -> None:
            for runner in list(live):
                try:
                    action(runner)
                except Exception as exc:  # noqa: BLE001  (recorded, see keep_going)
                    if not keep_going:
                        raise
                    runner.result.error = error_line(exc)
                    live.remove(runner)

        def compile_step(runner: _Runner) -> None:
            if should_start is not None and not should_start(runner.variant):
                runner.result.error = "not run: time budget spent"
                live.remove(runner)
                return
            start = time.perf_counter()
            runner.result.losses.append(runner.train_step(batches[0], seed=0))
            runner.result.compile_seconds = time.perf_counter() - start
            _collect_plan(runner)
            report(results)

        def peak(runner: _Runner) -> None:
            runner.optimizer.zero_grad(set_to_none=True)
            batch = batches[0]
            with runner.compile_context():
                runner.result.peak_bytes = measure_peak_bytes(lambda: runner.fn(*batch).backward(), device)
            if step_peak:
                runner.optimizer.zero_grad(set_to_none=True)

                def whole_step() -> None:
                    runner.fn(*batch).backward()
                    runner.optimizer.step()

                with runner.compile_context():
                    runner.result.step_peak_bytes = measure_peak_bytes(whole_step, device)

        def timed_step(runner: _Runner) -> None:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            runner.train_step(batches[0])
            if device == "cuda":
                torch.cuda.synchronize()
            runner.result.step_seconds.append(time.perf_counter() - start)

        each(compile_step)
        for step, batch in enumerate(batches[1:], start=1):
            each(lambda runner: runner.result.losses.append(runner.train_step(batch, seed=step)))
        each(_collect_plan)  # a graph re-planned in the warm-up steps (step budgets across graph breaks)
        with measuring():
            each(peak)
            report(results)
            for _ in range(timing_repeats):
                each(timed_step)
        report(results)
        if kernel_profile_steps > 0:
            for runner in live:
                runner.result.kernel_seconds = _kernel_seconds(runner, batches[0], kernel_profile_steps)
    return results


def _kernel_seconds(runner: _Runner, batch: Batch, steps: int) -> dict[str, float]:
    """Self CPU seconds per step of every event the profiler records over
    ``steps`` training steps (self time, so nested events are not counted twice)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.train_step(batch)
    return {e.key: e.self_cpu_time_total / 1e6 / steps for e in prof.key_averages()}


def _collect_plan(runner: _Runner) -> None:
    if runner.partitioner is None or not runner.partitioner.reports:
        return
    # The plan each graph runs now: a graph re-planned since it was
    # compiled has a later report under the same index.
    latest = {r["summary"].get("graph_index", i): r for i, r in enumerate(runner.partitioner.reports)}
    summaries = [r["summary"] for r in latest.values()]
    result = runner.result
    result.reports = list(latest.values())
    result.predicted_peak_bytes = sum(s["predicted_peak_bytes"] for s in summaries)
    result.planned_saved_bytes = sum(s["planned_saved_bytes"] for s in summaries)
    result.baseline_saved_bytes = sum(s["baseline_saved_bytes"] for s in summaries)
    result.estimated_added_seconds = sum(s["estimated_added_seconds"] for s in summaries)
    result.planning_seconds = sum(sum(s["stage_seconds"].values()) for s in summaries)


def results_table(results: Sequence[VariantResult], reference: str | None = None) -> str:
    """Markdown table; ratios are against ``reference`` (default: first row)."""
    measured = [r for r in results if r.error is None] or list(results)
    ref = next((r for r in measured if r.name == reference), measured[0])
    lines = [
        "| variant | peak MiB (measured) | peak vs ref | predicted MiB | saved MiB | step ms (median) | step vs ref | compile s | plan s | final loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.error is not None:
            lines.append(f"| {r.name} | failed: {r.error.replace('|', '/')} |  |  |  |  |  |  |  |  |")
            continue
        lines.append(
            "| {name} | {peak:.2f} | {peak_ratio:.2f} | {pred} | {saved} | {step:.1f} | {step_ratio:.2f} | {comp:.1f} | {plan} | {loss:.4f} |".format(
                name=r.name,
                peak=r.peak_bytes / 2**20,
                peak_ratio=r.peak_bytes / max(ref.peak_bytes, 1),
                pred=f"{r.predicted_peak_bytes / 2**20:.2f}" if r.predicted_peak_bytes is not None else "",
                saved=f"{r.planned_saved_bytes / 2**20:.2f}" if r.planned_saved_bytes is not None else "",
                step=1e3 * r.median_step_seconds,
                step_ratio=r.median_step_seconds / ref.median_step_seconds,
                comp=r.compile_seconds,
                plan=f"{r.planning_seconds:.2f}" if r.planning_seconds is not None else "",
                loss=r.losses[-1] if r.losses else float("nan"),
            )
        )
    return "\n".join(lines)
