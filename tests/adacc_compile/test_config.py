"""Config parsing: every option validated up front with a useful message."""

from __future__ import annotations

import pytest

from adacc_compile.config import AdaccConfig, MemoryBudget, parse_bytes
from adacc_compile.partitioner import AdaccPartitioner


@pytest.mark.parametrize(
    "text, expected",
    [("12GiB", 12 * 2**30), ("800MB", 800 * 10**6), ("1.5 gb", 1_500_000_000), ("4096", 4096), ("64kib", 65536)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.4, MemoryBudget(ratio=0.4)),
        (1.0, MemoryBudget(ratio=1.0)),
        (1, MemoryBudget(bytes=1)),  # an int is always bytes
        (2, MemoryBudget(bytes=2)),
        (2**30, MemoryBudget(bytes=2**30)),
        ("50%", MemoryBudget(ratio=0.5)),
        ("100%", MemoryBudget(ratio=1.0)),
        ("12GiB", MemoryBudget(bytes=12 * 2**30)),
        ("0.25", MemoryBudget(ratio=0.25)),
    ],
)
def test_memory_budget_forms(value, expected):
    assert AdaccConfig.from_options({"memory_budget": value}).memory_budget == expected


@pytest.mark.parametrize("value", [0.0, 1.5, -3, "12 parsecs", True, [1], "150%", "x%"])
def test_bad_budget_is_a_value_error(value):
    with pytest.raises(ValueError, match="memory_budget|unit"):
        AdaccConfig.from_options({"memory_budget": value})


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown adacc option\(s\) \['budget'\].*memory_budget"):
        AdaccConfig.from_options({"budget": 0.5})


@pytest.mark.parametrize(
    "options, match",
    [
        ({"planner": "magic"}, "planner='magic' is not one of: milp"),
        ({"accuracy": "perfect"}, "accuracy"),
        ({"on_infeasible": "ignore"}, "on_infeasible"),
        ({"budget_scope": "total"}, "budget_scope='total' is not one of: activations, step"),
        ({"solver_time_limit_s": 0}, "positive"),
        ({"solver_threads": 0}, "positive int"),
        ({"solver_node_limit": 0}, "solver_node_limit=0 must be a positive int"),
        ({"codecs": ["nope"]}, "unknown codec"),
        ({"adapt": "maybe"}, "adapt='maybe' must be a bool"),
        ({"adapt_every": 0}, "adapt_every=0 must be a positive int"),
        ({"adapt_patience": 1.5}, "adapt_patience=1.5 must be a positive int"),
        ({"adapt_max_replans": -1}, "adapt_max_replans=-1 must be an int >= 0"),
    ],
)
def test_bad_values(options, match):
    with pytest.raises(ValueError, match=match):
        AdaccConfig.from_options(options)


def test_the_node_limit_reaches_the_solver():
    import torch.fx as fx

    from adacc_compile.state import PartitionState

    config = AdaccConfig.from_options({"solver_node_limit": 7, "solver_time_limit_s": 9})
    options = PartitionState(joint=fx.GraphModule({}, fx.Graph()), config=config, num_fwd_outputs=0).solver_options
    assert (options.node_limit, options.time_limit_s) == (7, 9.0)
    assert AdaccConfig().solver_node_limit > 0


def test_ratio_resolves_against_baseline():
    assert MemoryBudget(ratio=0.5).resolve(1000) == 500
    assert MemoryBudget(bytes=123).resolve(1000) == 123


def test_dump_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ADACC_DUMP_DIR", str(tmp_path))
    assert AdaccConfig.from_options({}).dump_dir == str(tmp_path)
    assert AdaccConfig.from_options({"dump_dir": "/x"}).dump_dir == "/x"


def test_uuid_hashes_the_whole_config():
    a = AdaccPartitioner(AdaccConfig.from_options({"memory_budget": 0.5}))
    b = AdaccPartitioner(AdaccConfig.from_options({"memory_budget": 0.5}))
    c = AdaccPartitioner(AdaccConfig.from_options({"memory_budget": 0.4}))
    d = AdaccPartitioner(AdaccConfig.from_options({"memory_budget": 0.5, "planner": "greedy"}))
    assert a.uuid() == b.uuid()
    assert len({a.uuid(), c.uuid(), d.uuid()}) == 3


def test_adaptation_is_off_by_default_and_validated():
    default = AdaccConfig.from_options({})
    assert (default.adapt, default.adapt_every, default.adapt_patience, default.adapt_max_replans) == (False, 100, 2, 3)
    config = AdaccConfig.from_options({"adapt": "on", "adapt_every": 5, "adapt_patience": 1, "adapt_max_replans": 0})
    assert (config.adapt, config.adapt_every, config.adapt_patience, config.adapt_max_replans) == (True, 5, 1, 0)


def test_revision_changes_the_uuid():
    """A re-plan compiles the same graph under the same options: its
    partitioner revision keeps Inductor's caches from serving the old plan."""
    partitioner = AdaccPartitioner(AdaccConfig.from_options({"adapt": True}))
    before = partitioner.uuid()
    partitioner.revision = "adapt:0:v1"
    assert partitioner.uuid() != before


def test_config_is_frozen():
    config = AdaccConfig.from_options({})
    with pytest.raises(Exception):
        config.planner = "greedy"  # type: ignore[misc]


@pytest.mark.parametrize("options, reuse", [({}, False), ({"inductor_buffer_reuse": True}, True)])
def test_inductor_buffer_reuse_reaches_inductors_config(monkeypatch, options, reuse):
    """Off by default (Inductor's code then frees at last use, as the plan's
    memory model does); True leaves Inductor's own setting alone."""
    import torch

    from adacc_compile import compat_inductor

    seen = {}

    def fake_compile(gm, example_inputs, config_patches, *, pinned_meta_key=None, whole_ops=()):
        seen.update(config_patches, pinned=pinned_meta_key, whole_ops=whole_ops)
        return gm

    monkeypatch.setattr(compat_inductor, "inductor_compile", fake_compile)
    partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    partitioner.plan_and_compile(gm, [torch.randn(1, 2)], eager=False, graph_index=0)
    assert seen["custom_partitioner_fn"] is partitioner
    assert seen.get("allow_buffer_reuse", True) is reuse
    assert seen["pinned"] == "adacc_placed"
    assert seen["whole_ops"] == ()  # lossless: no few-bit codec, Inductor's decompositions
    with pytest.raises(ValueError):
        AdaccConfig.from_options({"inductor_buffer_reuse": "sometimes"})


def test_the_budget_bounds_activations_unless_the_step_is_asked_for():
    assert AdaccConfig.from_options({}).budget_scope == "activations"
    assert AdaccConfig.from_options({"budget_scope": "step", "memory_budget": "20MiB"}).budget_scope == "step"
