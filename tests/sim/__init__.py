"""A deterministic simulation of the sink's protocol (issue 12, "Proven by").

The real core (``Committer``, ``Participant``, ``plan_resolution``) runs as actors
against an in-memory PostgreSQL (``memory``), interleaved step by step by a seeded
scheduler (``sched``), with Spark modelled around it (``world``) and the invariants
of docs/DESIGN.md section 2 checked after every step (``checks``).
"""
