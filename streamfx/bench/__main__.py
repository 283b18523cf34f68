"""``python -m streamfx.bench``: see :mod:`streamfx.bench.cli`."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
