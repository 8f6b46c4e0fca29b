"""The headline tables of bench/RESULTS.md and README.md, made from the raw
JSON files in bench/results/ so that no figure in them is typed by hand.

    python bench/results_table.py           # rewrite both files' tables
    python bench/results_table.py --check   # exit 1 where they are out of date

Each table sits between a begin and an end marker (``<!-- headline: NAME
-->`` ... ``<!-- /headline: NAME -->``); everything outside the markers is
left as it is. `HEADLINE` names the runs each table is made from: to
publish a new run, point it at the new JSON and run the script.

Tables:
* ``memory`` (RESULTS.md): per Hugging Face model, every strategy's measured
  step peak and median step time against full activation checkpointing's
  in the same run, for each run listed (two runs: the step times are noisy).
* ``readme`` (README.md): the same runs cut to what a user compares: full
  AC against adacc given full AC's measured peak as its step budget.
* ``planning`` (RESULTS.md): adacc's plan-stage time against PyTorch's
  min-cut partitioner on the same graph, by depth and budget.
* ``gpu`` (RESULTS.md): the only GPU run so far (`bench/gpu_check.py`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True, slots=True)
class Headline:
    """The runs behind the headline tables (file names in bench/results/)."""

    memory_runs: tuple[str, ...] = ("peak_hf_8k_2026-12-07h.json", "peak_hf_8k_2026-12-07i.json")
    planning_run: str = "planning_2026-12-08b.json"
    gpu_run: str = "gpu_check_2026-12-04c.json"


HEADLINE = Headline()
FULL_AC = "full AC"
STEP_BUDGET = "adacc step budget"
"""The name every step-budget strategy of `bench_peak.py` starts with."""
TORCH_BUDGET = "torch budget"
"""... and every strategy of PyTorch's ``activation_memory_budget``."""
MIB = 2**20
#: How the tables name `bench_peak.py`'s models.
MODEL_NAMES = {"hf_llama": "HF Llama", "hf_gpt2_8k": "HF GPT-2", "hf_qwen2": "HF Qwen2", "hf_gpt2": "HF GPT-2 (vocab 50257)"}


def _load(name: str, results: pathlib.Path = RESULTS) -> dict:
    return json.loads((results / name).read_text())


def _median(entry: dict) -> float:
    return statistics.median(entry["step_seconds"])


def _runs_line(runs: list[dict]) -> str:
    metas = [run["meta"] for run in runs]
    dates = sorted({m["date"] for m in metas})
    devices = sorted({f"{m['device']}, {m['cpus']} cores, torch {m['torch']}, compile caches {m['caches']}" for m in metas})
    commands = "; ".join(f"`{m['command']}`" for m in metas)
    return f"{', '.join(dates)}, {'; '.join(devices)}. Commands, in order: {commands}."


def _memory_rows(run: dict, model: str) -> dict[str, tuple[dict, dict]]:
    """Each strategy's entry beside the full AC it ran with (its round)."""
    entries = run[model]
    full_ac = {e.get("round", 1): e for e in entries if e["name"] == FULL_AC}
    return {
        e["name"]: (e, full_ac[e.get("round", 1)])
        for e in entries
        if not (e["name"] == FULL_AC and e.get("round", 1) != 1)
    }


def _peaks(rows: list[dict[str, tuple[dict, dict]]], strategy: str, which: int = 0) -> str:
    """A strategy's measured peak in MiB, each run's where the runs differ."""
    peaks = list(dict.fromkeys(f"{row[strategy][which]['peak_bytes'] / MIB:.1f}" for row in rows))
    return " / ".join(peaks)


def _shapes(runs: list[dict]) -> str:
    """The models' shapes, once where they are the same."""
    titles = runs[0]["meta"]["titles"]
    shapes = {title.split(": ", 1)[-1] for title in titles.values()}
    names = ", ".join(MODEL_NAMES.get(m, m) for m in titles)
    if len(shapes) == 1:
        return f"{names}: {shapes.pop()}, random weights"
    return "; ".join(f"{MODEL_NAMES.get(m, m)}: {t.split(': ', 1)[-1]}" for m, t in titles.items())


def memory_table(runs: list[dict]) -> str:
    """Measured step peak and median step time of every strategy against
    full AC's, per model, for each run."""
    names = [f"run {i + 1}" for i in range(len(runs))]
    header = (
        "| model | strategy | measured peak MiB (run 1 / run 2 where they differ) | peak / full AC's (run 1) | "
        + " | ".join(f"step time / full AC's ({n})" for n in names)
        + " | planning s |"
    )
    lines = [header, "|---|---|---:|---:|" + "---:|" * len(runs) + "---:|"]
    for model in runs[0]["meta"]["titles"]:
        rows = [_memory_rows(run, model) for run in runs]
        for strategy, (entry, full_ac) in rows[0].items():
            ratios = []
            for row in rows:
                mine, theirs = row[strategy]
                ratios.append(f"{_median(mine) / _median(theirs):.2f}")
            planning = entry["planning_seconds"]
            lines.append(
                f"| {MODEL_NAMES.get(model, model)} | {strategy} | {_peaks(rows, strategy)} | "
                f"{entry['peak_bytes'] / full_ac['peak_bytes']:.2f} | {' | '.join(ratios)} | "
                f"{'' if planning is None else f'{planning:.1f}'} |"
            )
    return "\n".join(lines) + f"\n\nModels: {_shapes(runs)}. Measured {_runs_line(runs)}"


def readme_table(runs: list[dict]) -> str:
    """Per model: full AC, PyTorch's budget partitioner and adacc given full
    AC's measured peak as its step budget (what a user with that much
    memory compares)."""
    lines = [
        "| model | full AC: peak MiB | PyTorch's budget partitioner: peak MiB, step time / full AC's "
        "| adacc at full AC's peak: peak MiB, step time / full AC's |",
        "|---|---:|---:|---:|",
    ]
    for model in runs[0]["meta"]["titles"]:
        rows = [_memory_rows(run, model) for run in runs]
        cells = []
        for prefix in (TORCH_BUDGET, STEP_BUDGET):
            strategy = next(name for name in rows[0] if name.startswith(prefix))
            times = " / ".join(f"{_median(row[strategy][0]) / _median(row[strategy][1]):.2f}" for row in rows)
            label = f" ({strategy.removeprefix(prefix).strip()})" if prefix == TORCH_BUDGET else ""
            cells.append(f"{_peaks(rows, strategy)}{label}, {times}")
        full_ac = _peaks(rows, next(name for name in rows[0] if name.startswith(STEP_BUDGET)), 1)
        lines.append(f"| {MODEL_NAMES.get(model, model)} | {full_ac} | {cells[0]} | {cells[1]} |")
    dates = ", ".join(sorted({run["meta"]["date"] for run in runs}))
    return "\n".join(lines) + (
        f"\n\n{_shapes(runs)}; measured {dates} on a 2-core CPU under Inductor with torch's compile caches "
        f"{'on' if all(r['meta']['caches'] == 'on' for r in runs) else 'off in some runs'}, {len(runs)} runs "
        "(each run's ratio, in order; peaks per run where they differ). bench/RESULTS.md has every strategy."
    )


def planning_table(run: dict) -> str:
    """adacc's plan stage against PyTorch's min-cut partitioner, by family,
    depth and budget (seconds, and the ratio)."""
    rows = run["rows"]
    budgets = list(dict.fromkeys(r["budget"] for r in rows))
    lines = [
        "| family | layers | min-cut s | " + " | ".join(f"adacc @{b}: s (x min-cut, solves)" for b in budgets) + " |",
        "|---|---:|---:|" + "---:|" * len(budgets),
    ]
    for key in dict.fromkeys((r["family"], r["layers"]) for r in rows):
        group = {r["budget"]: r for r in rows if (r["family"], r["layers"]) == key}
        min_cut = next(iter(group.values()))["min_cut_seconds"]
        cells = [
            f"{g['planning']['seconds']:.2f} ({g['planning']['seconds'] / g['min_cut_seconds']:.2f}x, "
            f"{g['planning']['solves']})"
            for g in (group[b] for b in budgets)
        ]
        lines.append(f"| {key[0]} | {key[1]} | {min_cut:.2f} | " + " | ".join(cells) + " |")
    meta = run["meta"]
    return "\n".join(lines) + (
        f"\n\nHugging Face models, d_model {meta['d_model']}, seq {meta['seq_len']}, batch {meta['batch']}, vocab "
        f"{meta['vocab']}, cost model {meta['profile']}; {meta['date']}, {meta['machine']} CPU, {meta['cpus']} cores, "
        f"torch {meta['torch']}. Command: `{meta['command']}`."
    )


def gpu_table(run: dict) -> str:
    """Step peak and step time of each strategy against full AC's on the GPU."""
    lines = [
        "| model | strategy | measured peak MiB | peak / full AC's | step ms (median) | step time / full AC's |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key in (k for k in run if k.startswith("model_")):
        entries = [e for e in run[key] if not e.get("error")]
        full_ac = next(e for e in entries if e["name"] == FULL_AC)
        for e in entries:
            lines.append(
                f"| {key.removeprefix('model_')} | {e['name']} | {e['peak_bytes'] / MIB:.1f} | "
                f"{e['peak_bytes'] / full_ac['peak_bytes']:.2f} | {1e3 * e['median_step_seconds']:.2f} | "
                f"{e['median_step_seconds'] / full_ac['median_step_seconds']:.2f} |"
            )
    return "\n".join(lines) + (
        f"\n\n2-layer models of `bench/gpu_check.py` (not yet the realistic scale users train at); {run['machine']}."
    )


def tables(headline: Headline = HEADLINE, results: pathlib.Path = RESULTS) -> dict[str, str]:
    """Every headline table by name, made from the JSON files in ``results``."""
    memory = [_load(name, results) for name in headline.memory_runs]
    return {
        "memory": memory_table(memory),
        "readme": readme_table(memory),
        "planning": planning_table(_load(headline.planning_run, results)),
        "gpu": gpu_table(_load(headline.gpu_run, results)),
    }


#: Which tables go into which file.
TARGETS = {"bench/RESULTS.md": ("memory", "planning", "gpu"), "README.md": ("readme",)}


def _block(name: str, body: str) -> str:
    return f"<!-- headline: {name} -->\n{body}\n<!-- /headline: {name} -->"


def render(text: str, made: dict[str, str], names: tuple[str, ...]) -> str:
    """``text`` with each named table's markers holding the table made now.
    A file without the markers of a table it should hold is an error."""
    for name in names:
        pattern = re.compile(rf"<!-- headline: {name} -->\n.*?\n<!-- /headline: {name} -->", re.S)
        if not pattern.search(text):
            raise ValueError(f"no '<!-- headline: {name} -->' ... '<!-- /headline: {name} -->' markers")
        text = pattern.sub(lambda _: _block(name, made[name]), text)
    return text


def out_of_date(root: pathlib.Path = ROOT, headline: Headline = HEADLINE) -> list[str]:
    """The files whose headline tables differ from what the JSON gives."""
    made = tables(headline)
    return [
        path for path, names in TARGETS.items()
        if render((root / path).read_text(), made, names) != (root / path).read_text()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file's headline tables are out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = out_of_date()
        for path in stale:
            print(f"{path}: headline tables out of date; run python bench/results_table.py", file=sys.stderr)
        return 1 if stale else 0
    made = tables()
    for path, names in TARGETS.items():
        target = ROOT / path
        target.write_text(render(target.read_text(), made, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
