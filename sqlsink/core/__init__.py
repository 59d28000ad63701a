"""The protocol's core: gid names, decisions and the resolution of prepared gids.

It knows neither Spark nor a specific database driver; a backend (see
``sqlsink.core.backend``) supplies the few operations it needs.
"""
