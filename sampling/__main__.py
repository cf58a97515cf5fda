"""Entry point for `python -m sampling` (the compare CLI)."""

import sys

from sampling.compare_cli import main

if __name__ == "__main__":
    sys.exit(main())
