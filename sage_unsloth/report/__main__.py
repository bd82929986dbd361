"""``python -m sage_unsloth.report [CONFIG] [--key value ...]`` (see run.py)."""

import sys

from sage_unsloth.report.run import main

if __name__ == "__main__":
    sys.exit(main())
