"""``sqlsink check`` says what each partition costs (issue 15, "Connections")."""

from __future__ import annotations

import json
import subprocess
import sys


def test_check_says_each_partition_takes_a_connection_and_a_slot(pg_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sqlsink", "check", "--url", pg_url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    findings = {f["setting"]: f for f in json.loads(result.stdout)["findings"]}
    message = findings["max_prepared_transactions"]["message"]
    assert "each non-empty partition of a batch takes a connection" in message
    assert "prepared-transaction slot until the batch commits" in message
    assert "maxPartitions=N" in message and "df.coalesce(N)" in message
