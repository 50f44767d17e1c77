//! The open seams of [`crate::HostBuilder`]: what an embedder may hand the
//! host instead of poimen's defaults (a model provider, a clock, a policy
//! built in code, call limits, plugins by bytes or path), and
//! [`PluginSource`], how a plugin is named when it is given.
//!
//! This module only holds what was given; `host.rs` builds the host from
//! it. It knows nothing of how a plugin is checked or loaded (the sandbox
//! does that, the same way for every source).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use poimen_executor::{Clock, ModelProvider};
use poimen_sandbox::CallLimits;
use poimen_sandbox::policy::Policy;

use crate::error::Error;

/// A component given to the host: its bytes with a name for messages, or a
/// `.wasm` file read when it is loaded.
#[derive(Clone)]
pub enum PluginSource {
    /// Component bytes; `origin` names it in errors and listings.
    Bytes { origin: String, bytes: Arc<[u8]> },
    /// A component file.
    File(PathBuf),
}

impl PluginSource {
    /// Component bytes named `origin` (e.g. `billing:refund-tool`).
    pub fn bytes(origin: impl Into<String>, bytes: impl Into<Vec<u8>>) -> PluginSource {
        PluginSource::Bytes {
            origin: origin.into(),
            bytes: Arc::from(bytes.into()),
        }
    }

    /// A component file.
    pub fn file(path: impl Into<PathBuf>) -> PluginSource {
        PluginSource::File(path.into())
    }

    /// Its origin and bytes (a file is read now).
    pub(crate) fn read(&self) -> Result<(String, Vec<u8>), Error> {
        match self {
            PluginSource::Bytes { origin, bytes } => Ok((origin.clone(), bytes.to_vec())),
            PluginSource::File(path) => std::fs::read(path)
                .map(|b| (path.display().to_string(), b))
                .map_err(|source| Error::Read {
                    path: path.clone(),
                    source,
                }),
        }
    }
}

impl std::fmt::Debug for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Components are megabytes: show where they came from.
        match self {
            PluginSource::Bytes { origin, bytes } => f
                .debug_struct("Bytes")
                .field("origin", origin)
                .field("len", &bytes.len())
                .finish(),
            PluginSource::File(p) => f.debug_tuple("File").field(p).finish(),
        }
    }
}

impl From<Vec<u8>> for PluginSource {
    fn from(bytes: Vec<u8>) -> PluginSource {
        PluginSource::bytes("component given by the embedder", bytes)
    }
}

impl From<&'static [u8]> for PluginSource {
    fn from(bytes: &'static [u8]) -> PluginSource {
        PluginSource::bytes("component given by the embedder", bytes.to_vec())
    }
}

impl From<PathBuf> for PluginSource {
    fn from(path: PathBuf) -> PluginSource {
        PluginSource::File(path)
    }
}

impl From<&Path> for PluginSource {
    fn from(path: &Path) -> PluginSource {
        PluginSource::File(path.to_owned())
    }
}

/// An embedder's implementation of a trait, shared; shown by its kind only
/// (the traits do not require `Debug`).
pub(crate) struct Shared<T: ?Sized>(pub Arc<T>);

impl<T: ?Sized> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T: ?Sized> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(std::any::type_name::<T>())
    }
}

/// What the embedder gave instead of the defaults.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seams {
    pub models: Option<Shared<dyn ModelProvider>>,
    pub clock: Option<Shared<dyn Clock>>,
    pub policy: Option<Policy>,
    pub limits: Option<CallLimits>,
    pub plugins: Vec<PluginSource>,
    /// Commits the event channel holds for its slowest subscriber.
    pub event_buffer: Option<usize>,
    /// `Some(false)`: no metrics are kept.
    pub metrics: Option<bool>,
    /// Continues a recorded starter's trace in a run's span.
    pub trace_parent: Option<poimen_executor::TraceParent>,
}
