from tailtrain.cli import main

raise SystemExit(main())
