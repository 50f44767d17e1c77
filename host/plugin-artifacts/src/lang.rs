//! The example plugins written in Python and JavaScript
//! (`examples/plugins/`), built from source by `examples/plugins/build.sh`
//! with the pinned componentize-py and componentize-js (installed under
//! `target/lang-tools` when missing).
//!
//! Built on first use, once per process; a component newer than its
//! sources is not built again. When the build cannot run (no `python3`
//! with pip, no `node` with npm, no network for the first install) the
//! error says what is missing: tests that use these components fail
//! loudly rather than skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The built example components.
#[derive(Debug, Clone)]
pub struct LangPlugins {
    /// Tool `word-count-py` 0.1.0 (Python).
    pub word_count_py: PathBuf,
    /// Verifier `max-words-py` 0.1.0 (Python).
    pub max_words_py: PathBuf,
    /// Tool `word-count-js` 0.1.0 (JavaScript).
    pub word_count_js: PathBuf,
    /// Verifier `contains-js` 0.1.0 (JavaScript).
    pub contains_js: PathBuf,
}

impl LangPlugins {
    /// Every component, with its registry name.
    pub fn all(&self) -> [(&'static str, &Path); 4] {
        [
            ("word-count-py", &self.word_count_py),
            ("max-words-py", &self.max_words_py),
            ("word-count-js", &self.word_count_js),
            ("contains-js", &self.contains_js),
        ]
    }
}

/// The repository root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

/// Builds (when stale) and returns the example components.
pub fn lang_plugins() -> Result<&'static LangPlugins, String> {
    static BUILT: OnceLock<Result<LangPlugins, String>> = OnceLock::new();
    BUILT.get_or_init(build).as_ref().map_err(Clone::clone)
}

fn build() -> Result<LangPlugins, String> {
    let root = root();
    let script = root.join("examples/plugins/build.sh");
    let out = root.join("target/lang-plugins");
    let status = Command::new("bash")
        .arg(&script)
        .arg(&out)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !status.success() {
        return Err(format!(
            "{} failed ({status}); it needs python3 with pip and node with npm, and the network the first time (its output above says which step failed)",
            script.display()
        ));
    }
    let plugins = LangPlugins {
        word_count_py: out.join("word-count-py.wasm"),
        max_words_py: out.join("max-words-py.wasm"),
        word_count_js: out.join("word-count-js.wasm"),
        contains_js: out.join("contains-js.wasm"),
    };
    for (name, path) in plugins.all() {
        if !path.is_file() {
            return Err(format!(
                "{} ran but {name} is not at {}",
                script.display(),
                path.display()
            ));
        }
    }
    Ok(plugins)
}
