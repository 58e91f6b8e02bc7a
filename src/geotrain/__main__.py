from geotrain.cli.main import main

raise SystemExit(main())
