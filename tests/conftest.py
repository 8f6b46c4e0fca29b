"""Shared test settings: no compile caches (so the partitioner always runs),
eager-identical random numbers in Inductor, and Dynamo reset between tests."""

from __future__ import annotations

import os

import pytest
import torch

import adacc_compile  # noqa: F401  (first: drops the repo root, whose kernels/ shadows Hugging Face's)


@pytest.fixture(autouse=True)
def _fresh_compile_state():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from adacc_compile.step_ledger import LEDGER

    saved_dump = os.environ.pop("ADACC_DUMP_DIR", None)
    torch._dynamo.reset()
    LEDGER.clear()
    with inductor_config.patch(fx_graph_cache=False, fallback_random=True), functorch_config.patch(
        enable_autograd_cache=False
    ):
        yield
    torch._dynamo.reset()
    if saved_dump is not None:
        os.environ["ADACC_DUMP_DIR"] = saved_dump


@pytest.fixture(autouse=True, scope="session")
def _private_profile_cache(tmp_path_factory):
    """Measured device profiles go to a cache of the test session's own, not
    the user's (`adacc_compile.passes.profile_cache`)."""
    saved = os.environ.get("ADACC_CACHE_DIR")
    os.environ["ADACC_CACHE_DIR"] = str(tmp_path_factory.mktemp("adacc_cache"))
    yield
    if saved is None:
        os.environ.pop("ADACC_CACHE_DIR", None)
    else:
        os.environ["ADACC_CACHE_DIR"] = saved
