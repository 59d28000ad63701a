"""Too few prepared-transaction slots for a batch (issue 12 item 12): the task fails
fast with the sink's own sentence, naming the setting, the partitions and the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sqlsink.embedded import EmbeddedPostgres
from sqlsink.errors import TransientError
from tests.pg.protocol import Writer, ids_of, make_table, new_sink, prepared_of


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("slots")), settings={"max_prepared_transactions": 2}
    )
    with server:
        yield server.url()


def test_a_partition_without_a_slot_names_the_setting_and_coalesce(two_slots: str) -> None:
    make_table(two_slots, "events")
    writer = Writer(two_slots, "events", new_sink(), query_id="q")
    prepared = [writer.write(0, range(p * 5, p * 5 + 5), p) for p in range(2)]
    with pytest.raises(TransientError) as full:
        writer.write(0, range(10, 15), 2)
    message = str(full.value)
    assert "max_prepared_transactions" in message and "coalesce" in message
    assert "partition 2" in message and "Nothing of batch 0 is visible" in message
    assert ids_of(two_slots, "events") == []
    with psycopg.connect(two_slots, autocommit=True) as conn:
        for outcome in prepared:
            conn.execute(f"ROLLBACK PREPARED '{outcome.gid}'")
    assert prepared_of(two_slots, writer.sink) == []
