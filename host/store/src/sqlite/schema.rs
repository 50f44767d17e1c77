//! The SQLite store's schema: the ordered list of migrations, and the checks
//! that decide whether a file may be opened as a store at all.
//!
//! A store's schema version is `PRAGMA user_version`; every applied
//! migration also has a row in `schema_migrations`. A fresh store is built
//! by running every migration from 0 — the same path an old store takes to
//! upgrade, so the upgrade path is exercised on every open of a new store.
//! Migrations are applied in one `IMMEDIATE` transaction: all of them, or
//! none. This module knows nothing of the records stored in the tables.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::errors::sql_error;
use super::io_error;
use crate::error::StoreError;

/// `PRAGMA application_id` of a poimen store: "POIM".
pub const APPLICATION_ID: i32 = 0x504f_494d;

/// One schema change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    /// The `user_version` after it.
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration, in order. Append only: a released migration never changes.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "versions, blobs, runs, events, intents, judgments",
        sql: include_str!("schema_v1.sql"),
    },
    Migration {
        version: 2,
        name: "intents: drop the redundant index intents_by_run",
        sql: include_str!("schema_v2.sql"),
    },
    Migration {
        version: 3,
        name: "runs: a tenant; intents: the phase `abandoned` (table rebuilt)",
        sql: include_str!("schema_v3.sql"),
    },
    Migration {
        version: 4,
        name: "runs: leases with fencing (lease_epoch, lease_expires_at); index runs_runnable",
        sql: include_str!("schema_v4.sql"),
    },
    Migration {
        version: 5,
        name: "runs: admission groups (admission_group, admission_max, admitted)",
        sql: include_str!("schema_v5.sql"),
    },
    Migration {
        version: 6,
        name: "runs: timers (wake_at); armed versions; unload deadlines",
        sql: include_str!("schema_v6.sql"),
    },
    Migration {
        version: 7,
        name: "retention: gc_runs, gc_blobs; deletes only of what gc names",
        sql: include_str!("schema_v7.sql"),
    },
    Migration {
        version: 8,
        name: "runs: index runs_by_version",
        sql: include_str!("schema_v8.sql"),
    },
];

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: u32 = 8;

const _: () = assert!(MIGRATIONS[MIGRATIONS.len() - 1].version == SCHEMA_VERSION);

/// What the header of a file says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// An empty SQLite database: a new store.
    Empty,
    /// A poimen store at this schema version.
    Store(u32),
}

/// Reads the header and decides whether this is a new store, a poimen store
/// this code can open, or something to refuse.
pub(crate) fn classify(conn: &Connection, path: &Path) -> Result<FileKind, StoreError> {
    let app_id: i32 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(|e| sql_error(path, e))?;
    let user_version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| sql_error(path, e))?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| sql_error(path, e))?;
    if app_id == 0 && user_version == 0 && objects == 0 {
        return Ok(FileKind::Empty);
    }
    if app_id != APPLICATION_ID {
        return Err(StoreError::NotADatabase {
            path: path.to_owned(),
            detail: format!(
                "an SQLite database of another application: application_id {app_id:#x}, \
                 a poimen store has {APPLICATION_ID:#x}"
            ),
        });
    }
    let found = u32::try_from(user_version).map_err(|_| StoreError::Corrupt {
        path: path.to_owned(),
        detail: format!("schema version {user_version} is out of range"),
    })?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == 0 {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: "marked as a poimen store but at schema version 0".into(),
        });
    }
    Ok(FileKind::Store(found))
}

/// `PRAGMA quick_check`: structure of every page and index. O(size of the
/// store); catches truncation and most torn or overwritten pages. It cannot
/// see a flipped bit inside a value: blobs and versions are re-hashed on read
/// for that.
pub(crate) fn quick_check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let mut stmt = conn
        .prepare("PRAGMA quick_check(10)")
        .map_err(|e| sql_error(path, e))?;
    let problems: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| sql_error(path, e))?;
    if problems.len() == 1 && problems[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        path: path.to_owned(),
        detail: format!("SQLite's quick_check failed: {}", problems.join("; ")),
    })
}

/// The file against its own header (the first 100 bytes, SQLite's file
/// format §1.3): its length must be a whole number of pages and, where the
/// header's page count is valid (its version-valid-for number equals the
/// change counter), at least that many pages. In WAL mode the count is the
/// one of the last checkpoint, and a checkpoint never shrinks the file
/// below it, so a longer file is fine and a shorter one was truncated.
/// Constant time; it cannot see damage inside a page (SQLite does, when a
/// read reaches it). A file without SQLite's header passes: [`classify`]
/// refuses it, naming what it is.
pub(crate) fn header_check(path: &Path) -> Result<(), StoreError> {
    use std::io::Read;
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    let mut file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    let mut header = [0u8; 100];
    if file.read_exact(&mut header).is_err() || &header[..16] != b"SQLite format 3\0" {
        // No SQLite header: `classify` names what the file is instead.
        return Ok(());
    }
    let be32 = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536u64,
        n if n >= 512 && n.is_power_of_two() => u64::from(n),
        n => {
            return Err(corrupt(format!(
                "the header's page size {n} is not a valid SQLite page size"
            )));
        }
    };
    if len % page_size != 0 {
        return Err(corrupt(format!(
            "the file is {len} bytes, not a whole number of {page_size}-byte pages (truncated or appended to)"
        )));
    }
    let (changes, pages, valid_for) = (be32(24), u64::from(be32(28)), be32(92));
    if changes == valid_for && pages > 0 && len < pages * page_size {
        return Err(corrupt(format!(
            "the file holds {} of the {pages} pages its header counts (truncated)",
            len / page_size
        )));
    }
    Ok(())
}

/// Applies every migration of `migrations` above the store's version, in one
/// transaction. Returns the version before.
pub(crate) fn migrate(
    conn: &mut Connection,
    path: &Path,
    migrations: &[Migration],
) -> Result<u32, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| sql_error(path, e))?;
    // Read again under the write lock: another process may have migrated
    // since `classify` looked.
    let before: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| sql_error(path, e))?;
    let before = u32::try_from(before).unwrap_or(u32::MAX);
    let target = migrations.last().map_or(0, |m| m.version);
    if before > target {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found: before,
            supported: target,
        });
    }
    let failed = |version: u32, e: rusqlite::Error| match sql_error(path, e) {
        StoreError::Sqlite { message, .. } => StoreError::Migration {
            path: path.to_owned(),
            version,
            cause: message,
        },
        specific => specific,
    };
    for m in migrations.iter().filter(|m| m.version > before) {
        tx.execute_batch(m.sql).map_err(|e| failed(m.version, e))?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES (?1, ?2)",
            (m.version, m.name),
        )
        .map_err(|e| failed(m.version, e))?;
    }
    if target > before {
        tx.pragma_update(None, "user_version", target)
            .map_err(|e| failed(target, e))?;
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(|e| failed(target, e))?;
    }
    tx.commit().map_err(|e| failed(target, e))?;
    Ok(before)
}

#[cfg(test)]
mod tests {
    use rusqlite::OptionalExtension;

    use super::*;

    fn schema_of(conn: &Connection) -> Vec<(String, String, Option<String>)> {
        let mut stmt = conn
            .prepare(
                "SELECT type, name, sql FROM sqlite_schema
                 WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name",
            )
            .expect("prepare");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    /// Migration 1 is released: it must build exactly the schema of the
    /// version-1 fixture that stores on disk were made with.
    #[test]
    fn migration_one_is_frozen() {
        let mut fresh = Connection::open_in_memory().expect("open");
        migrate(&mut fresh, Path::new(":memory:"), &MIGRATIONS[..1]).expect("migrate");
        let fixture = Connection::open_in_memory().expect("open");
        fixture
            .execute_batch(include_str!("../../tests/fixtures/store_v1.sql"))
            .expect("load fixture");
        assert_eq!(schema_of(&fresh), schema_of(&fixture));
    }

    /// Migration 2 drops `intents_by_run`; reading a run's intents in write
    /// order then goes through `intents_by_attempt`, never a table scan.
    #[test]
    fn migration_two_drops_the_redundant_intent_index() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn, Path::new(":memory:"), MIGRATIONS).expect("migrate");
        let names: Vec<String> = schema_of(&conn).into_iter().map(|(_, n, _)| n).collect();
        assert!(!names.iter().any(|n| n == "intents_by_run"), "{names:?}");
        assert!(names.iter().any(|n| n == "intents_by_attempt"), "{names:?}");
        let plan: Vec<String> = conn
            .prepare("EXPLAIN QUERY PLAN SELECT id FROM intents WHERE run = 'WFR-x' ORDER BY id")
            .expect("prepare")
            .query_map([], |r| r.get::<_, String>(3))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(
            plan.iter()
                .any(|l| l.contains("USING COVERING INDEX intents_by_attempt")
                    || l.contains("USING INDEX intents_by_attempt")),
            "{plan:?}"
        );
    }

    /// Every row of `table`, in `order`, as SQLite values.
    fn rows(conn: &Connection, table: &str, order: &str) -> Vec<Vec<rusqlite::types::Value>> {
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
            .expect("prepare");
        let n = stmt.column_count();
        stmt.query_map([], |r| (0..n).map(|k| r.get(k)).collect())
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    const V: &str = "'b3:0000000000000000000000000000000000000000000000000000000000000000'";
    const B: &str = "'b3:1111111111111111111111111111111111111111111111111111111111111111'";

    /// A version-2 store (built by migrations 1 and 2) with runs and
    /// intents — ids with gaps, every phase v2 knows — written by raw SQL.
    fn v2_store_with_rows() -> Connection {
        let mut conn = Connection::open_in_memory().expect("open");
        conn.pragma_update(None, "foreign_keys", true)
            .expect("foreign keys");
        migrate(&mut conn, Path::new(":memory:"), &MIGRATIONS[..2]).expect("v2");
        conn.execute_batch(&format!(
            "INSERT INTO versions (seq, version, workflow_id, canonical, created_at)
                 VALUES (1, {V}, 'w', x'7b7d', 10);
             INSERT INTO blobs VALUES ({B}, 2, x'7b7d');
             INSERT INTO runs (seq, id, workflow_id, version, status, input_hash,
                               idempotency_key, created_at, updated_at, owner, claimed_at)
                 VALUES (1, 'WFR-1', 'w', {V}, 'running', {B}, 'key-1', 11, 12, 'host', 11);
             INSERT INTO runs (seq, id, workflow_id, version, status, reason, input_hash,
                               parent_run, parent_step, created_at, updated_at)
                 VALUES (2, 'WFR-2', 'w', {V}, 'failed', 'boom', {B}, 'WFR-1', 'sub', 13, 14);
             INSERT INTO intents VALUES
                 (3, 'WFR-1', 'a', 0, 1, 'pending', 't', '1', 'd', 'pure', 'h', 'k', NULL, NULL, NULL, 20),
                 (7, 'WFR-1', 'a', 0, 1, 'dispatched', 't', '1', 'd', 'pure', 'h', 'k', NULL, NULL, NULL, 21),
                 (8, 'WFR-1', 'a', 0, 1, 'committed', 't', '1', 'd', 'pure', 'h', 'k', 'b3:o', NULL, '{{\"fs\":[]}}', 22),
                 (12, 'WFR-2', 'b', 2, 3, 'pending', 't', '1', 'd', 'non-idempotent', 'h', 'k2', NULL, NULL, NULL, 23),
                 (13, 'WFR-2', 'b', 2, 3, 'failed', 't', '1', 'd', 'non-idempotent', 'h', 'k2', NULL, 'unavailable', NULL, 24);"
        ))
        .expect("rows");
        conn
    }

    /// Migration 3 keeps every row (intent ids included), gives old runs the
    /// default tenant, and the rebuilt intents table keeps its guards.
    #[test]
    fn migration_three_upgrades_a_v2_store_row_for_row() {
        let mut conn = v2_store_with_rows();
        let tables = [
            ("versions", "seq"),
            ("blobs", "hash"),
            ("runs", "seq"),
            ("intents", "id"),
        ];
        let before: Vec<_> = tables.iter().map(|(t, o)| rows(&conn, t, o)).collect();
        assert_eq!(
            migrate(&mut conn, Path::new(":memory:"), &MIGRATIONS[..3]).expect("v3"),
            2
        );
        assert_eq!(version_of(&conn), 3);
        let after: Vec<_> = tables.iter().map(|(t, o)| rows(&conn, t, o)).collect();
        assert_eq!(after[0], before[0], "versions");
        assert_eq!(after[1], before[1], "blobs");
        assert_eq!(after[3], before[3], "intents, ids included");
        // Runs: every old column as it was, and the new tenant column last.
        assert_eq!(after[2].len(), before[2].len());
        for (new, old) in after[2].iter().zip(&before[2]) {
            assert_eq!(new[..old.len()], old[..], "runs");
            assert_eq!(
                new[old.len()..],
                [rusqlite::types::Value::Text("default".into())]
            );
        }

        // The rebuilt table refuses rewriting history and takes `abandoned`.
        for sql in [
            "UPDATE intents SET phase = 'committed'",
            "UPDATE intents SET at = 0 WHERE id = 3",
            "DELETE FROM intents",
            "DELETE FROM intents WHERE id = 13",
        ] {
            let err = conn.execute(sql, []).expect_err(sql);
            assert!(err.to_string().contains("poimen:"), "{sql}: {err}");
        }
        let insert = |id: i64, phase: &str| {
            conn.execute(
                "INSERT INTO intents VALUES (?1, 'WFR-1', 'c', 0, 1, ?2, 't', '1', 'd', 'pure',
                 'h', 'k', NULL, NULL, NULL, 30)",
                rusqlite::params![id, phase],
            )
        };
        insert(20, "abandoned").expect("abandoned is a phase");
        let err = insert(21, "forgotten").expect_err("not a phase");
        assert!(err.to_string().contains("CHECK"), "{err}");
        // A foreign key still guards the run.
        let err = conn
            .execute(
                "INSERT INTO intents VALUES (22, 'WFR-9', 'c', 0, 1, 'pending', 't', '1', 'd',
                 'pure', 'h', 'k', NULL, NULL, NULL, 30)",
                [],
            )
            .expect_err("unknown run");
        assert!(err.to_string().contains("FOREIGN KEY"), "{err}");

        // The tenant is part of a run's identity, and a child shares its parent's.
        let err = conn
            .execute("UPDATE runs SET tenant = 'other' WHERE id = 'WFR-1'", [])
            .expect_err("identity");
        assert!(err.to_string().contains("identity is immutable"), "{err}");
        let err = conn
            .execute_batch(&format!(
                "INSERT INTO runs (id, workflow_id, version, status, input_hash, parent_run,
                                   parent_step, created_at, updated_at, tenant)
                 VALUES ('WFR-3', 'w', {V}, 'queued', {B}, 'WFR-1', 's', 15, 15, 'other')"
            ))
            .expect_err("other tenant");
        assert!(err.to_string().contains("tenant must be"), "{err}");
        conn.execute_batch(&format!(
            "INSERT INTO runs (id, workflow_id, version, status, input_hash, created_at,
                               updated_at, tenant)
             VALUES ('WFR-4', 'w', {V}, 'queued', {B}, 16, 16, 'other')"
        ))
        .expect("a top-level run of another tenant");
        assert_eq!(
            conn.query_row("PRAGMA foreign_key_check", [], |_| Ok(()))
                .optional()
                .expect("foreign_key_check"),
            None
        );
        let ok: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity_check");
        assert_eq!(ok, "ok");
    }

    /// An old store upgraded ends with exactly the schema a new store gets:
    /// the v1 fixture, migrated, against a store built from nothing.
    #[test]
    fn upgrading_the_v1_fixture_builds_the_schema_of_a_new_store() {
        let mut fresh = Connection::open_in_memory().expect("open");
        migrate(&mut fresh, Path::new(":memory:"), MIGRATIONS).expect("migrate");
        let mut old = Connection::open_in_memory().expect("open");
        old.execute_batch(include_str!("../../tests/fixtures/store_v1.sql"))
            .expect("load fixture");
        assert_eq!(
            migrate(&mut old, Path::new(":memory:"), MIGRATIONS).expect("upgrade"),
            1
        );
        assert_eq!(schema_of(&old), schema_of(&fresh));
        let names: Vec<String> = schema_of(&fresh).into_iter().map(|(_, n, _)| n).collect();
        for name in [
            "runs_by_tenant",
            "runs_identity_immutable",
            "runs_child_same_tenant",
            "intents_by_attempt",
            "intents_no_update",
            "intents_no_delete",
            "runs_lease_epoch_grows",
            "runs_runnable",
        ] {
            assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
        }
        assert!(!names.iter().any(|n| n == "intents_v3"), "{names:?}");
    }

    /// Migration 4 gives every run a lease epoch: a lease stored before
    /// (no expiry, no epoch) becomes epoch 1 expiring when it was claimed;
    /// an unclaimed run has epoch 0 and no expiry. Every other column stays.
    #[test]
    fn migration_four_gives_old_leases_an_epoch_and_an_expiry() {
        use rusqlite::types::Value::{Integer, Null};
        let mut conn = v2_store_with_rows();
        migrate(&mut conn, Path::new(":memory:"), &MIGRATIONS[..3]).expect("v3");
        let before = rows(&conn, "runs", "seq");
        assert_eq!(
            migrate(&mut conn, Path::new(":memory:"), &MIGRATIONS[..4]).expect("v4"),
            3
        );
        assert_eq!(version_of(&conn), 4);
        let after = rows(&conn, "runs", "seq");
        assert_eq!(after.len(), before.len());
        for (new, old) in after.iter().zip(&before) {
            assert_eq!(new[..old.len()], old[..], "every old column as it was");
        }
        // WFR-1 was owned by `host`, claimed at 11; WFR-2 was never claimed.
        assert_eq!(after[0][before[0].len()..], [Integer(1), Integer(11)]);
        assert_eq!(after[1][before[1].len()..], [Integer(0), Null]);

        // The epoch never goes back, even under raw SQL; it may grow.
        let err = conn
            .execute("UPDATE runs SET lease_epoch = 0 WHERE id = 'WFR-1'", [])
            .expect_err("lowered");
        assert!(err.to_string().contains("never goes back"), "{err}");
        conn.execute("UPDATE runs SET lease_epoch = 2 WHERE id = 'WFR-1'", [])
            .expect("raised");
        let err = conn
            .execute("UPDATE runs SET lease_epoch = -1 WHERE id = 'WFR-2'", [])
            .expect_err("negative");
        assert!(err.to_string().contains("poimen:"), "{err}");

        // claim_runnable's scan goes through runs_runnable.
        let plan: Vec<String> = conn
            .prepare(
                "EXPLAIN QUERY PLAN SELECT id FROM runs INDEXED BY runs_runnable
                 WHERE status IN ('queued', 'running') AND (owner IS NULL OR lease_expires_at <= 5)
                 ORDER BY created_at, id LIMIT 10",
            )
            .expect("prepare")
            .query_map([], |r| r.get::<_, String>(3))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(plan.iter().any(|l| l.contains("runs_runnable")), "{plan:?}");
        assert!(!plan.iter().any(|l| l.contains("TEMP B-TREE")), "{plan:?}");
    }

    const V2: Migration = Migration {
        version: 2,
        name: "test: add a column",
        sql: "ALTER TABLE runs ADD COLUMN note TEXT;",
    };

    const BROKEN: Migration = Migration {
        version: 2,
        name: "test: broken",
        sql: "CREATE TABLE t2 (x INTEGER); THIS IS NOT SQL;",
    };

    fn version_of(conn: &Connection) -> i64 {
        conn.pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("user_version")
    }

    #[test]
    fn migrations_apply_in_order_and_record_themselves() {
        let mut conn = Connection::open_in_memory().expect("open");
        let p = Path::new(":memory:");
        assert_eq!(migrate(&mut conn, p, &MIGRATIONS[..1]).expect("v1"), 0);
        assert_eq!(version_of(&conn), 1);
        let list = [MIGRATIONS[0], V2];
        assert_eq!(migrate(&mut conn, p, &list).expect("v2"), 1);
        assert_eq!(version_of(&conn), 2);
        conn.prepare("SELECT note FROM runs")
            .expect("the column was added");
        let applied: Vec<i64> = conn
            .prepare("SELECT version FROM schema_migrations ORDER BY version")
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(applied, vec![1, 2]);
        // Nothing left to do: a no-op.
        assert_eq!(migrate(&mut conn, p, &list).expect("again"), 2);
        // An older binary refuses the newer store.
        let err = migrate(&mut conn, p, &MIGRATIONS[..1]).expect_err("newer");
        assert!(
            matches!(
                err,
                StoreError::NewerSchema {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_failing_migration_leaves_the_store_at_its_version() {
        let mut conn = Connection::open_in_memory().expect("open");
        let p = Path::new(":memory:");
        migrate(&mut conn, p, &MIGRATIONS[..1]).expect("v1");
        let err = migrate(&mut conn, p, &[MIGRATIONS[0], BROKEN]).expect_err("broken");
        assert!(
            matches!(err, StoreError::Migration { version: 2, .. }),
            "{err:?}"
        );
        assert_eq!(version_of(&conn), 1);
        let t2: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 't2'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(t2, 0, "the half-applied migration was rolled back");
    }
}
