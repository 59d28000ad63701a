"""A Spark streaming checkpoint, read without Spark, and how it relates to the commit log.

A checkpoint directory holds (among other things):

- ``metadata``: one JSON line, ``{"id": "<query id>"}`` (the id survives restarts);
- ``offsets/<N>``: written before batch N runs: ``v1``, a JSON line of batch metadata
  (``batchTimestampMs``, ``batchWatermarkMs``, ``conf``), then one line per source;
- ``commits/<N>``: written after the sink's ``commit`` of batch N returned: ``v1`` and
  a JSON line (``nextBatchWatermarkMs``).

Spark writes each file to a hidden temporary file and renames it, and keeps ``.crc``
files beside them (``.<N>.crc``); only names that are a batch number count. Spark
deletes old entries (``spark.sql.streaming.minBatchesToRetain``, default 100), so
the checkpoint shows only its most recent batches.

A local path or a ``file:`` URI is read directly; any other URI through
``pyarrow.fs`` (``s3a://`` and ``s3n://`` as ``s3://``), where pyarrow supports the
scheme and finds credentials in the environment; otherwise it cannot be read here.

The parts:

- ``files``: where a checkpoint is (a path, a ``file:`` URI, or a URI for
  ``pyarrow.fs``) and how its files are listed and read, with secrets kept out of
  what is shown;
- ``parse``: Spark's logs parsed (``read_checkpoint``, ``read_commits``), and the
  reader the sink's own check uses at commit time (``checkpoint_policy``, for
  ``sqlsink.core.checkpoint_check``);
- ``relation``: ``relate`` compares those logs with the sink's decisions, batch by
  batch, and says what Spark and the sink will do on restart (DESIGN.md section 3).
"""
