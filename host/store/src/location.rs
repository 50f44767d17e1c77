//! Where the embedded store lives: a pure function of the values the CLI
//! gathered (an explicit `--store`, the `POIMEN_HOME` value, the working
//! directory).
//!
//! This module deliberately reads no environment variable and touches no
//! file: the caller reads them, so the rule is testable and the library never
//! depends on ambient state.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// File name of the store inside `POIMEN_HOME` or `.poimen/`.
pub const STORE_FILE: &str = "poimen.db";

/// Directory created in the working directory when nothing else is given.
pub const LOCAL_DIR: &str = ".poimen";

/// Which input decided the store's location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationSource {
    /// `--store PATH`.
    Explicit,
    /// `<POIMEN_HOME>/poimen.db`.
    PoimenHome,
    /// `<cwd>/.poimen/poimen.db`.
    WorkingDirectory,
}

/// A resolved store path and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLocation {
    pub path: PathBuf,
    pub source: LocationSource,
}

impl StoreLocation {
    /// The store file: `explicit` if given, else `<poimen_home>/poimen.db`,
    /// else `<cwd>/.poimen/poimen.db`. Relative paths are taken relative to
    /// `cwd`. An empty `POIMEN_HOME` counts as unset (as shells make it easy
    /// to export one by accident).
    pub fn resolve(explicit: Option<&Path>, poimen_home: Option<&OsStr>, cwd: &Path) -> Self {
        if let Some(p) = explicit {
            return StoreLocation {
                path: cwd.join(p),
                source: LocationSource::Explicit,
            };
        }
        if let Some(home) = poimen_home.filter(|h| !h.is_empty()) {
            return StoreLocation {
                path: cwd.join(home).join(STORE_FILE),
                source: LocationSource::PoimenHome,
            };
        }
        StoreLocation {
            path: cwd.join(LOCAL_DIR).join(STORE_FILE),
            source: LocationSource::WorkingDirectory,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_explicit_then_home_then_cwd() {
        let cwd = Path::new("/w");
        let r = StoreLocation::resolve(Some(Path::new("s.db")), Some(OsStr::new("/h")), cwd);
        assert_eq!(r.path, PathBuf::from("/w/s.db"));
        assert_eq!(r.source, LocationSource::Explicit);
        let r = StoreLocation::resolve(Some(Path::new("/abs/s.db")), None, cwd);
        assert_eq!(r.path, PathBuf::from("/abs/s.db"));
        let r = StoreLocation::resolve(None, Some(OsStr::new("/h")), cwd);
        assert_eq!(r.path, PathBuf::from("/h/poimen.db"));
        assert_eq!(r.source, LocationSource::PoimenHome);
        let r = StoreLocation::resolve(None, Some(OsStr::new("rel")), cwd);
        assert_eq!(r.path, PathBuf::from("/w/rel/poimen.db"));
        let r = StoreLocation::resolve(None, Some(OsStr::new("")), cwd);
        assert_eq!(r.path, PathBuf::from("/w/.poimen/poimen.db"));
        assert_eq!(r.source, LocationSource::WorkingDirectory);
        let r = StoreLocation::resolve(None, None, cwd);
        assert_eq!(r.path, PathBuf::from("/w/.poimen/poimen.db"));
    }
}
