//! Helpers shared by the integration tests: fixture paths, the registry
//! fixture of first-party plugins, and workflows loaded from files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use poimen_workflow::{
    Format, MemoryRegistry, MemoryWorkflows, ToolInfo, WorkflowDef, parse, version_of,
};
use serde::Deserialize;

/// `fixtures/` at the repository root.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// Parses a fixture file (format from its extension).
pub fn load(path: &Path) -> WorkflowDef {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = path.display().to_string();
    let format = Format::from_path(&name).unwrap_or_else(|| panic!("{name}: unknown extension"));
    parse(&bytes, format, &name).unwrap_or_else(|e| panic!("{e}"))
}

#[derive(Deserialize)]
struct RegistryFixture {
    tools: Vec<ToolInfo>,
    verifiers: Vec<ToolInfo>,
    /// Installed but withheld tools: name -> reason.
    #[serde(default)]
    withheld: std::collections::BTreeMap<String, String>,
}

/// The tool and verifier registries of `fixtures/registry/tools.json`.
pub fn registries() -> (MemoryRegistry, MemoryRegistry) {
    let path = fixtures().join("registry/tools.json");
    let text = std::fs::read_to_string(&path).expect("registry fixture");
    let f: RegistryFixture = serde_json::from_str(&text).expect("registry fixture parses");
    let mut tools = MemoryRegistry::new("tools: fixtures/registry/tools.json");
    for t in f.tools {
        tools.insert(t);
    }
    for (name, reason) in f.withheld {
        tools.withhold(name, reason);
    }
    let mut verifiers = MemoryRegistry::new("verifiers: fixtures/registry/tools.json");
    for v in f.verifiers {
        verifiers.insert(v);
    }
    (tools, verifiers)
}

/// Every workflow file in `dir` (non-recursive), published in memory.
pub fn workflows_in(dir: &Path) -> MemoryWorkflows {
    let mut w = MemoryWorkflows::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        if Format::from_path(&f.display().to_string()).is_some() {
            let def = load(&f);
            w.insert(version_of(&def), def);
        }
    }
    w
}
