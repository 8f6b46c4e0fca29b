"""Importing adacc drops this checkout's root from ``sys.path``, so that its
top-level ``kernels/`` folder cannot stand in for Hugging Face's ``kernels``
package (which transformers 5.25 imports by that name)."""

from __future__ import annotations

import subprocess
import sys

from adacc_compile.source_tree import source_root

_PROBE = (
    "import importlib.util, os, sys\n"
    "root = os.path.abspath(os.curdir)\n"
    "print(os.path.isdir(os.path.join(root, 'kernels')))\n"
    "import adacc_compile\n"
    "spec = importlib.util.find_spec('kernels')\n"
    "origin = spec.origin if spec else None\n"
    "print(origin is None or not origin.startswith(os.path.join(root, 'kernels')))\n"
    "import adacc_compile.kernels\n"
    "print(adacc_compile.kernels.__file__.startswith(root))\n"
)


def test_importing_adacc_from_the_repo_root_unshadows_kernels():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=source_root(), capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "True", "True"]  # the folder is there, not found as `kernels`, still adacc's codecs
