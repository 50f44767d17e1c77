-- poimen store on PostgreSQL, schema version 4 (migration 4).
--
-- FROZEN once released (see schema_v1.sql). The same change as the SQLite
-- store's migration 8: the console and the API list the runs of one
-- version, newest first.

CREATE INDEX runs_by_version ON runs (version, seq);
