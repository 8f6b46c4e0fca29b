"""Example models, text data, the tensor-parallel example and the
measurement harness that the demo, the benchmarks and the tests share.

Not part of the installed library (``pip install`` ships ``adacc_compile``
only): ``examples/demo.py`` and ``bench/`` put this directory on
``sys.path`` themselves, pytest through ``pythonpath`` in pyproject.toml."""
