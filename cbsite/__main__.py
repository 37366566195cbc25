from cbsite.cli import main

raise SystemExit(main())
