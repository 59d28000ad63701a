"""Advice the driver logs once, not at every batch: the key-order trap."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sqlsink.core.key_ranges import trap_warning, unordered
from sqlsink.core.model import PartitionOutcome

log = logging.getLogger("sqlsink")


def warn_once(token: str, message: str) -> bool:
    """Log ``message`` once per ``token``. Spark runs every commit of a Python data source in
    a fresh worker, so having said it is remembered as a file in the temp directory named
    by the token (the driver's, spark/driver_token.py). Returns whether it was logged."""
    name = hashlib.sha256(token.encode()).hexdigest()[:24]
    path = Path(tempfile.gettempdir()) / f"sqlsink-said-{name}"
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:  # no writable temp dir: better said every batch than never
        pass
    log.warning(message)
    return True


def check_key_ranges(
    token: str, sink_id: str, batch_id: int, outcomes: Sequence[PartitionOutcome | None]
) -> bool:
    """Warn (once per token) when the batch's partitions fell into the key-order trap."""
    found = unordered(outcomes)
    if found is None:
        return False
    return warn_once(f"{token}:key-order", trap_warning(sink_id, batch_id, *found))
