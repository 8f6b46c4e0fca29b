"""`AdaccPartitioner`: the object Inductor / AOTAutograd call to split the
joint graph into forward and backward.

It is Inductor's ``custom_partitioner_fn`` for ``backend="adacc"`` and the
``partition_fn`` of AOTAutograd for ``backend="adacc_eager"``. All the work
is the pipeline (`adacc_compile.stage_runner`); this class only adapts the
calling conventions and provides ``uuid()`` for Inductor's FX graph cache.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import pathlib
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat_inductor, plan_records
from adacc_compile.config import AdaccConfig
from adacc_compile.passes.codec_options import allowed_codecs
from adacc_compile.passes.compress_rewrite import replaced_ops
from adacc_compile.passes.device_profile import profile_by_name
from adacc_compile.passes.fusion import PLACED, Realization
from adacc_compile.stage_runner import run_pipeline
from adacc_compile.report import write_summary
from adacc_compile.step_measure import Correction
from adacc_compile.step_ledger import LEDGER, Holding, StepBudgetGraph, ask_earlier_graphs_for_room, tracked
from adacc_compile.state import PartitionState

_SOURCE_ROOTS = (pathlib.Path(__file__).parent,)

log = logging.getLogger(__name__)


def _source_digest() -> str:
    """Hash of adacc's own sources: a code change invalidates cached graphs."""
    from adacc_compile import kernels, passes

    digest = hashlib.sha256()
    roots = (*_SOURCE_ROOTS, pathlib.Path(passes.__file__).parent, pathlib.Path(kernels.__file__).parent)
    for root in roots:
        for path in sorted(root.glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


#: The replaced activation backwards the memory model has been checked on
#: when kept whole. ``silu_backward`` is not among them: kept whole, a
#: 2-layer Llama's compress-only plan at 0.4 (d_model 256) measured 23.72
#: MiB against 23.06 predicted (25.97 / 25.97 with the op decomposed,
#: bench/RESULTS.md): the forward's SiLU output, which that plan codes, is
#: never written by Inductor, which writes the product with the up
#: projection to a new buffer while the gate is alive; the model reuses
#: the gate's buffer twice, one FFN buffer short at the forward's peak. So
#: fewbit_silu stays an ``adacc_eager`` codec until the model follows that
#: graph.
MODELLED_WHOLE_OPS = (torch.ops.aten.gelu_backward.default,)


def whole_ops(config: AdaccConfig) -> tuple[Any, ...]:
    """The activation backwards the joint graph keeps whole under
    ``config``: those a codec it may plan replaces (`Codec.replaced_op`)
    and the memory model follows whole (`MODELLED_WHOLE_OPS`). Empty for
    plans without few-bit codecs, whose joint graphs stay as Inductor
    decomposes them."""
    planned = replaced_ops(allowed_codecs(config.accuracy, config.codecs))
    return tuple(op for op in planned if op in MODELLED_WHOLE_OPS)


@functools.lru_cache(maxsize=None)
def _warn_unchecked_habits(version: str) -> None:
    """Once per process: where this torch is not among the versions the
    Inductor habits the memory model mirrors were checked on."""
    from adacc_compile.passes.inductor_habits import HABITS, unchecked_on

    unchecked = unchecked_on(version)
    if unchecked:
        warnings.warn(
            f"adacc: {len(unchecked)} of the {len(HABITS)} Inductor habits its memory model mirrors were not "
            f"checked on torch {version} (passes/inductor_habits.py); predicted peaks may drift from measured "
            f"ones (budget_scope='step' measures the first step and corrects)",
            stacklevel=3,
        )


class AdaccPartitioner(compat_inductor.custom_partitioner_base()):  # type: ignore[misc]
    """Plans saved activations for one joint graph under ``config``."""

    def __init__(self, config: AdaccConfig):
        self.config = config
        self.real_inputs: list[Any] | None = None
        """The backend's real example inputs, for codec calibration; used by
        the next graph partitioned, then dropped (they hold a batch)."""
        self.reports: list[dict[str, Any]] = []
        """One ``{"summary": ..., "plan": [...]}`` per partitioned graph."""
        self.eager = False
        """The split graphs run eagerly (``adacc_eager``): nothing fuses."""
        self.graph_index = 0
        """Process-wide index of the graph being compiled (`step_ledger`)."""
        self.revision = ""
        """Set while re-planning (`adaptation`): part of `uuid()`, so that
        Inductor's caches never serve the plan being replaced."""
        self.start_plan: dict[str, Any] | None = None
        """Set while re-planning: the plan being replaced, the MILP's start."""
        self.latest: dict[int, dict[str, Any]] = {}
        """Per graph index (the step ledger's), the report of its current
        plan (``reports`` keeps every plan made, re-plans included)."""
        self.corrections: dict[int, int] = {}
        """Per graph index, how far its measured first step peaked above its
        plan's prediction, where that buys a re-plan (`step_measure`)."""
        self.last_state: PartitionState | None = None
        """With ``adapt``, the state of the graph planned last: the
        adaptation controller monitors its compressed values."""

    def __deepcopy__(self, memo: dict[int, Any]) -> "AdaccPartitioner":
        # Inductor deep-copies its config patches; sharing the instance keeps
        # `reports` visible to the caller (the config itself is immutable).
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # Inductor's FX graph cache key pickles its whole config, this object
        # included (besides `uuid()`): only the config may go into that pickle,
        # not the reports (timings) or the batch held for calibration, or no
        # key would ever repeat; nor where the dumps go (see `uuid`).
        return (AdaccPartitioner, (self._code_config(),))

    def _code_config(self) -> AdaccConfig:
        """The config less what changes no generated code (where dumps go)."""
        return dataclasses.replace(self.config, dump_dir=None)

    def __call__(
        self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        num_fwd_outputs = kwargs.get("num_fwd_outputs")
        if num_fwd_outputs is None:
            raise TypeError("AdaccPartitioner needs num_fwd_outputs (passed by AOTAutograd)")
        config = self.config
        if self.revision and config.dump_dir:
            # A re-plan's dumps go to its own version folder (`adaptation`),
            # not to a new graph_NNN folder.
            config = dataclasses.replace(config, dump_dir=None)
        state = PartitionState(
            joint=gm,
            config=config,
            num_fwd_outputs=int(num_fwd_outputs),
            static_lifetime_input_indices=list(kwargs.get("static_lifetime_input_indices") or []),
            real_inputs=self.real_inputs,
            mode=Realization.EAGER if self.eager else Realization.INDUCTOR,
            graph_index=self.graph_index,
            held_by_earlier_graphs=LEDGER.held_bytes(),
            held_default_by_earlier_graphs=LEDGER.held_default_bytes(),
            earlier_graphs=tuple(h.graph for h in LEDGER.holding()),
            boundary_cap_bytes=LEDGER.cap_for(self.graph_index),
            later_gradient_bytes=LEDGER.later_gradient_bytes(self.graph_index),
            measured_excess_bytes=self.corrections.get(self.graph_index, 0),
            start_plan=self.start_plan,
        )
        self.real_inputs = None
        run_pipeline(state)
        if config.budget_scope == "step" and state.timeline is not None and state.budget is not None:
            LEDGER.planned_under(
                self.graph_index, cap=state.boundary_cap_bytes, later_gradients=state.later_gradient_bytes,
                peak=state.timeline.peak_bytes, budget=state.budget.budget_bytes,
            )
            ask_earlier_graphs_for_room(state)
        self.reports.append(state.report)
        if self.config.adapt:
            self.last_state = state
        assert state.fw_module is not None and state.bw_module is not None
        return state.fw_module, state.bw_module

    def compile(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], *, eager: bool = False
    ) -> Callable[..., Any]:
        """A backend body: AOTAutograd with this partitioner, then Inductor
        (or, with ``eager=True``, the graphs run eagerly). Dynamo passes real
        example inputs; they are kept for codec calibration. With ``adapt``
        the result is an `adaptation.AdaptiveGraph` that may re-plan it."""
        graph_index = LEDGER.new_graph()
        compiled, planned = self.plan_and_compile(gm, example_inputs, eager=eager, graph_index=graph_index)
        if planned and not self.config.adapt and self.config.budget_scope == "step":
            return StepBudgetGraph(
                compiled, functools.partial(self.replan_for_room, gm, eager=eager, graph_index=graph_index),
                graph_index,
                measured=functools.partial(self.step_measured, graph_index) if self.config.measure_step else None,
            )
        if not planned or not self.config.adapt or self.last_state is None:
            return compiled
        from adacc_compile.adaptation import AdaptiveGraph

        state, self.last_state = self.last_state, None
        return AdaptiveGraph(partitioner=self, graph=gm, eager=eager, graph_index=graph_index,
                             compiled=compiled, state=state, inputs=example_inputs)

    def plan_and_compile(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], *, eager: bool, graph_index: int
    ) -> tuple[Callable[..., Any], bool]:
        """Compiles ``gm`` as graph ``graph_index`` of the step; returns the
        callable and whether a training graph was planned (False: no
        backward, nothing held)."""
        self.real_inputs = list(example_inputs)
        self.eager = eager
        self.graph_index = graph_index
        planned = len(self.reports)
        if eager:
            compiled = compat_inductor.eager_aot_compile(gm, example_inputs, self)
        else:
            _warn_unchecked_habits(torch.__version__)
            patches: dict[str, Any] = {"custom_partitioner_fn": self}
            if not self.config.inductor_buffer_reuse:  # frees at last use, as the plan's model does
                patches["allow_buffer_reuse"] = False
            if self.config.adapt:  # codec parameters stay tensors a recalibration can overwrite
                patches["always_keep_tensor_constants"] = True
            compiled = compat_inductor.inductor_compile(
                gm, example_inputs, patches, pinned_meta_key=PLACED, whole_ops=self.whole_ops()
            )
        if len(self.reports) == planned:  # no backward: nothing held
            return compiled, False
        self.latest[graph_index] = self.reports[-1]
        summary = self.reports[-1]["summary"]
        plan_records.record(self, example_inputs, summary)
        holding = Holding(self.graph_index, summary["planned_saved_bytes"], summary["default_saved_bytes"])
        return tracked(compiled, holding), True

    def replan_for_room(
        self, gm: fx.GraphModule, args: Sequence[Any], *, eager: bool, graph_index: int
    ) -> Callable[..., Any] | None:
        """Graph ``graph_index`` planned and compiled again at a step
        boundary: under the cap a later graph of the step asked for
        (`step_ledger`), with its measured first step's correction
        (`step_measure`); None where no training graph came out."""
        correction = self.corrections.get(graph_index, 0)
        self.revision = f"step-room:{graph_index}:{LEDGER.cap_for(graph_index)}:{correction}"
        try:
            compiled, planned = self.plan_and_compile(gm, list(args), eager=eager, graph_index=graph_index)
        finally:
            self.revision = ""
        self.last_state = None
        return compiled if planned else None

    def step_measured(self, graph_index: int, peak_bytes: int) -> bool:
        """Graph ``graph_index``'s first training step peaked at
        ``peak_bytes``: recorded in its summary (and `plans`); returns
        whether its plan is to be made again with the model's cap moved by
        the difference from the prediction (`step_measure.Correction`)."""
        report = self.latest[graph_index]
        summary = report["summary"]
        summary["measured_step_peak_bytes"] = peak_bytes
        plan_records.refresh(self, summary["graph_index"], summary)
        if report.get("dump_folder"):
            write_summary(report["dump_folder"], summary, self.config.to_json())
        correction = Correction(
            measured_bytes=peak_bytes, predicted_bytes=summary["predicted_peak_bytes"],
            budget_bytes=summary["requested_budget_bytes"],
        )
        if not correction.wanted(clamped=summary["budget_clamped_to_minimum"]):
            return False
        self.corrections[graph_index] = self.corrections.get(graph_index, 0) + correction.error_bytes
        over = correction.measured_bytes - correction.budget_bytes
        if over > 0:
            warnings.warn(
                f"adacc: graph {graph_index}'s first step peaked at {peak_bytes} bytes, {over} bytes "
                f"({over / correction.budget_bytes:.1%}) over its budget {correction.budget_bytes} (predicted "
                f"{correction.predicted_bytes}); it re-plans at its next call with the model's cap "
                f"{correction.error_bytes} bytes lower",
                stacklevel=2,
            )
        else:
            log.info(
                "adacc graph %d: first step peaked at %d bytes, %d under the budget %d (predicted %d); "
                "re-planning at the next call with the cap %d bytes higher",
                graph_index, peak_bytes, -over, correction.budget_bytes, correction.predicted_bytes,
                -correction.error_bytes,
            )
        return True

    def whole_ops(self) -> tuple[Any, ...]:
        """`whole_ops` of this partitioner's config."""
        return whole_ops(self.config)

    def backend(self, *, eager: bool = False) -> Callable[..., Any]:
        """``torch.compile(model, backend=partitioner.backend())``: the same
        path as ``backend="adacc"`` (or ``"adacc_eager"``), with a handle on
        this partitioner's reports."""
        return functools.partial(self.compile, eager=eager)

    def uuid(self) -> str:
        """Config + adacc sources + the device profile's figures: a graph
        planned under other options, by other code or under other costs is
        never served from Inductor's cache. ``dump_dir`` is left out: where
        the dumps go changes no code, and a run that writes them elsewhere
        still hits the cache."""
        profile = profile_by_name(self.config.device_profile)
        options = self._code_config().to_json()
        return hashlib.sha256((options + _source_digest() + profile.digest() + self.revision).encode()).hexdigest()
