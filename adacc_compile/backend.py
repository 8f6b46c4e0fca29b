"""The two torch.compile backends, registered through the
``torch_dynamo_backends`` entry point (no import needed)::

    torch.compile(model, backend="adacc", options={"memory_budget": 0.5})
    torch.compile(model, backend="adacc_eager", options={...})

``adacc`` is Inductor with adacc as its partitioner: the forward and backward
graphs are code-generated (Triton on GPU, C++ on CPU). ``adacc_eager`` runs
the same partitioner but executes both graphs eagerly; it compiles fast and
is what most graph-level tests use.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch.fx as fx

from adacc_compile.config import AdaccConfig
from adacc_compile.partitioner import AdaccPartitioner


def adacc(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[..., Any]:
    return AdaccPartitioner(_config(options, kwargs)).compile(gm, example_inputs)


def adacc_eager(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[..., Any]:
    return AdaccPartitioner(_config(options, kwargs)).compile(gm, example_inputs, eager=True)


def _config(options: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> AdaccConfig:
    mode = kwargs.pop("mode", None) if isinstance(kwargs, dict) else None
    if mode not in (None, "default"):
        raise ValueError(f"adacc does not support mode={mode!r}; pass options= instead")
    return AdaccConfig.from_options(options)
