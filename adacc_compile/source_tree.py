"""Keep this repository's ``kernels/`` folder from shadowing Hugging Face's ``kernels``.

Why: the project's layout puts the codec package in a top-level
``kernels/`` folder (installed as ``adacc_compile.kernels``). transformers
5.25 requires Hugging Face's ``kernels`` package and imports it by that
name; when the repository root is on ``sys.path`` (``python -m pytest`` or
``python -m adacc_compile`` run from it), ``import kernels`` finds the
folder instead and transformers fails with ``cannot import name
'CUDAProperties' from 'kernels'``. adacc itself never imports the folder by
its top-level name, so importing adacc drops the repository root from
``sys.path``: only an entry that is this very source tree (holding both
``adacc_compile/`` and ``kernels/``), and only while nothing has imported
``kernels`` from it yet.
"""

from __future__ import annotations

import os
import sys


def source_root() -> str:
    """The folder holding ``adacc_compile/`` in this checkout."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def drop_source_root_from_path() -> None:
    """Removes the repository root (or ``""`` when it is the working
    directory) from ``sys.path`` if it holds this project's ``kernels/``."""
    root = source_root()
    if not os.path.isfile(os.path.join(root, "kernels", "__init__.py")):
        return  # an installed copy: no top-level kernels/ beside it
    loaded = sys.modules.get("kernels")
    if loaded is not None and os.path.dirname(os.path.dirname(getattr(loaded, "__file__", "") or "")) == root:
        return  # already imported from the folder: removing the entry now changes nothing
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != root]
