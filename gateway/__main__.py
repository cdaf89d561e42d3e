"""``python -m gateway`` is the ``turnout`` command."""

from gateway.cli import main

raise SystemExit(main())
