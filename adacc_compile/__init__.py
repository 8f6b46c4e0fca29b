"""adacc: a torch.compile backend that keeps, recomputes or compresses each
saved activation under a memory budget (``backend="adacc"``).

``adacc_compile.plans(model)`` (`adacc_compile.plan_records`) and the adaptive
re-planning API (`adacc_compile.adaptation`) are importable from here; they
load on first use, so that registering the backend stays cheap."""

from typing import Any

from adacc_compile.source_tree import drop_source_root_from_path

drop_source_root_from_path()  # the repo's kernels/ would shadow Hugging Face's kernels

_ADAPTATION = ("current_plan", "plan_history", "replan")


def __getattr__(name: str) -> Any:
    if name == "plans":
        from adacc_compile.plan_records import plans

        return plans
    if name in _ADAPTATION:
        from adacc_compile import adaptation

        return getattr(adaptation, name)
    raise AttributeError(f"module 'adacc_compile' has no attribute {name!r}")
