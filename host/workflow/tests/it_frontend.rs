//! Front ends: every kind of bad document is refused with its own typed
//! error and, where there is one, the file, line and column; YAML and JSON
//! read the same documents into the same IR; the emitted JSON Schema
//! accepts the fixtures and rejects what the parser rejects.

mod common;

use std::time::{Duration, Instant};

use common::*;
use poimen_workflow::frontend::{MAX_ALIAS_EXPANSION, MAX_DOCUMENT_BYTES, MAX_NESTING_DEPTH};
use poimen_workflow::*;

fn err(src: &[u8], format: Format) -> ParseError {
    match parse(src, format, "wf.src") {
        Ok(def) => panic!("parsed: {def:?}"),
        Err(e) => e,
    }
}

fn pos(e: &ParseError) -> (Option<usize>, Option<usize>) {
    (e.line, e.column)
}

#[test]
fn frontend_yaml_syntax_error_has_a_position() {
    let e = err(
        b"id: w\nsteps:\n  - id: a\n    model: {prompt: [unclosed\n",
        Format::Yaml,
    );
    assert!(matches!(e.kind, ParseErrorKind::Syntax { .. }), "{e}");
    assert_eq!(e.line, Some(5), "{e}");
    assert!(e.to_string().starts_with("wf.src:5:"), "{e}");
    let e = err(b"{\"id\": \"w\", \"steps\": [}", Format::Json);
    assert!(matches!(e.kind, ParseErrorKind::Syntax { .. }), "{e}");
    assert_eq!(pos(&e), (Some(1), Some(23)));
}

#[test]
fn frontend_unknown_field_names_it_lists_the_allowed_and_suggests_the_nearest() {
    let yaml = b"id: w\nsteps:\n  - id: a\n    model:\n      prompt: hi\n      efort: low\n";
    let json = br#"{"id": "w", "steps": [{"id": "a", "model": {"prompt": "hi", "efort": "low"}}]}"#;
    for (src, format, at) in [
        (&yaml[..], Format::Yaml, (Some(6), Some(7))),
        (&json[..], Format::Json, (Some(1), Some(67))),
    ] {
        let e = err(src, format);
        let ParseErrorKind::UnknownField {
            field,
            allowed,
            suggestion,
        } = &e.kind
        else {
            panic!("{e}")
        };
        assert_eq!(field, "efort");
        assert_eq!(
            allowed,
            &["prompt", "system", "effort", "format", "schema", "model"]
        );
        assert_eq!(suggestion.as_deref(), Some("effort"));
        assert_eq!(e.path.as_deref(), Some("steps[0].model.efort"));
        assert_eq!(pos(&e), at, "{format}: {e}");
    }
    // At the top level and in a step, too (deny_unknown_fields is not lost
    // to the kind keys).
    let e = err(b"id: w\nstep: []\n", Format::Yaml);
    assert!(
        matches!(&e.kind, ParseErrorKind::UnknownField { field, suggestion: Some(s), .. } if field == "step" && s == "steps"),
        "{e}"
    );
    let e = err(
        b"id: w\nsteps:\n  - id: a\n    model: {prompt: hi}\n    retries: 3\n",
        Format::Yaml,
    );
    assert!(
        matches!(&e.kind, ParseErrorKind::UnknownField { field, suggestion: Some(s), .. } if field == "retries" && s == "retry"),
        "{e}"
    );
    assert_eq!(pos(&e), (Some(5), Some(5)));
}

#[test]
fn frontend_duplicate_keys_are_refused_in_yaml_and_in_json() {
    let e = err(b"id: w\nsteps: []\nid: x\n", Format::Yaml);
    assert!(
        matches!(&e.kind, ParseErrorKind::DuplicateKey { key } if key == "id"),
        "{e}"
    );
    assert_eq!(pos(&e), (Some(3), Some(1)));
    // serde_json alone would silently keep the last value.
    let e = err(
        br#"{"id": "w", "steps": [], "state": {"a": {}, "a": {"reducer": "append"}}}"#,
        Format::Json,
    );
    assert!(
        matches!(&e.kind, ParseErrorKind::DuplicateKey { key } if key == "a"),
        "{e}"
    );
    assert_eq!(e.line, Some(1));
    // Inside free JSON (arguments) as well.
    let e = err(
        b"id: w\nsteps:\n  - id: a\n    tool: {name: text, args: {x: 1, x: 2}}\n",
        Format::Yaml,
    );
    assert!(
        matches!(&e.kind, ParseErrorKind::DuplicateKey { key } if key == "x"),
        "{e}"
    );
    assert_eq!(e.line, Some(4));
}

#[test]
fn frontend_billion_laughs_is_refused_quickly() {
    let mut doc = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for w in names.windows(2) {
        let refs = vec![format!("*{}", w[0]); 9].join(",");
        doc.push_str(&format!("{}: &{} [{refs}]\n", w[1], w[1]));
    }
    let start = Instant::now();
    let e = err(doc.as_bytes(), Format::Yaml);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        matches!(e.kind, ParseErrorKind::AliasExpansion { .. }),
        "{e}"
    );
    // Modest alias use is fine.
    let ok = b"id: w\nsteps:\n  - id: a\n    tool: {name: text, args: &args {op: count, pattern: x, text: y}}\n  - id: b\n    tool: {name: text, args: *args}\n";
    assert!(parse(ok, Format::Yaml, "ok").is_ok());
    // The bound is relative to the document size, plus this many nodes.
    const { assert!(MAX_ALIAS_EXPANSION > 0) };
}

#[test]
fn frontend_non_utf8_empty_and_oversized_files() {
    let e = err(b"id: w\nsteps:\n  - id: caf\xe9\n", Format::Yaml);
    assert!(
        matches!(e.kind, ParseErrorKind::NotUtf8 { offset: 24 }),
        "{e}"
    );
    assert_eq!(pos(&e), (Some(3), Some(12)));
    for (src, format) in [
        (&b""[..], Format::Yaml),
        (b"  \n\t\n", Format::Json),
        (b"# nothing here\n---\n", Format::Yaml),
    ] {
        assert!(
            matches!(err(src, format).kind, ParseErrorKind::Empty),
            "{src:?}"
        );
    }
    let big = vec![b' '; MAX_DOCUMENT_BYTES + 1];
    let start = Instant::now();
    let e = err(&big, Format::Json);
    assert!(
        matches!(e.kind, ParseErrorKind::TooLarge { size, limit } if size == MAX_DOCUMENT_BYTES + 1 && limit == MAX_DOCUMENT_BYTES)
    );
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "refused before parsing"
    );
}

#[test]
fn frontend_wrong_types_and_missing_fields() {
    let e = err(
        b"id: w\nsteps:\n  - id: a\n    model: {prompt: hi}\n    retry: {max_attempts: many}\n",
        Format::Yaml,
    );
    let ParseErrorKind::WrongType { expected, found } = &e.kind else {
        panic!("{e}")
    };
    assert_eq!(
        (expected.as_str(), found.as_str()),
        ("u32", "string \"many\"")
    );
    assert_eq!(e.path.as_deref(), Some("steps[0].retry.max_attempts"));
    assert_eq!(pos(&e), (Some(5), Some(27)));
    let e = err(br#"{"id": "w", "steps": {"id": "a"}}"#, Format::Json);
    assert!(
        matches!(&e.kind, ParseErrorKind::WrongType { expected, found } if expected == "a sequence" && found == "map"),
        "{e}"
    );
    let e = err(b"steps: []\n", Format::Yaml);
    assert!(
        matches!(&e.kind, ParseErrorKind::MissingField { field } if field == "id"),
        "{e}"
    );
    let e = err(
        b"id: w\nsteps:\n  - id: a\n    model: {system: hi}\n",
        Format::Yaml,
    );
    assert!(
        matches!(&e.kind, ParseErrorKind::MissingField { field } if field == "prompt"),
        "{e}"
    );
    assert_eq!(e.path.as_deref(), Some("steps[0].model"));
    let e = err(
        b"id: w\nsteps:\n  - id: a\n    model: {prompt: hi}\n    timeout: 5 weeks\n",
        Format::Yaml,
    );
    assert!(
        matches!(&e.kind, ParseErrorKind::InvalidValue { message } if message.contains("weeks")),
        "{e}"
    );
    let e = err(b"id: w\npriority: urgnt\nsteps: []\n", Format::Yaml);
    assert!(
        matches!(&e.kind, ParseErrorKind::UnknownVariant { variant, allowed, .. } if variant == "urgnt" && allowed.len() == 3),
        "{e}"
    );
}

#[test]
fn frontend_a_step_has_exactly_one_kind() {
    let e = err(
        b"id: w\nsteps:\n  - id: a\n    model: {prompt: hi}\n    tool: {name: text}\n",
        Format::Yaml,
    );
    assert!(
        matches!(&e.kind, ParseErrorKind::StepKind { step, found } if step == "a" && found == &["model", "tool"]),
        "{e}"
    );
    assert_eq!(e.path.as_deref(), Some("steps[0]"));
    assert_eq!(e.line, Some(3));
    let e = err(b"id: w\nsteps:\n  - id: a\n    timeout: 1s\n", Format::Yaml);
    assert!(
        matches!(&e.kind, ParseErrorKind::StepKind { found, .. } if found.is_empty()),
        "{e}"
    );
}

#[test]
fn frontend_format_quirks_are_refused() {
    type Case<'a> = (&'a [u8], fn(&ParseErrorKind) -> bool);
    let cases: [Case<'_>; 7] = [
        (b"id: w\nsteps: []\n---\nid: x\nsteps: []\n", |k| {
            matches!(k, ParseErrorKind::MultipleDocuments)
        }),
        (b"id: !custom w\nsteps: []\n", |k| {
            matches!(k, ParseErrorKind::UnsupportedYaml { .. })
        }),
        (b"base: &b {id: w}\n<<: *b\nsteps: []\n", |k| {
            matches!(k, ParseErrorKind::UnsupportedYaml { .. })
        }),
        (b"id: w\nsteps: []\nstate: {1: {}}\n", |k| {
            matches!(k, ParseErrorKind::NonStringKey { .. })
        }),
        (
            b"id: w\nsteps: []\nbudget: {tokens: 9007199254740993}\n",
            |k| matches!(k, ParseErrorKind::NumberOutOfRange { .. }),
        ),
        (b"id: w\nsteps: []\nrubric: {threshold: .inf}\n", |k| {
            matches!(k, ParseErrorKind::NumberOutOfRange { .. })
        }),
        // A float the canonical form would write as an integer past 2^53.
        (
            b"id: w\nsteps: []\nrubric: {threshold: 09007199254740992.5}\n",
            |k| matches!(k, ParseErrorKind::NumberOutOfRange { .. }),
        ),
    ];
    for (src, want) in cases {
        let e = err(src, Format::Yaml);
        assert!(want(&e.kind), "{}: {e}", String::from_utf8_lossy(src));
    }
    let mut deep = String::from("id: w\nsteps: []\ninputs: ");
    deep.push_str(&"[".repeat(MAX_NESTING_DEPTH + 2));
    deep.push_str(&"]".repeat(MAX_NESTING_DEPTH + 2));
    assert!(matches!(
        err(deep.as_bytes(), Format::Yaml).kind,
        ParseErrorKind::TooDeep { .. }
    ));
    assert!(matches!(
        err(
            deep.replace("inputs: ", "\"inputs\": ").as_bytes(),
            Format::Yaml
        )
        .kind,
        ParseErrorKind::TooDeep { .. }
    ));
}

#[test]
fn frontend_errors_render_as_json_for_tools() {
    let e = err(b"id: w\nstep: []\n", Format::Yaml);
    let v = serde_json::to_value(&e).expect("json");
    assert_eq!(v["kind"]["code"], "unknown_field");
    assert_eq!(v["line"], 2);
    assert_eq!(v["source_name"], "wf.src");
}

#[test]
fn frontend_json_schema_accepts_the_fixtures_and_rejects_unknown_fields() {
    let schema = json_schema();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    let validator = jsonschema::validator_for(&schema).expect("the emitted schema is a schema");
    let mut files = Vec::new();
    for dir in [
        "valid",
        "canonical",
        "canonical/must_match",
        "canonical/must_differ",
    ] {
        for e in std::fs::read_dir(fixtures().join(dir)).expect("dir") {
            let p = e.expect("entry").path();
            if p.is_file() {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 20);
    for p in files {
        let text = std::fs::read_to_string(&p).expect("read");
        let doc: serde_json::Value = serde_norway::from_str(&text).expect("yaml");
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", p.display());
    }
    let bad = serde_json::json!({"id": "w", "steps": [{"id": "a", "model": {"prompt": "x"}, "tool": {"name": "t"}}]});
    assert!(!validator.is_valid(&bad), "two kinds in one step");
    let bad = serde_json::json!({"id": "w", "steps": [], "stpes": []});
    assert!(!validator.is_valid(&bad), "unknown top-level field");
}

#[test]
fn frontend_serde_deserialize_of_the_ir_goes_through_the_strict_document_shape() {
    let ok = serde_json::json!({"id": "w", "steps": [{"id": "a", "model": {"prompt": "hi"}}]});
    let def: WorkflowDef = serde_json::from_value(ok).expect("a workflow");
    assert_eq!(
        def,
        parse(
            br#"{"id": "w", "steps": [{"id": "a", "model": {"prompt": "hi"}}]}"#,
            Format::Json,
            "x"
        )
        .expect("parses")
    );
    let unknown = serde_json::json!({"id": "w", "steps": [{"id": "a", "model": {"prompt": "hi"}, "retries": 2}]});
    assert!(
        serde_json::from_value::<WorkflowDef>(unknown).is_err(),
        "flatten must not swallow unknown fields"
    );
    let two_kinds = serde_json::json!({"id": "w", "steps": [{"id": "a", "model": {"prompt": "hi"}, "tool": {"name": "t"}}]});
    assert!(serde_json::from_value::<WorkflowDef>(two_kinds).is_err());
}

/// Inputs the fuzz targets found (`fixtures/fuzz/frontend/`, format from the
/// extension): each parses without panicking, and an error's line and
/// column lie within the document (1-based, at most one past its last line
/// when the document ends with a line break).
#[test]
fn frontend_fuzz_regressions() {
    let dir = fixtures().join("fuzz/frontend");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures/fuzz/frontend")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no regression inputs in {}",
        dir.display()
    );
    for path in files {
        let name = path.display().to_string();
        let format = Format::from_path(&name).unwrap_or_else(|| panic!("{name}: extension"));
        let src = std::fs::read(&path).expect("input");
        let Err(e) = parse(&src, format, &name) else {
            continue;
        };
        // JSON breaks lines at `\n`; YAML also at `\r\n` and a lone `\r`.
        let lines = src
            .iter()
            .enumerate()
            .filter(|&(i, &b)| {
                b == b'\n'
                    || (format == Format::Yaml && b == b'\r' && src.get(i + 1) != Some(&b'\n'))
            })
            .count()
            + 1;
        let line = e.line.unwrap_or(1);
        assert!(
            (1..=lines).contains(&line),
            "{name}: line past the end: {e}"
        );
        assert!(
            e.column.unwrap_or(1) >= 1,
            "{name}: column not 1-based: {e}"
        );
    }
    // A YAML error at the end of a document without a final line break is
    // placed at that end, not on a line after it.
    let e = err(b"id: w\nsteps: {a: 1", Format::Yaml);
    assert_eq!(pos(&e), (Some(2), Some(13)), "{e}");
    let e = err(b"id: w\rsteps: {a: 1", Format::Yaml);
    assert_eq!(pos(&e), (Some(2), Some(13)), "{e}");
}
