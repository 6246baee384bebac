#!/usr/bin/env python3
"""Entry point of `loom bench` (the C++ subcommand runs this file with the
project's .venv python and --loom-binary). See bench/README.md."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loombench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
