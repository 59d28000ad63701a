"""``python -m sqlsink``: the command-line tool (see ``sqlsink.cli``)."""

from __future__ import annotations

import sys

from sqlsink.cli import main

if __name__ == "__main__":
    sys.exit(main())
