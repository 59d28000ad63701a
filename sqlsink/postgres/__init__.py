"""The PostgreSQL backend: connections, COPY, prepare/commit, the commit log."""
