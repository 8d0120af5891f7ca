from bertforge.cli.main import main

raise SystemExit(main())
