"""``python -m sage_unsloth.eval CONFIG [--key value ...]`` (see run.py)."""

import sys

from sage_unsloth.eval.run import main

if __name__ == "__main__":
    sys.exit(main())
