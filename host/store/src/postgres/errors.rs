//! Mapping PostgreSQL failures to [`StoreError`] variants: SQLSTATE by
//! SQLSTATE for errors the server reports, by kind for the client's own
//! (a connection refused, reset or timed out is [`StoreError::Unavailable`]),
//! and the pool's. Every variant names the server by its redacted URL; no
//! message carries a password (the client's messages never quote the URL).
//!
//! This module knows tokio-postgres' and deadpool's error types and the
//! SQLSTATEs the schema raises (PM001: a refused commit, decoded by the
//! caller; PM002: a guard trigger), nothing of the records.

use std::path::PathBuf;

use deadpool_postgres::PoolError;
use tokio_postgres::error::DbError;

use crate::error::StoreError;

/// SQLSTATE of a commit refused by `poimen_commit`; its detail is JSON.
pub(crate) const REFUSED: &str = "PM001";

/// The store error for a failed call on the server at `url` (redacted).
pub(crate) fn pg_error(url: &str, e: &tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        return db_error(url, db);
    }
    let message = e.to_string();
    // The client's own failures, by the kind its message starts with.
    if message.starts_with("error serializing")
        || message.starts_with("error deserializing")
        || message.starts_with("unexpected message")
        || message.starts_with("error parsing")
    {
        return StoreError::Postgres {
            url_redacted: url.to_owned(),
            code: "client".into(),
            message,
        };
    }
    if message.starts_with("error authenticating") || message.contains("password missing") {
        return StoreError::AccessDenied {
            url_redacted: url.to_owned(),
            source_message: message,
        };
    }
    if message.starts_with("error performing TLS handshake") {
        return StoreError::Open {
            path: PathBuf::from(url),
            cause: format!(
                "{message}: this poimen connects without TLS (it is not supported yet); use \
                 sslmode=disable or sslmode=prefer, or reach the server over a trusted network"
            ),
        };
    }
    if message.starts_with("invalid configuration") {
        return StoreError::Open {
            path: PathBuf::from(url),
            cause: message,
        };
    }
    // Connecting, the socket, a closed connection, a timeout.
    StoreError::Unavailable {
        url_redacted: url.to_owned(),
        source_message: message,
    }
}

fn db_error(url: &str, db: &DbError) -> StoreError {
    let code = db.code().code();
    let message = match db.detail() {
        Some(detail) if code != REFUSED => format!("{} ({detail})", db.message()),
        _ => db.message().to_owned(),
    };
    let path = || PathBuf::from(url);
    match code {
        // invalid_authorization_specification (an unknown role, a host not
        // allowed), invalid_password, insufficient_privilege.
        c if c.starts_with("28") || c == "42501" => StoreError::AccessDenied {
            url_redacted: url.to_owned(),
            source_message: message,
        },
        // invalid_catalog_name: no such database.
        "3D000" => StoreError::Open {
            path: path(),
            cause: format!("{message}; create it (CREATE DATABASE) or name another in the URL"),
        },
        "53100" => StoreError::Full { path: path() },
        // read_only_sql_transaction: a standby, or default_transaction_read_only.
        "25006" => StoreError::ReadOnly {
            path: path(),
            cause: message,
        },
        // serialization_failure, deadlock_detected, lock_not_available, query_canceled
        // (a statement or lock timeout).
        "40001" | "40P01" | "55P03" | "57014" => StoreError::Busy { path: path() },
        // connection_exception (class 08); admin_shutdown, crash_shutdown,
        // cannot_connect_now (class 57P); too_many_connections, out_of_memory.
        c if c.starts_with("08") || c.starts_with("57P") || c == "53300" || c == "53200" => {
            StoreError::Unavailable {
                url_redacted: url.to_owned(),
                source_message: message,
            }
        }
        other => StoreError::Postgres {
            url_redacted: url.to_owned(),
            code: other.to_owned(),
            message,
        },
    }
}

/// The store error for failing to get a pooled connection.
pub(crate) fn pool_error(url: &str, e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => pg_error(url, &e),
        PoolError::Timeout(kind) => StoreError::Unavailable {
            url_redacted: url.to_owned(),
            source_message: format!(
                "timed out getting a connection ({kind:?}): the server does not answer, or every \
                 pooled connection stayed busy"
            ),
        },
        other => StoreError::Unavailable {
            url_redacted: url.to_owned(),
            source_message: other.to_string(),
        },
    }
}
