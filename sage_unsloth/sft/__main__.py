"""``python -m sage_unsloth.sft CONFIG [--key value ...]``."""

import sys

from sage_unsloth.sft.run import main

if __name__ == "__main__":
    sys.exit(main())
