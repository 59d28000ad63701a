"""Fixtures of the protocol tests (tests/pg/protocol.py), for every module of this folder."""

from tests.pg.protocol import keyed, sink

__all__ = ["keyed", "sink"]
