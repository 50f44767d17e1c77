-- poimen store, schema version 4 (migration 4).
--
-- Leases with fencing, for several hosts driving runs from one store. A
-- run's lease is (owner, lease_epoch, lease_expires_at):
--
-- * owner: the host holding the run, NULL when no host does (as before);
-- * lease_epoch: the fencing epoch of the latest tenure. Every claim sets it
--   to one more than before, and a release leaves it, so each tenure's
--   epoch is larger than any before it; a commit carrying an older epoch is
--   refused (StoreError::LeaseLost). 0: the run was never claimed. Trigger
--   runs_lease_epoch_grows refuses lowering it, even under raw SQL;
-- * lease_expires_at: milliseconds since the Unix epoch after which another
--   host may take the run over; NULL when owner is NULL.
--
-- claimed_at (schema 1) stays: when the current tenure began.
--
-- A lease stored before this migration had no expiry and no epoch: it
-- becomes epoch 1, expiring when it was claimed. Its host reclaims it on
-- restart as before (a claim by the holder always succeeds), and any other
-- host may now take it over.
--
-- runs_runnable serves claim_runnable: queued and running runs, oldest
-- first.

ALTER TABLE runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0);
ALTER TABLE runs ADD COLUMN lease_expires_at INTEGER;
UPDATE runs SET lease_epoch = 1, lease_expires_at = coalesce(claimed_at, updated_at)
 WHERE owner IS NOT NULL;
CREATE TRIGGER runs_lease_epoch_grows BEFORE UPDATE OF lease_epoch ON runs
WHEN NEW.lease_epoch < OLD.lease_epoch
BEGIN SELECT RAISE(ABORT, 'poimen: a run''s lease epoch never goes back'); END;
CREATE INDEX runs_runnable ON runs(created_at, id) WHERE status IN ('queued', 'running');
