"""``python -m loadtest.sim``: the ``kvgate sim`` command on its own (same flags, same error lines)."""

from __future__ import annotations

import sys

from gateway.cli import main

if __name__ == "__main__":
    sys.exit(main(["sim", *sys.argv[1:]]))
