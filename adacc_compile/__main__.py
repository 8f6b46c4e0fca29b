"""``python -m adacc_compile``: the ``adacc`` command line (`cli`)."""

import sys

from adacc_compile.cli import main

sys.exit(main())
