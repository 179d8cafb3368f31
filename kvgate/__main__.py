"""``python -m kvgate``: the ``kvgate`` command, for a process started from this interpreter."""

from kvgate.cli import main

raise SystemExit(main())
