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
