"""The headline tables of bench/RESULTS.md and README.md are what
`bench/results_table.py` makes from the raw JSON in bench/results/: a
figure typed by hand, or a JSON file changed without regenerating them,
shows as out of date."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT / "bench"))

import results_table  # noqa: E402


def test_the_headline_tables_are_in_sync_with_the_json():
    assert results_table.out_of_date() == [], "run: python bench/results_table.py"


def _copy_targets(tmp_path: pathlib.Path) -> pathlib.Path:
    for path in results_table.TARGETS:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_ROOT / path, tmp_path / path)
    return tmp_path


def test_a_figure_edited_by_hand_is_out_of_date(tmp_path):
    root = _copy_targets(tmp_path)
    readme = root / "README.md"
    first_row = results_table.tables()["readme"].splitlines()[2]  # under the header and its rule
    assert first_row in readme.read_text()
    readme.write_text(readme.read_text().replace(first_row, first_row.replace(".", "0.", 1)))
    assert results_table.out_of_date(root) == ["README.md"]


def test_the_tables_follow_the_json(tmp_path):
    """Full AC's measured peaks change the tables made from them."""
    results = tmp_path / "results"
    shutil.copytree(results_table.RESULTS, results, ignore=shutil.ignore_patterns("*.png", "notebook"))
    before = results_table.tables(results=results)
    name = results_table.HEADLINE.memory_runs[0]
    run = json.loads((results / name).read_text())
    model = next(iter(run["meta"]["titles"]))
    for entry in run[model]:
        if entry["name"] == results_table.FULL_AC:  # both rounds'
            entry["peak_bytes"] *= 2
    (results / name).write_text(json.dumps(run))
    after = results_table.tables(results=results)
    assert after["memory"] != before["memory"] and after["readme"] != before["readme"]
    assert after["planning"] == before["planning"]


def test_a_file_without_the_markers_is_an_error():
    with pytest.raises(ValueError, match="headline: readme"):
        results_table.render("no tables here", {"readme": "x"}, ("readme",))
