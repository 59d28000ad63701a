"""The options' one definition (``OPTIONS``) is the parser's list of names (``KNOWN``):
an option added to one and not the other fails here, so the reference cannot omit it."""

from __future__ import annotations

from sqlsink.options import KNOWN, OPTIONS, SinkOptions


def test_the_definitions_cover_exactly_the_known_options() -> None:
    assert {spec.name.lower(): spec.name for spec in OPTIONS} == KNOWN
    assert len(OPTIONS) == len(KNOWN)  # no option defined twice


def test_every_definition_says_what_it_means() -> None:
    assert [s.name for s in OPTIONS if not (s.default and s.meaning and s.writer)] == []


def test_the_documented_defaults_are_the_parsers() -> None:
    parsed = SinkOptions.parse({"url": "postgresql://u@h/db", "table": "t"})
    said = {s.name: s.default for s in OPTIONS}
    assert said["semantic"] == f"`{parsed.semantic.value}`"
    assert said["mode"] == f"`{parsed.mode.value}`"
    assert said["lockTimeout"] == f"`{parsed.lock_timeout_s:g}s`"
    assert said["runTimeout"] == f"`{parsed.run_timeout_s / 60:g}min`"
    assert said["keepBatches"] == f"`{parsed.keep_batches}`"
    assert said["checkpointCheck"] == f"`{parsed.checkpoint_check.value}`"
    assert said["createTable"] == f"`{str(parsed.create_table).lower()}`"
    assert said["transactionTimeoutWarningRatio"] == f"`{parsed.timeouts.warning_ratio:g}`"
