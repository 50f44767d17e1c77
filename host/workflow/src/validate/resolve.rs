//! Checks against things outside the workflow text: JSON Schemas (are they
//! schemas?), tools and verifiers (do they resolve in the registries, do
//! static arguments and configurations match their schemas?).
//!
//! Each distinct schema, tool reference and tool version is looked at once
//! per validation, however many steps or sub-workflows use it.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::canonical::jcs;
use crate::capability::{Ineligibility, shadow_eligibility};
use crate::ir::ToolRef;
use crate::registry::{Registries, ToolInfo, Unresolved};

use super::error::SchemaViolation;

/// Keywords whose failures are about which keys an object has, never about
/// the values: still checked when some values are templates.
const STRUCTURAL_KEYWORDS: [&str; 8] = [
    "required",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependencies",
];

type Compiled = Result<Arc<jsonschema::Validator>, String>;

/// Facts about registered tools, by name, then version (looked up without
/// allocating).
type ByVersion<T> = HashMap<String, Vec<(semver::Version, T)>>;

/// A resolved tool or verifier, shared by every use of it.
pub(crate) type Resolved = Result<Arc<ToolInfo>, Unresolved>;

/// Memo of everything resolved during one `validate` call.
pub(crate) struct Resolver<'r> {
    registries: &'r Registries<'r>,
    tools: HashMap<ToolRef, Resolved>,
    verifiers: HashMap<ToolRef, Resolved>,
    /// Schemas by canonical bytes.
    schemas: HashMap<Vec<u8>, Compiled>,
    /// Input schemas of registered tools.
    input_schemas: ByVersion<Option<Compiled>>,
    /// Shadow eligibility of registered tools.
    eligibility: ByVersion<Result<(), Vec<Ineligibility>>>,
}

impl<'r> Resolver<'r> {
    pub(crate) fn new(registries: &'r Registries<'r>) -> Self {
        Resolver {
            registries,
            tools: HashMap::new(),
            verifiers: HashMap::new(),
            schemas: HashMap::new(),
            input_schemas: HashMap::new(),
            eligibility: HashMap::new(),
        }
    }

    pub(crate) fn tool(&mut self, r: &ToolRef) -> Resolved {
        if let Some(x) = self.tools.get(r) {
            return x.clone();
        }
        let x = self.registries.tools.resolve_tool(r).map(Arc::new);
        self.tools.insert(r.clone(), x.clone());
        x
    }

    pub(crate) fn verifier(&mut self, r: &ToolRef) -> Resolved {
        if let Some(x) = self.verifiers.get(r) {
            return x.clone();
        }
        let x = self.registries.verifiers.resolve_verifier(r).map(Arc::new);
        self.verifiers.insert(r.clone(), x.clone());
        x
    }

    /// Compiles a JSON Schema (checking it against its meta-schema).
    /// External `$ref`s are not fetched: a schema must be self-contained.
    pub(crate) fn schema(&mut self, schema: &Value) -> Compiled {
        let mut key = Vec::new();
        jcs::write_value(&mut key, schema);
        if let Some(c) = self.schemas.get(&key) {
            return c.clone();
        }
        let c = jsonschema::validator_for(schema)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        self.schemas.insert(key, c.clone());
        c
    }

    /// The compiled input (or configuration) schema of a registered tool;
    /// `None` when it declares none.
    pub(crate) fn input_schema(&mut self, info: &ToolInfo) -> Option<Compiled> {
        if let Some(c) = by_version(&self.input_schemas, info) {
            return c.clone();
        }
        let c = (!info.input_schema.is_null()).then(|| self.schema(&info.input_schema));
        self.input_schemas
            .entry(info.name.clone())
            .or_default()
            .push((info.version.clone(), c.clone()));
        c
    }

    /// Whether a registered tool may run in shadow evaluation.
    pub(crate) fn eligibility(&mut self, info: &ToolInfo) -> Result<(), Vec<Ineligibility>> {
        if let Some(e) = by_version(&self.eligibility, info) {
            return e.clone();
        }
        let e = shadow_eligibility(&info.capabilities, info.effect);
        self.eligibility
            .entry(info.name.clone())
            .or_default()
            .push((info.version.clone(), e.clone()));
        e
    }
}

fn by_version<'m, T>(
    m: &'m HashMap<String, Vec<(semver::Version, T)>>,
    info: &ToolInfo,
) -> Option<&'m T> {
    m.get(info.name.as_str())?
        .iter()
        .find(|(v, _)| *v == info.version)
        .map(|(_, t)| t)
}

/// Validates `value` against `validator`, ignoring what depends on
/// template strings (their values are only known when the run renders
/// them): a violation is kept if its keyword is structural, or if its
/// location is neither inside nor above a template string.
pub(crate) fn static_violations(
    validator: &jsonschema::Validator,
    value: &Value,
) -> Vec<SchemaViolation> {
    if validator.is_valid(value) {
        return Vec::new();
    }
    let mut templated: Vec<String> = Vec::new();
    template_pointers(value, &mut String::new(), &mut templated);
    let mut out = Vec::new();
    for e in validator.iter_errors(value) {
        let at = e.instance_path().as_str().to_owned();
        let structural = STRUCTURAL_KEYWORDS.contains(&e.kind().keyword());
        let touches_template = templated.iter().any(|t| related(t, &at));
        if structural || !touches_template {
            out.push(SchemaViolation {
                at,
                rule: e.kind().keyword().to_owned(),
                message: e.to_string(),
            });
        }
    }
    out.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.message.cmp(&b.message)));
    out.dedup();
    out
}

/// Whether one JSON Pointer is the other, or an ancestor or descendant of it.
fn related(a: &str, b: &str) -> bool {
    let inside = |x: &str, y: &str| {
        x == y || y.is_empty() || (x.starts_with(y) && x[y.len()..].starts_with('/'))
    };
    inside(a, b) || inside(b, a)
}

/// Whether a string is a template rather than plain text.
pub(crate) fn is_template(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

fn template_pointers(v: &Value, at: &mut String, out: &mut Vec<String>) {
    match v {
        Value::String(s) if is_template(s) => out.push(at.clone()),
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                let len = at.len();
                at.push('/');
                at.push_str(&i.to_string());
                template_pointers(x, at, out);
                at.truncate(len);
            }
        }
        Value::Object(m) => {
            for (k, x) in m {
                let len = at.len();
                at.push('/');
                at.push_str(&k.replace('~', "~0").replace('/', "~1"));
                template_pointers(x, at, out);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn template_values_are_unknowns_but_structure_is_checked() {
        let schema = json!({
            "type": "object",
            "properties": {"op": {"enum": ["upper", "lower"]}, "n": {"type": "integer"}},
            "required": ["op", "text"],
            "additionalProperties": false
        });
        let v = jsonschema::validator_for(&schema).expect("schema");
        let bad = static_violations(
            &v,
            &json!({"op": "shout", "n": "{{ inputs.n }}", "extra": 1}),
        );
        let at: Vec<&str> = bad.iter().map(|x| x.at.as_str()).collect();
        assert!(at.contains(&"/op"), "{bad:?}");
        assert!(!at.contains(&"/n"), "{bad:?}");
        assert_eq!(bad.iter().filter(|x| x.at.is_empty()).count(), 2, "{bad:?}");
    }

    #[test]
    fn external_refs_and_bad_keywords_are_not_schemas() {
        assert!(jsonschema::validator_for(&json!({"type": "nonsense"})).is_err());
        assert!(jsonschema::validator_for(&json!({"$ref": "https://example.com/s.json"})).is_err());
        assert!(jsonschema::validator_for(&json!({"$ref": "file:///etc/passwd"})).is_err());
        assert!(jsonschema::validator_for(&json!({"type": "object"})).is_ok());
    }
}
