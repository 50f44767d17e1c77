-- poimen store, schema version 5 (migration 5).
--
-- Admission: a workflow's `concurrency` held by the store, so that it is
-- exact across every host of the store.
--
-- * admission_group: the group a run is admitted under (a workflow, or a
--   workflow and a rendered key); NULL for a run whose workflow sets no
--   `max_runs` (and for every run stored before this migration);
-- * admission_max: the group's `max_runs` as the run's version says;
-- * admitted: 1 while the run holds one of its group's slots — from the
--   claim (or held creation) that admitted it until the commit that ends it.
--
-- runs_admitted serves the count of a group's slots in use.

ALTER TABLE runs ADD COLUMN admission_group TEXT;
ALTER TABLE runs ADD COLUMN admission_max INTEGER CHECK (admission_max >= 0);
ALTER TABLE runs ADD COLUMN admitted INTEGER NOT NULL DEFAULT 0 CHECK (admitted IN (0, 1));
CREATE INDEX runs_admission ON runs(admission_group, created_at, id)
 WHERE admission_group IS NOT NULL;
