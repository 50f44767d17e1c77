//! The PostgreSQL store's schema: the ordered list of migrations, and the
//! checks that decide whether a database may be used as a store at all.
//!
//! The schema version is the highest `version` in `poimen_schema`, one row
//! per applied migration. A new store is built by running every migration
//! from 0 — the path an old store takes to upgrade. Migrations run in one
//! transaction (PostgreSQL's DDL is transactional: all of them, or none),
//! under an advisory lock, so hosts opening one database at once migrate it
//! once. A database whose schema is newer than this code is refused before
//! anything is written. This module knows nothing of the records.

use deadpool_postgres::Object;
use std::path::PathBuf;

use super::errors::pg_error;
use crate::error::StoreError;

/// One schema change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    /// The schema version after it.
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration, in order. Append only: a released migration never changes.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "versions, blobs, runs with leases, events, intents, judgments; poimen_commit",
        sql: include_str!("schema_v1.sql"),
    },
    Migration {
        version: 2,
        name: "runs: timers (wake_at); armed versions; unload deadlines",
        sql: include_str!("schema_v2.sql"),
    },
    Migration {
        version: 3,
        name: "retention: gc_runs, gc_blobs, poimen_gc; deletes only of what gc names",
        sql: include_str!("schema_v3.sql"),
    },
    Migration {
        version: 4,
        name: "runs: index runs_by_version",
        sql: include_str!("schema_v4.sql"),
    },
    Migration {
        version: 5,
        name: "poimen_commit_v2 reads its document once (jsonb)",
        sql: include_str!("schema_v5.sql"),
    },
];

/// The schema version of a PostgreSQL store this code writes and reads.
pub const PG_SCHEMA_VERSION: u32 = 5;

const _: () = assert!(MIGRATIONS[MIGRATIONS.len() - 1].version == PG_SCHEMA_VERSION);

/// The advisory lock key migrations hold: "POIM".
const MIGRATION_LOCK: i64 = 0x504f_494d;

/// The tables of a store; a database holding one of them without
/// `poimen_schema` is another application's.
const TABLES: &[&str] = &[
    "versions",
    "blobs",
    "runs",
    "events",
    "intents",
    "judgments",
    "judgment_answers",
    "armed",
    "unloads",
    "judgment_expiries",
    "gc_runs",
    "gc_blobs",
];

/// Refuses a database whose text is not UTF-8: the store keeps JSON and
/// names as text, and would fail on the first character another encoding
/// cannot hold.
pub(crate) async fn check_encoding(client: &Object, url: &str) -> Result<(), StoreError> {
    let row = client
        .query_one("SELECT current_setting('server_encoding')", &[])
        .await
        .map_err(|e| pg_error(url, &e))?;
    let encoding: String = row.try_get(0).map_err(|e| pg_error(url, &e))?;
    if encoding.eq_ignore_ascii_case("UTF8") {
        return Ok(());
    }
    Err(StoreError::Open {
        path: PathBuf::from(url),
        cause: format!(
            "the database's encoding is {encoding}, and a poimen store needs UTF8; create the \
             database with CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0"
        ),
    })
}

/// Applies every migration of `migrations` above the database's version,
/// in one transaction. Returns the version before.
pub(crate) async fn migrate(
    client: &mut Object,
    url: &str,
    migrations: &[Migration],
) -> Result<u32, StoreError> {
    let path = || PathBuf::from(url);
    let err = |e: tokio_postgres::Error| pg_error(url, &e);
    let tx = client.transaction().await.map_err(err)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(err)?;
    let has_schema: bool = tx
        .query_one("SELECT to_regclass('poimen_schema') IS NOT NULL", &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(err)?;
    let before = if has_schema {
        let v: i32 = tx
            .query_one("SELECT coalesce(max(version), 0) FROM poimen_schema", &[])
            .await
            .and_then(|r| r.try_get(0))
            .map_err(err)?;
        u32::try_from(v).map_err(|_| StoreError::Corrupt {
            path: path(),
            detail: format!("schema version {v} in poimen_schema is out of range"),
        })?
    } else {
        let names: Vec<&str> = TABLES.to_vec();
        let foreign: Option<String> = tx
            .query_one(
                "SELECT string_agg(tablename, ', ' ORDER BY tablename) FROM pg_tables
                 WHERE schemaname = current_schema() AND tablename = ANY ($1)",
                &[&names],
            )
            .await
            .and_then(|r| r.try_get(0))
            .map_err(err)?;
        if let Some(tables) = foreign {
            return Err(StoreError::NotADatabase {
                path: path(),
                detail: format!(
                    "the database has tables named {tables} but no poimen_schema: another \
                     application's data"
                ),
            });
        }
        0
    };
    let target = migrations.last().map_or(0, |m| m.version);
    if before > target {
        return Err(StoreError::NewerSchema {
            path: path(),
            found: before,
            supported: target,
        });
    }
    let failed = |version: u32, e: tokio_postgres::Error| match pg_error(url, &e) {
        StoreError::Postgres { message, .. } => StoreError::Migration {
            path: path(),
            version,
            cause: message,
        },
        specific => specific,
    };
    for m in migrations.iter().filter(|m| m.version > before) {
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| failed(m.version, e))?;
        let version = i32::try_from(m.version).unwrap_or(i32::MAX);
        tx.execute(
            "INSERT INTO poimen_schema (version, name) VALUES ($1, $2)",
            &[&version, &m.name],
        )
        .await
        .map_err(|e| failed(m.version, e))?;
    }
    tx.commit().await.map_err(|e| failed(target, e))?;
    Ok(before)
}
