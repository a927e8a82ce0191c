from pulseinfer.cli import main

raise SystemExit(main())
