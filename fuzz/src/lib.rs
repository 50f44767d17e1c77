//! What the fuzz targets share: which front end reads an input, the fixed
//! registries the validator resolves against (the repository's registry
//! fixture and a few published sub-workflows, compiled in), and how an
//! arbitrary JSON document becomes stored episode events.
//!
//! Nothing here asserts anything; the properties live in the targets
//! (`fuzz_targets/*.rs`).

use std::sync::OnceLock;

use poimen_workflow::{
    Format, MemoryRegistry, MemoryWorkflows, Registries, ToolInfo, WorkflowDef, parse, version_of,
};
use serde::Deserialize;
use serde_json::Value;

/// The front end an input is meant for: JSON when its first non-blank byte
/// opens an object, YAML otherwise (so fixture files seed both as they are).
pub fn format_of(data: &[u8]) -> Format {
    match data.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Format::Json,
        _ => Format::Yaml,
    }
}

/// The source name given to the front ends, by format.
pub fn source_name(format: Format) -> &'static str {
    match format {
        Format::Json => "fuzz.json",
        Format::Yaml => "fuzz.yaml",
    }
}

#[derive(Deserialize)]
struct RegistryFixture {
    tools: Vec<ToolInfo>,
    verifiers: Vec<ToolInfo>,
    #[serde(default)]
    withheld: std::collections::BTreeMap<String, String>,
}

/// `fixtures/registry/tools.json`: the first-party tools and verifiers.
const REGISTRY: &str = include_str!("../../fixtures/registry/tools.json");

/// Workflows published for `workflow:` steps to resolve against: two valid
/// ones, one that does not validate, a cycle and a chain deeper than the
/// validator's bound.
const PUBLISHED: &[(&str, &str)] = &[
    (
        "support.triage.yaml",
        include_str!("../../fixtures/valid/support.triage.yaml"),
    ),
    (
        "billing.refund_review.yaml",
        include_str!("../../fixtures/valid/billing.refund_review.yaml"),
    ),
    (
        "child.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_invalid/child.yaml"),
    ),
    (
        "b.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_cycle/b.yaml"),
    ),
    (
        "c.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_cycle/c.yaml"),
    ),
    (
        "d1.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d1.yaml"),
    ),
    (
        "d2.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d2.yaml"),
    ),
    (
        "d3.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d3.yaml"),
    ),
    (
        "d4.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d4.yaml"),
    ),
    (
        "d5.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d5.yaml"),
    ),
    (
        "d6.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d6.yaml"),
    ),
    (
        "d7.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d7.yaml"),
    ),
    (
        "d8.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d8.yaml"),
    ),
    (
        "d9.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d9.yaml"),
    ),
    (
        "d10.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d10.yaml"),
    ),
    (
        "d11.yaml",
        include_str!("../../fixtures/invalid/sub_workflow_too_deep/d11.yaml"),
    ),
];

/// The registries every validating target uses, built once.
pub struct Fixed {
    pub tools: MemoryRegistry,
    pub verifiers: MemoryRegistry,
    pub workflows: MemoryWorkflows,
}

impl Fixed {
    pub fn registries(&self) -> Registries<'_> {
        Registries {
            tools: &self.tools,
            verifiers: &self.verifiers,
            workflows: &self.workflows,
        }
    }
}

/// The fixed registries (a fixture that does not load is a broken build,
/// not a finding: it panics on the first input).
pub fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| {
        let f: RegistryFixture =
            serde_json::from_str(REGISTRY).expect("fixtures/registry/tools.json parses");
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
        let mut workflows = MemoryWorkflows::new();
        for (name, text) in PUBLISHED {
            let def: WorkflowDef = parse(text.as_bytes(), Format::Yaml, name)
                .unwrap_or_else(|e| panic!("fixture {name}: {e}"));
            workflows.insert(version_of(&def), def);
        }
        Fixed {
            tools,
            verifiers,
            workflows,
        }
    })
}

/// Stored events from a JSON array of recorded events, each an object with
/// `seq`, `at`, `event` (the kind) and the event's fields, as
/// `Recorded::to_json` writes them. A missing `seq` is the element's index,
/// a missing `at` is 0; the body is the element without `seq` and `at`.
/// `None` when the document is not such an array.
pub fn stored_events(doc: &Value) -> Option<Vec<poimen_store::StoredEvent>> {
    let run = poimen_store::RunId::parse("WFR-01ARZ3NDEKTSV4RRFFQ69G5FAV").ok()?;
    let items = doc.as_array()?;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let mut body = item.as_object()?.clone();
        let seq = match body.remove("seq") {
            Some(v) => v.as_u64()?,
            None => i as u64,
        };
        let at = match body.remove("at") {
            Some(v) => v.as_i64()?,
            None => 0,
        };
        let kind = body
            .get("event")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        out.push(poimen_store::StoredEvent {
            run: run.clone(),
            seq,
            at,
            kind,
            body: Value::Object(body),
        });
    }
    Some(out)
}

/// Parses `data` with one front end and checks what holds of every answer
/// (see `fuzz_targets/frontend_yaml.rs`); the workflow when accepted.
pub fn check_front_end(data: &[u8], format: Format) -> Option<WorkflowDef> {
    match parse(data, format, source_name(format)) {
        Ok(def) => {
            let bytes = poimen_workflow::canonical_bytes(&def);
            let back = poimen_workflow::from_canonical(&bytes)
                .unwrap_or_else(|e| panic!("canonical bytes do not read back: {e}"));
            assert_eq!(
                version_of(&back),
                version_of(&def),
                "canonical bytes read back to another version"
            );
            Some(def)
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an empty error message");
            serde_json::to_value(&e).expect("a parse error encodes as JSON");
            if let Some(line) = e.line {
                // JSON breaks lines at `\n`; YAML also at `\r\n`, a lone
                // `\r`, and (as libyaml reads it) NEL U+0085, LS U+2028
                // and PS U+2029.
                let yaml = format == Format::Yaml;
                let lines = data
                    .iter()
                    .enumerate()
                    .filter(|&(i, &b)| {
                        let before = |k: usize, v: u8| i >= k && data[i - k] == v;
                        b == b'\n'
                            || (yaml && b == b'\r' && data.get(i + 1) != Some(&b'\n'))
                            || (yaml && b == 0x85 && before(1, 0xC2))
                            || (yaml && (b == 0xA8 || b == 0xA9) && before(1, 0x80) && before(2, 0xE2))
                    })
                    .count()
                    + 1;
                assert!(
                    (1..=lines).contains(&line),
                    "error line {line} outside the document's {lines} lines: {e}"
                );
            }
            if let Some(column) = e.column {
                assert!(column >= 1, "error column {column} is not 1-based: {e}");
            }
            None
        }
    }
}

/// Stack of a tokio worker thread, where the host validates workflows and
/// the executor evaluates predicates: a target runs the code under test on
/// a thread this small, so input that recurses too deep for a worker
/// crashes the target as it would crash the host.
pub const WORKER_STACK: usize = 2 * 1024 * 1024;

/// Runs `f` on a thread with [`WORKER_STACK`] bytes of stack. A panic or a
/// stack overflow there aborts the process (libFuzzer's panic hook), which
/// libFuzzer reports as a crash of the current input.
pub fn on_worker_stack<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(WORKER_STACK)
            .spawn_scoped(s, f)
            .expect("spawn a worker thread")
            .join()
            .unwrap_or_else(|_| std::process::abort())
    })
}
