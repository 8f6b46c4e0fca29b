"""The README's option table lists the user options (at most ten), every
other option is on docs/options.md, both name only real options, and each
user option rejects a bad value with a ValueError."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from adacc_compile.config import AdaccConfig

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _options(path: pathlib.Path) -> list[str]:
    """The option names of the first ``| option | default | meaning |`` table."""
    text = path.read_text()
    start = text.index("| option | default | meaning |")
    end = text.find("\n\n", start)
    table = text[start: end if end >= 0 else len(text)].strip().splitlines()[2:]
    return [re.match(r"\| `([a-z_0-9]+)`", row).group(1) for row in table]


README, ADVANCED = _options(_ROOT / "README.md"), _options(_ROOT / "docs" / "options.md")

BAD_VALUES = {
    "memory_budget": 0, "budget_scope": "weights", "accuracy": "exact", "codecs": ("zip",),
    "device_profile": "tpu", "on_infeasible": "ignore", "adapt": "maybe",
}


def test_the_readme_lists_at_most_ten_options_and_the_rest_are_documented_once():
    fields = {f.name for f in dataclasses.fields(AdaccConfig)}
    assert len(README) <= 10, README
    assert not set(README) & set(ADVANCED)
    assert set(README) | set(ADVANCED) == fields, (fields - set(README) - set(ADVANCED), set(README) | set(ADVANCED) - fields)


@pytest.mark.parametrize("name", [n for n in README if n != "dump_dir"])  # dump_dir: any path
def test_each_readme_option_rejects_a_bad_value(name):
    with pytest.raises(ValueError, match=name):
        AdaccConfig.from_options({name: BAD_VALUES[name]})
