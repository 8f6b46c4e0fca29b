"""The plan table folded by block: identical blocks share one row, a block
that decided differently gets its own, values outside blocks one more; the
dump and the DEBUG log carry it, the full table stays available."""

from __future__ import annotations

import logging

import torch

from adacc_compile.report import FULL_TABLE_ENV, fold_by_block, folded_plan_table
from adacc_examples.models import MLP, init_weights
from adacc_test_utils import compile_with_reports, loss_and_grads


def _record(block: str, module: str, op: str, decision: str, nbytes: int = 1024, codec=None):
    return {"name": f"{module}_{op}", "op": op, "op_class": "x", "layer": block, "module_path": module,
            "bytes": nbytes, "decision": decision, "codec": codec}


def _block(i: int, last_decision: str = "recompute"):
    b = f"model.layers.{i}"
    return [
        _record(b, f"{b}.attn.q_proj", "aten.mm", "keep"),
        _record(b, f"{b}.attn.q_proj", "aten.view", "recompute", nbytes=0),
        _record(b, f"{b}.mlp.act", "aten.gelu", last_decision),
        _record(b, f"{b}.attn.o_proj", "aten.mm", "compress", codec="int8_outlier"),
        _record(b, f"{b}", "aten.add", "none"),
    ]


def test_identical_blocks_fold_and_the_differing_one_stands_alone():
    records = [_record("", "embed", "aten.embedding", "keep")]
    for i in range(32):
        records += _block(i, last_decision="keep" if i == 31 else "recompute")
    rows = fold_by_block(records)
    assert [(r.family, r.indices) for r in rows] == [
        ("model.layers", tuple(range(31))), ("model.layers", (31,)), ("", ()),
    ]
    assert rows[0].decisions() == "keep q_proj.mm; recompute act.gelu, +1 views; int8_outlier o_proj.mm"
    assert "small" not in rows[0].decisions()
    assert rows[1].decisions() == "keep q_proj.mm, act.gelu; recompute +1 views; int8_outlier o_proj.mm"
    lines = [line for line in folded_plan_table(records, width=400).splitlines()]
    assert "decisions" in lines[0]
    assert lines[1].startswith("layers 0-30 ") and " 31 " in lines[1]
    assert lines[2].startswith("layers 31 ")
    assert lines[3].startswith("outside blocks") and "embed.embedding" in lines[3]
    assert len(lines) == 4  # 161 planned values, four rows
    wrapped = folded_plan_table(records, width=60).splitlines()
    assert len(wrapped) > 4 and all(len(line) <= 60 + 45 for line in wrapped)


def test_non_consecutive_blocks_are_listed_as_ranges():
    records = []
    for i in range(8):
        records += _block(i, last_decision="keep" if i in (3, 6) else "recompute")
    rows = folded_plan_table(records, width=400).splitlines()
    assert rows[1].startswith("layers 0-2, 4-5, 7 ")
    assert rows[2].startswith("layers 3, 6 ")


def test_dump_has_folded_and_full_tables_and_debug_log_folds(tmp_path, caplog, monkeypatch):
    model = init_weights(MLP(d_in=8, d_hidden=32, depth=2))
    with caplog.at_level(logging.DEBUG, logger="adacc_compile.report"):
        compiled, partitioner = compile_with_reports(model, "adacc_eager", {"memory_budget": 0.5, "dump_dir": str(tmp_path)})
        loss_and_grads(model, compiled, torch.randn(4, 8), torch.randn(4))
    folder = tmp_path / "graph_000"
    full = (folder / "plan_table.txt").read_text()
    folded = (folder / "plan_folded.txt").read_text()
    planned = [r for r in partitioner.reports[-1]["plan"] if r["decision"] != "none"]
    assert len(full.splitlines()) == len(planned) + 1
    assert folded.splitlines()[0].startswith("blocks") and len(folded.splitlines()) <= len(planned) + 1
    assert "folded by block" in caplog.text and FULL_TABLE_ENV in caplog.text


def test_full_table_in_the_debug_log_on_request(caplog, monkeypatch):
    monkeypatch.setenv(FULL_TABLE_ENV, "full")
    model = init_weights(MLP(d_in=8, d_hidden=32, depth=2))
    with caplog.at_level(logging.DEBUG, logger="adacc_compile.report"):
        compiled, _ = compile_with_reports(model, "adacc_eager", {"memory_budget": 0.5})
        loss_and_grads(model, compiled, torch.randn(4, 8), torch.randn(4))
    assert "folded by block" not in caplog.text and "name" in caplog.text and "decision" in caplog.text
