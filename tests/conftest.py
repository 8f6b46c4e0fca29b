"""Shared test settings: Dynamo reset between tests; no compile caches and
eager-identical random numbers in Inductor (``fallback_random``), except in
tests marked ``torch_defaults``, which run as users do: both caches on (in
the test session's own cache directory) and Inductor's own random numbers."""

from __future__ import annotations

import os

import pytest
import torch

import adacc_compile  # noqa: F401  (first: drops the repo root, whose kernels/ shadows Hugging Face's)


@pytest.fixture(autouse=True)
def _fresh_compile_state(request, monkeypatch):
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from adacc_compile.step_ledger import LEDGER

    saved_dump = os.environ.pop("ADACC_DUMP_DIR", None)
    torch._dynamo.reset()
    LEDGER.clear()
    if request.node.get_closest_marker("torch_defaults"):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", request.getfixturevalue("_session_torch_cache"))
        settings = {"fx_graph_cache": True, "fallback_random": False}, {"enable_autograd_cache": True}
    else:
        settings = {"fx_graph_cache": False, "fallback_random": True}, {"enable_autograd_cache": False}
    with inductor_config.patch(settings[0]), functorch_config.patch(settings[1]):
        yield
    torch._dynamo.reset()
    if saved_dump is not None:
        os.environ["ADACC_DUMP_DIR"] = saved_dump


@pytest.fixture(scope="session")
def _session_torch_cache(tmp_path_factory):
    """The cache directory of the ``torch_defaults`` tests: the test
    session's own, so a run neither reads nor fills the user's."""
    return str(tmp_path_factory.mktemp("torch_cache"))


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
