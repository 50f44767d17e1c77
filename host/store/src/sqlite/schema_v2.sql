-- poimen store, schema version 2 (migration 2).
--
-- Drops `intents_by_run`: `intents_by_attempt (run, step, iteration, attempt,
-- id)` already leads with `run`, so reading a run's intents in write order
-- is that index's range plus a sort of the run's few rows. Every intent
-- record written is one index page fewer to write and fsync — a durable tool
-- step writes three.
DROP INDEX intents_by_run;
