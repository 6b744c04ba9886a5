from nbresponses.cli import main

raise SystemExit(main())
