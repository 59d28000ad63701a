-- Least-privilege set-up for sqlsink, run once by a superuser (or the database owner):
--   psql -v role=sqlsink_writer -v password="'change-me'" -v target=public.events -f sql/setup_role.sql
--
-- The role can: connect, write the target table, and own the sqlsink schema (the
-- commit log). It cannot create other objects nor read other tables.
-- Why the sink itself must run COMMIT PREPARED / ROLLBACK PREPARED as this very role:
-- PostgreSQL lets only the role that prepared a transaction, or a superuser,
-- finish it; membership in that role is not enough. So the driver (committer),
-- the executors (partition writers) and `sqlsink recover` must all connect as
-- :role, or recovery must run as a superuser.

CREATE ROLE :role LOGIN PASSWORD :password;
GRANT CONNECT ON DATABASE :"DBNAME" TO :role;
CREATE SCHEMA IF NOT EXISTS sqlsink AUTHORIZATION :role;
GRANT USAGE ON SCHEMA public TO :role;
GRANT SELECT, INSERT ON TABLE :target TO :role;
-- for mode=upsert with deletes, also: GRANT UPDATE, DELETE ON TABLE :target TO :role;
-- The commit log's markers: the role deletes those of complete batches (it owns the
-- schema above; a role that does not needs GRANT SELECT, INSERT, DELETE ON sqlsink.markers).
--
-- For the option consistentView (a view that shows readers whole batches only): the sink
-- creates the view as this role, so the role owns it and readers read the table and the
-- commit log with its rights. The role then also needs SELECT on the target (above) and
-- CREATE on the view's schema, best a schema of its own for readers, e.g.:
--   CREATE SCHEMA IF NOT EXISTS reads AUTHORIZATION :role;   -- consistentView=reads.events
--   GRANT USAGE ON SCHEMA reads TO <readers>;
--   ALTER DEFAULT PRIVILEGES FOR ROLE :role IN SCHEMA reads GRANT SELECT ON TABLES TO <readers>;
-- Readers need nothing else: no privilege on the table, none on sqlsink.
