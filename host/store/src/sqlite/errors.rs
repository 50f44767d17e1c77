//! Mapping SQLite's result codes to [`StoreError`] variants, explicitly,
//! code by code.
//!
//! This module knows rusqlite's error type and nothing of the schema.

use std::path::Path;

use rusqlite::ErrorCode;

use crate::error::StoreError;

/// The store error for a failed SQLite call on the store at `path`.
pub(crate) fn sql_error(path: &Path, e: rusqlite::Error) -> StoreError {
    let path = path.to_owned();
    match e {
        rusqlite::Error::SqliteFailure(f, msg) => {
            let message = msg.unwrap_or_else(|| f.to_string());
            match f.code {
                ErrorCode::NotADatabase => StoreError::NotADatabase {
                    path,
                    detail: format!("SQLite does not recognize the file: {message}"),
                },
                ErrorCode::DatabaseCorrupt => StoreError::Corrupt {
                    path,
                    detail: format!("SQLite reports: {message}"),
                },
                ErrorCode::DiskFull => StoreError::Full { path },
                ErrorCode::ReadOnly => StoreError::ReadOnly {
                    path,
                    cause: message,
                },
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::Busy { path },
                ErrorCode::SystemIoFailure => StoreError::Io {
                    path,
                    detail: format!("{message} (SQLite extended code {})", f.extended_code),
                },
                ErrorCode::CannotOpen | ErrorCode::PermissionDenied => StoreError::Open {
                    path,
                    cause: message,
                },
                _ => StoreError::Sqlite {
                    path,
                    code: f.extended_code,
                    message,
                },
            }
        }
        other => StoreError::Sqlite {
            path,
            code: -1,
            message: other.to_string(),
        },
    }
}
