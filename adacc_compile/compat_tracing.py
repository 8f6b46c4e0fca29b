"""The private PyTorch APIs of tracing a model without running it
(``adacc plan``), in one place: fake tensors, Dynamo and AOTAutograd
stopped at the partitioner, and Inductor's joint-graph passes, so that a
model of any size is planned without compiling or running anything.

Split from `compat` (the partitioner's shims), as every private API adacc
touches lives in a `compat*` module: Dynamo's backend interface and
Inductor's joint-graph passes drift between torch releases, and a torch
upgrade is a change to these modules only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx

from adacc_compile.compat import forward_output_nodes


# --------------------------------------------------------------------------
# tracing a model without running it (``adacc plan``)
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CapturedJoint:
    """A joint forward+backward graph as AOTAutograd hands it to a
    partitioner, with the arguments it passes; plans are made from it
    without compiling or running anything."""

    gm: fx.GraphModule
    joint_inputs: Any
    kwargs: dict[str, Any]


class _JointCaptured(Exception):
    """Raised by the capturing partitioner: nothing after it is needed."""


def fake_tensors() -> Any:
    """Context manager: tensors made inside are fake (shape, dtype, no
    storage), so a model of any size can be built and traced."""
    from torch._subclasses import FakeTensorMode

    return FakeTensorMode()


def capture_joint_graph(
    model: torch.nn.Module, inputs: Sequence[Any], *, whole_ops: Sequence[Any] = ()
) -> CapturedJoint:
    """Traces ``model(*inputs)`` with Dynamo and AOTAutograd (the graph
    ``torch.compile`` would partition) and stops at the partitioner, so
    nothing is compiled or run. ``model`` and ``inputs`` are normally fake
    (`fake_tensors`). Only Dynamo's first graph is traced: a model that
    returns its loss from one graph (no graph break before it) is planned
    whole; `joint_outputs_scalar` tells the caller whether that held.
    ``whole_ops``: as in `compat_inductor.inductor_compile` (the options' few-bit codecs)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    captured: list[CapturedJoint] = []
    whole = set(whole_ops)

    def partition(gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        captured.append(CapturedJoint(inductor_joint_graph_passes(gm, joint_inputs), joint_inputs, kwargs))
        raise _JointCaptured

    def never_called(gm: fx.GraphModule, example_inputs: Any) -> Any:
        raise AssertionError("capture_joint_graph compiles nothing")

    def stop(*args: Any) -> Any:
        raise _JointCaptured

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        aot = aot_autograd(
            fw_compiler=never_called, bw_compiler=never_called, partition_fn=partition,
            decompositions={op: fn for op, fn in select_decomp_table().items() if op not in whole},
        )  # as Inductor traces it
        # The partitioner raises out of the backend, so Dynamo stops before
        # it builds the frame's guards (a second or more on a 7B model).
        aot(gm, example_inputs)
        return stop  # a graph without a backward: nothing captured

    from torch._dynamo.exc import BackendCompilerFailed

    torch._dynamo.reset()
    try:
        torch.compile(model, backend=backend)(*inputs)
    except _JointCaptured:
        pass
    except BackendCompilerFailed as error:
        if not isinstance(error.inner_exception, _JointCaptured):
            raise
    finally:
        torch._dynamo.reset()
    if not captured:
        raise RuntimeError("no joint graph was captured: the model's first graph computes no gradient")
    return captured[0]


def inductor_joint_graph_passes(gm: fx.GraphModule, joint_inputs: Sequence[Any]) -> fx.GraphModule:
    """The joint graph after Inductor's joint-graph passes, which its
    ``partition_fn`` runs before any partitioner (adacc's backend included):
    the graph a compiled step plans. They rewrite what Inductor compiles
    differently, for instance the cross-entropy backward's scatter into a
    zero-filled ``[tokens, vocabulary]`` tensor into a pointwise select
    (a 500 MiB float32 buffer for a 32000-word vocabulary and 4096 tokens
    that a plan of the unrewritten graph counted and a GPU never held)."""
    import contextlib

    from torch._guards import detect_fake_mode
    from torch._inductor import compile_fx as _compile_fx
    from torch._inductor.virtualized import V

    passes = _compile_fx._recursive_joint_graph_passes
    fake_mode = detect_fake_mode(list(joint_inputs))
    # Inductor's compile sets the fake mode its passes build new values in.
    in_fake_mode = V.set_fake_mode(fake_mode) if fake_mode is not None else contextlib.nullcontext()
    with in_fake_mode, _compile_fx.get_cuda_device_context(gm):
        if "input_device" in inspect.signature(passes).parameters:
            devices = _compile_fx.get_inputs_devices(joint_inputs, gm)
            return passes(gm, skip_invoke_subgraph=True, input_device=next(iter(devices), None))
        return passes(gm, skip_invoke_subgraph=True)


def joint_outputs_scalar(captured: CapturedJoint) -> bool:
    """The traced graph's forward returns a 0-dim value (the loss) first,
    beside which it may return others (the logits): the backward starts in
    this graph, so no graph break came before the loss."""
    outputs = forward_output_nodes(captured.gm, int(captured.kwargs["num_fwd_outputs"]))
    values = [n.meta.get("val") for n in outputs]
    return bool(values) and isinstance(values[0], torch.Tensor) and values[0].dim() == 0
