from apportion.cli import main

raise SystemExit(main())
