"""One process of the warm-cache test (`test_compile_caches`): compiles
`TwoGraphs` with ``backend="adacc"`` under torch's default compile settings
(AOTAutograd and FX graph caches on, the cache directory from the
environment), runs two steps, and prints what adacc reported as JSON.

``argv[1]``: a JSON object with ``dump_dir``, ``budget`` and ``head_only``
(compile the head alone, so no earlier graph holds anything)."""

from __future__ import annotations

import json
import pathlib
import sys
import warnings

import torch

import adacc_compile
from adacc_test_utils import TwoGraphs


def main() -> None:
    args = json.loads(sys.argv[1])
    from torch._dynamo.utils import counters

    model = TwoGraphs()
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1))
    target = model.head if args["head_only"] else model
    if args["head_only"]:
        x = torch.randn(512, 256, generator=torch.Generator().manual_seed(1))
    options = {"memory_budget": args["budget"], "budget_scope": "step", "adapt": True, "dump_dir": args["dump_dir"]}
    compiled = torch.compile(target, backend="adacc", options=options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            out = compiled(x)
            (out if out.dim() == 0 else out.square().mean()).backward()
    ours = sorted({str(w.message) for w in caught if "/torch/" not in w.filename})
    print(json.dumps({
        "plans": [
            {"graph_index": p.graph_index, "plan_hash": p.plan_hash, "budget_bytes": p.budget_bytes,
             "held_by_earlier_graphs": p.summary["held_by_earlier_graphs"]}
            for p in adacc_compile.plans(target)
        ],
        "current_plan_version": adacc_compile.current_plan(target).version,
        "warnings": ours,
        "dumps": sorted(p.name for p in pathlib.Path(args["dump_dir"]).iterdir()),
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
    }))


if __name__ == "__main__":
    main()
