"""`bench/gpu_check.py --smoke` runs on CPU: the GPU check stays runnable
without a GPU (tiny sizes; Triton kernels under the interpreter), in one
process or side by side; and its comparison helpers say how forms differ."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).parents[2] / "bench" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_check  # noqa: E402


def _run(tmp_path: pathlib.Path, *args: str) -> tuple[str, dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OUT": str(tmp_path)}
    subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", *args], check=True, env=env, timeout=1200, capture_output=True
    )
    return (tmp_path / "gpu_check.md").read_text(), json.loads((tmp_path / "gpu_check.json").read_text())


@pytest.mark.slow  # 24 s: keeps the default run under 15 minutes
def test_codec_section_on_cpu(tmp_path):
    markdown, data = _run(tmp_path, "--codecs", "int8_outlier", "bitmask", "--models")
    assert "## Codec kernels" in markdown
    rows = {row["codec"]: row for row in data["codecs"]}
    assert set(rows) == {"int8_outlier", "int8_outlier (calibrated)", "bitmask"}
    for name in ("int8_outlier", "bitmask"):
        assert rows[name]["inductor_vs_reference"] == "exact"
        assert rows[name]["triton_vs_reference"] == "exact"  # under TRITON_INTERPRET=1
        assert rows[name]["inductor_compress"] > 0 and rows[name]["inductor_decompress"] > 0
    calibrated = rows["int8_outlier (calibrated)"]
    assert calibrated["inductor_vs_reference"] == "exact" and calibrated["inductor_compress"] > 0
    # The hand-written one-read compress with the same channels, beside it.
    assert calibrated["triton_vs_reference"] == "exact" and calibrated["triton_compress"] > 0


@pytest.mark.slow
def test_whole_smoke_run(tmp_path):
    markdown, data = _run(tmp_path, "--budgets", "0.5")
    assert {row["codec"] for row in data["codecs"]} >= {"bitmask", "int8_outlier", "fp8_e4m3", "softmax_u8"}
    assert all(row["inductor_vs_reference"] == "exact" for row in data["codecs"])
    for model in ("gpt", "llama"):
        names = [row["name"] for row in data[f"model_{model}"]]
        assert names[:2] == ["no checkpointing", "full AC"] and "adacc balanced @0.5" in names
        assert f"### {model}:" in markdown


def test_verdict_tells_signed_zeros_from_value_differences():
    a = torch.tensor([0.0, 1.0, float("nan"), 2.0])
    signed = torch.tensor([-0.0, 1.0, float("nan"), 2.0])
    off = torch.tensor([0.0, 1.5, float("nan"), 2.0])
    assert gpu_check.same(a, a.clone()) == (True, 0, 0)
    assert gpu_check.same(a, signed) == (False, 1, 1)
    assert gpu_check.same(a, off) == (False, 1, 0)
    codes = torch.tensor([1, 2], dtype=torch.int8)
    assert gpu_check._verdict([gpu_check.same(codes, codes), gpu_check.same(a, a)]) == "exact"
    assert gpu_check._verdict([gpu_check.same(codes, codes), gpu_check.same(a, signed)]) == "exact but the sign of 1 zeros"
    assert gpu_check._verdict([gpu_check.same(codes, codes + 1), gpu_check.same(a, off)]) == "differs: 2, 1"


def test_difference_description_names_positions_and_the_input():
    x = torch.tensor([[0.5, 1.0], [2.0, 3.0]])
    want = torch.tensor([[1, 2], [4, 6]], dtype=torch.int8)
    got = want.clone()
    got[1, 0] = 5
    text = gpu_check.describe_difference("codes", got, want, x)
    assert text == "codes: 1 of 4 differ, max |diff| 1; (1, 0) got 5 want 4 (x 2)"
    assert gpu_check.describe_difference("codes", want, want.clone(), x) == "codes: same"


@pytest.mark.slow  # 2 minutes: three processes compiling on two cores
def test_parts_side_by_side(tmp_path):
    markdown, data = _run(tmp_path, "--jobs", "3", "--budgets", "0.5", "--codecs", "int8_channel")
    assert [row["codec"] for row in data["codecs"]] == ["int8_channel"]
    assert data["codecs"][0]["inductor_vs_reference"] == "exact"
    assert markdown.index("## Codec kernels") < markdown.index("### gpt:") < markdown.index("### llama:")
    assert "3 processes side by side" in markdown
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["codecs.log", "gpt.log", "llama.log"]


def test_compare_gives_the_verdict_and_logs_where_forms_differ(capsys):
    x = torch.tensor([[0.5, 1.0], [2.0, 3.0]])
    codes = torch.tensor([[1, 2], [4, 6]], dtype=torch.int8)
    assert gpu_check.compare("c", "triton", [codes, x], [codes.clone(), x.clone()], x) == "exact"
    assert capsys.readouterr().out == ""
    off = x.clone()
    off[0, 0] = 0.75
    assert gpu_check.compare("c", "triton", [codes, off], [codes, x], x) == "differs: 0, 1"
    out = capsys.readouterr().out
    assert "c triton payload[0]: same" in out and "c triton decompressed: 1 of 4 differ" in out
    assert "c triton relative error vs x: " in out and "(reference 0)" in out


def test_the_calibrated_compress_is_checked_for_codecs_that_take_parameters():
    cpu = torch.device("cpu")
    row = gpu_check.check_codec_or_error("int8_outlier", (64, 128), cpu, inner=1, calibrated=True)
    assert row.codec == "int8_outlier (calibrated)" and row.error is None
    assert row.inductor_vs_reference == "exact" and row.inductor_compress > 0
    table = gpu_check.codec_table([row])
    # No Triton in this process (the interpreted smoke run checks its calibrated compress).
    assert "| int8_outlier (calibrated) | bfloat16 | n/a (no Triton here) | exact |" in table
    assert "nan" not in table  # the decompress it does not time reads "n/a"
    assert gpu_check.check_codec_or_error("bitmask", (64, 128), cpu, inner=1, calibrated=True) is None


def test_a_failing_codec_is_a_table_row_and_a_failing_model_a_heading(monkeypatch):
    row = gpu_check.check_codec_or_error("no_such_codec", (4, 8), torch.device("cpu"), inner=1)
    assert row.error and "no_such_codec" in row.error and row.faster == "n/a"
    assert "| no_such_codec | failed: " in gpu_check.codec_table([row])

    def broken(*args):
        raise RuntimeError("out of memory\nmore detail")

    monkeypatch.setattr(gpu_check, "model_section", broken)
    text, data = gpu_check.model_section_or_error("gpt", gpu_check.SMOKE, torch.device("cpu"), [0.5], "h100")
    assert text == "### gpt: failed: RuntimeError: out of memory" and data == {"error": "RuntimeError: out of memory"}


def test_measuring_holds_an_exclusive_lock_on_the_named_file(tmp_path, monkeypatch):
    import fcntl

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_check.LOCK_ENV, str(lock))
    with gpu_check.measuring():
        with open(lock, "a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    monkeypatch.delenv(gpu_check.LOCK_ENV)
    with gpu_check.measuring():  # no lock file named: nothing to hold
        pass


@pytest.mark.slow  # ~30 s: compiles two tiny models twice
def test_memory_probe_smoke_run(tmp_path):
    probe = SCRIPT.parent / "gpu_memory_probe.py"
    env = {**os.environ, "OUT": str(tmp_path)}
    subprocess.run([sys.executable, str(probe), "--smoke", "--models", "llama", "--codec-code", "int8_outlier"],
                   check=True, env=env, timeout=600, capture_output=True)
    assert "def call" in (tmp_path / "codec_code" / "int8_outlier.py").read_text()
    records = json.loads((tmp_path / "memory_probe.json").read_text())["records"]
    assert [r["variant"] for r in records] == ["no checkpointing", "adacc"]
    assert all("error" not in r and r["measured_peak_bytes"] > 0 for r in records)
    assert records[1]["predicted_peak_bytes"] > 0
    assert (tmp_path / "dump_llama").is_dir()


def _parts_namespace(tmp_path, hard_stop_s: float):
    import argparse

    return argparse.Namespace(out=str(tmp_path), codecs=["bitmask"], models=["gpt"], hard_stop_s=hard_stop_s)


def test_a_part_that_crashes_is_reported_with_its_exit_code(tmp_path, monkeypatch):
    """A part process that dies without writing its result (here: the
    interpreter is /bin/false) is listed as missing, the run goes on."""
    import time

    monkeypatch.setattr(sys, "executable", "/bin/false")
    report = gpu_check.Report(out=tmp_path)
    missing = gpu_check.run_parts_side_by_side(_parts_namespace(tmp_path, 60.0), [], report, time.perf_counter())
    assert missing == ["codecs (exit code 1; see parts/codecs.log)", "gpt (exit code 1; see parts/gpt.log)"]
    assert report.sections == [] and not list((tmp_path / "parts").glob("*.json"))


def test_a_part_past_the_hard_stop_is_killed_and_reported(tmp_path, monkeypatch):
    import time

    hang = tmp_path / "hang.sh"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hang))
    start = time.perf_counter()
    report = gpu_check.Report(out=tmp_path)
    missing = gpu_check.run_parts_side_by_side(_parts_namespace(tmp_path, 1.0), [], report, start)
    assert time.perf_counter() - start < 30
    assert missing == ["codecs (exit code -9; see parts/codecs.log)", "gpt (exit code -9; see parts/gpt.log)"]


def test_the_memory_probe_keeps_the_generated_files_a_trace_names():
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_memory_probe

    frame = lambda name: {"filename": name, "line": 1, "name": "call"}  # noqa: E731
    snapshot = {"device_traces": [[
        {"frames": [frame("/tmp/torchinductor_root/ab/cabc.py"), frame("/work/models.py")]},
        {"frames": [frame("/tmp/torchinductor_root/cd/ccd.py")]},
        {"frames": []},
    ]]}
    assert gpu_memory_probe._inductor_files(snapshot) == {
        "/tmp/torchinductor_root/ab/cabc.py", "/tmp/torchinductor_root/cd/ccd.py"
    }
    assert gpu_memory_probe._inductor_files({}) == set()
