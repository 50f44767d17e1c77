//! Opening a store by URL: [`StoreUrl`] says which backend a location
//! names, [`open_store`] opens it.
//!
//! `postgres://…` and `postgresql://…` name a [`PostgresStore`](crate::PostgresStore)
//! (the URL as libpq and `psql` take it); `sqlite://PATH` or a plain file
//! path name a [`SqliteStore`](crate::SqliteStore) with the default
//! [`SqliteOptions`](crate::SqliteOptions); any other `scheme://` is
//! refused with [`StoreError::UnsupportedUrl`], listing what is accepted.
//! Nothing here opens a connection or a file except [`StoreUrl::open`],
//! and nothing here ever prints a password: [`redact_url`](crate::redact_url)
//! replaces it.

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::StoreError;
use crate::redact::{redact_url, split_scheme};
use crate::store::Store;

/// Where a store is, as a URL or path names it.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A PostgreSQL database: the URL as given (`postgres://` or `postgresql://`).
    Postgres(String),
    /// An SQLite store file.
    Sqlite(PathBuf),
}

/// The schemes [`StoreUrl::parse`] takes, for messages.
fn accepted() -> Vec<String> {
    vec![
        "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE".to_owned(),
        "postgresql://…".to_owned(),
        "sqlite://PATH".to_owned(),
        "a plain file path".to_owned(),
    ]
}

impl StoreUrl {
    /// Which store `url` names. Refuses an empty location
    /// ([`StoreError::Open`]), `sqlite://` without a path
    /// ([`StoreError::Open`]), and any scheme but `postgres`, `postgresql`
    /// and `sqlite` ([`StoreError::UnsupportedUrl`]). A scheme is letters,
    /// digits, `+`, `-` and `.` before `://`, starting with a letter; a path
    /// that merely contains `://` further on is a path.
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        if url.is_empty() {
            return Err(StoreError::Open {
                path: PathBuf::new(),
                cause: "no store was given: pass a file path, sqlite://PATH or postgres://…".into(),
            });
        }
        let Some((scheme, rest)) = split_scheme(url) else {
            return Ok(StoreUrl::Sqlite(PathBuf::from(url)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Ok(StoreUrl::Postgres(url.to_owned())),
            "sqlite" if rest.is_empty() => Err(StoreError::Open {
                path: PathBuf::from(url),
                cause: "sqlite:// names no file: write sqlite://PATH, e.g. \
                        sqlite:///var/lib/poimen/poimen.db or sqlite://.poimen/poimen.db"
                    .into(),
            }),
            "sqlite" => Ok(StoreUrl::Sqlite(PathBuf::from(rest))),
            _ => Err(StoreError::UnsupportedUrl {
                url_redacted: redact_url(url),
                scheme: scheme.to_owned(),
                accepted: accepted(),
            }),
        }
    }

    /// The location for messages and logs, its password replaced by `***`.
    pub fn redacted(&self) -> String {
        match self {
            StoreUrl::Postgres(url) => redact_url(url),
            StoreUrl::Sqlite(path) => path.display().to_string(),
        }
    }

    /// Opens the store: a [`PostgresStore`](crate::PostgresStore) with the
    /// default [`PostgresOptions`](crate::PostgresOptions), or a
    /// [`SqliteStore`](crate::SqliteStore) with the default
    /// [`SqliteOptions`](crate::SqliteOptions). A backend this build was
    /// compiled without is [`StoreError::UnsupportedUrl`].
    pub async fn open(&self) -> Result<Arc<dyn Store>, StoreError> {
        match self {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => Ok(Arc::new(crate::PostgresStore::open(url).await?)),
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(path) => Ok(Arc::new(crate::SqliteStore::open(path.clone()).await?)),
            #[allow(unreachable_patterns)]
            other => Err(StoreError::UnsupportedUrl {
                url_redacted: other.redacted(),
                scheme: match other {
                    StoreUrl::Postgres(_) => "postgres".into(),
                    StoreUrl::Sqlite(_) => "sqlite".into(),
                },
                accepted: vec!["(none: this poimen was built without that store backend)".into()],
            }),
        }
    }
}

impl std::fmt::Debug for StoreUrl {
    // Never the password, not even in a debug print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Postgres(_) => f.debug_tuple("Postgres").field(&self.redacted()).finish(),
            StoreUrl::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
        }
    }
}

/// Opens the store `url` names; see [`StoreUrl::parse`] and [`StoreUrl::open`].
pub async fn open_store(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    StoreUrl::parse(url)?.open().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_urls_name_the_postgres_store() {
        for url in [
            "postgres://postgres@127.0.0.1:5432/test",
            "postgresql://u:p@db.example:6543/poimen?sslmode=disable",
            "POSTGRES://host/db",
            "postgres://",
        ] {
            assert_eq!(
                StoreUrl::parse(url).expect(url),
                StoreUrl::Postgres(url.to_owned())
            );
        }
    }

    #[test]
    fn sqlite_urls_and_plain_paths_name_a_file() {
        let cases = [
            (
                "sqlite:///var/lib/poimen/poimen.db",
                "/var/lib/poimen/poimen.db",
            ),
            ("sqlite://.poimen/poimen.db", ".poimen/poimen.db"),
            ("SQLite://a.db", "a.db"),
            ("/abs/poimen.db", "/abs/poimen.db"),
            ("relative/poimen.db", "relative/poimen.db"),
            ("poimen.db", "poimen.db"),
            // Not a scheme: a path that happens to contain `://` later on.
            ("./odd://name.db", "./odd://name.db"),
            ("1http://x", "1http://x"),
            ("C:\\stores\\poimen.db", "C:\\stores\\poimen.db"),
        ];
        for (url, path) in cases {
            assert_eq!(
                StoreUrl::parse(url).expect(url),
                StoreUrl::Sqlite(PathBuf::from(path)),
                "{url}"
            );
        }
    }

    #[test]
    fn other_schemes_are_refused_listing_what_is_accepted() {
        for (url, scheme) in [
            ("mysql://root:hunter2@localhost/poimen", "mysql"),
            ("redis://cache:6379", "redis"),
            ("file:///tmp/poimen.db", "file"),
            ("memory://", "memory"),
        ] {
            let err = StoreUrl::parse(url).expect_err(url);
            match &err {
                StoreError::UnsupportedUrl {
                    scheme: s,
                    accepted,
                    url_redacted,
                } => {
                    assert_eq!(s, scheme);
                    assert!(accepted.iter().any(|a| a.starts_with("postgres://")));
                    assert!(accepted.iter().any(|a| a == "sqlite://PATH"));
                    assert!(!url_redacted.contains("hunter2"), "{url_redacted}");
                }
                other => panic!("{url}: expected UnsupportedUrl, got {other:?}"),
            }
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("`{scheme}://`"))
                    && msg.contains("postgres://")
                    && msg.contains("sqlite://PATH")
                    && msg.contains("plain file path")
                    && !msg.contains("hunter2"),
                "{msg}"
            );
        }
    }

    #[test]
    fn empty_locations_are_refused() {
        for url in ["", "sqlite://"] {
            let err = StoreUrl::parse(url).expect_err(url);
            assert!(matches!(err, StoreError::Open { .. }), "{url}: {err:?}");
        }
    }

    #[test]
    fn passwords_never_show() {
        let cases = [
            (
                "postgres://alice:s3cret@db:5432/poimen",
                "postgres://alice:***@db:5432/poimen",
            ),
            (
                "postgresql://alice:p@ss/w0rd@db/poimen?sslmode=require",
                "postgresql://alice:***@db/poimen?sslmode=require",
            ),
            (
                "postgres://alice@db/poimen?password=s3cret&sslmode=disable",
                "postgres://alice@db/poimen?password=***&sslmode=disable",
            ),
            (
                "postgres://db/poimen?user=a&PASSWORD=s3cret",
                "postgres://db/poimen?user=a&password=***",
            ),
            ("postgres://alice@db/poimen", "postgres://alice@db/poimen"),
            ("postgres://db/poimen", "postgres://db/poimen"),
            (
                "host=db user=alice password=s3cret dbname=poimen",
                "host=db user=alice password=*** dbname=poimen",
            ),
            (
                r"host=db password = 'it\'s s3cret' dbname=poimen",
                "host=db password=*** dbname=poimen",
            ),
            (
                "host=db password='s3 cret' dbname=poimen",
                "host=db password=*** dbname=poimen",
            ),
            ("mypassword=x", "mypassword=x"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
        let u = StoreUrl::parse("postgres://alice:s3cret@db/poimen").expect("parse");
        assert_eq!(u.redacted(), "postgres://alice:***@db/poimen");
        assert!(!format!("{u:?}").contains("s3cret"));
    }
}
