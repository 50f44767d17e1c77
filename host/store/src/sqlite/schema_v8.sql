-- poimen store on SQLite, schema version 8.
--
-- FROZEN once released (see schema_v1.sql). The console and the API list
-- the runs of one version, newest first: an index for it.

CREATE INDEX runs_by_version ON runs(version, seq);
