import sys

from sage_unsloth.eval.run import main

if __name__ == "__main__":
    sys.exit(main())
