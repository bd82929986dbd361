from sage_unsloth.acceptance.run import main

raise SystemExit(main())
