import sys

from sage_unsloth.doctor import main

sys.exit(main())
