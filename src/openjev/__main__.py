from openjev.cli import main

raise SystemExit(main())
