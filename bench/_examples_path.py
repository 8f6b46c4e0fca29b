"""Puts the repository's ``examples/`` on ``sys.path``: the benchmarks use
the example models and the measurement harness (``adacc_examples``), which
the library does not ship. Import it before anything from ``adacc_examples``."""

import pathlib
import sys

_EXAMPLES = str(pathlib.Path(__file__).resolve().parents[1] / "examples")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)
