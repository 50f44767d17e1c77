//! Plugins at run time: [`Host::load_plugin`], [`Host::replace_plugin`],
//! [`Host::remove_plugin`].
//!
//! A plugin loaded into a running host is checked exactly as one loaded at
//! start — its imports against its declared capabilities, those against
//! the policy, its name against the reserved ones — by the same sandbox
//! code. Runs pin the components they can reach when they start and call
//! them by digest, so a replaced component keeps serving the runs that
//! started on it (the sandbox retires it instead of dropping it), and a
//! removed one fails only a run that reaches it, naming it. After any
//! change the loader forgets the versions it validated: a new run is
//! validated against what is loaded now.

use crate::builder::PluginSource;
use crate::error::Error;
use crate::host::Host;
use poimen_sandbox::{Entry, Replacement};

impl Host {
    /// Loads a plugin into the running host (checked as at start); new runs
    /// may use it at once. Loading the very component again is a no-op; a
    /// different one under a loaded name and version is refused
    /// ([`poimen_sandbox::LoadError::Conflict`]) — replace it instead.
    pub async fn load_plugin(&self, plugin: impl Into<PluginSource>) -> Result<Entry, Error> {
        let (origin, bytes) = plugin.into().read()?;
        let entry = self.inner.sandbox().load_component(origin, bytes).await?;
        self.inner.wiring.loader.forget();
        Ok(entry)
    }

    /// Loads a plugin in place of the loaded ones of its kind and name
    /// (checked as at start). New runs resolve to it; runs that started on
    /// a replaced one keep calling the component they pinned.
    pub async fn replace_plugin(
        &self,
        plugin: impl Into<PluginSource>,
    ) -> Result<Replacement, Error> {
        let (origin, bytes) = plugin.into().read()?;
        let replaced = self
            .inner
            .sandbox()
            .replace_component(origin, bytes)
            .await?;
        self.inner.wiring.loader.forget();
        Ok(replaced)
    }

    /// Unloads a plugin (every version, or `version`). A new run of a
    /// workflow that uses it is refused at start, naming it; a run that
    /// pinned it fails at the step that reaches it, naming it and its
    /// digest, and a run that never reaches it is unaffected.
    pub fn remove_plugin(
        &self,
        name: &str,
        version: Option<&semver::Version>,
    ) -> Result<Vec<Entry>, Error> {
        let removed = self.inner.sandbox().remove_component(name, version)?;
        self.inner.wiring.loader.forget();
        Ok(removed)
    }
}
