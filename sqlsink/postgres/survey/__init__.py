"""Read-only queries for the command-line tool, by job:

``decisions``
    the commit log: sinks, decided batches, their summary, the schema's version;
``prepared``
    prepared transactions, and which decided ones are lost (``confirm_lost``);
``sessions``
    the sessions of a sink and those holding its lock (shown as evidence; liveness is
    the runs registry's, ``run_registry.runs``);
``roles``
    who the connection is;
``server_checks``
    the checks of ``sqlsink check``.

Nothing here writes. The sink's session advisory lock, the very lock the committer holds
while it decides and commits, is ``sqlsink.postgres.locks`` (``try_sink_lock``,
``acquire_sink_lock``), so that ``sqlsink recover`` takes turns with a running sink.

Server checks are functions ``(conn, CheckContext) -> list[Finding]`` listed in
``server_checks.CHECKS``; add a check by writing one more such function.
"""
