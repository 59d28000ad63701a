"""The MariaDB backend: the protocol on XA (issue 31). MySQL 8.0.30+ is meant to be
served by the same code where it behaves the same; untested."""
