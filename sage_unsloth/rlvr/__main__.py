"""``python -m sage_unsloth.rlvr CONFIG [--key value ...] [--resume]``."""

import sys

from sage_unsloth.rlvr.run import main

if __name__ == "__main__":
    sys.exit(main())
