//! One test per component, named after it: each first-party plugin
//! round-trips through the host; each adversarial one is contained with its
//! own error, and the same host serves the next call.

use std::time::Duration;

use poimen_sandbox::{
    InvokeError, LimitOverrides, LoadError, PluginHost, Policy, ToolError, ToolRequest,
    VerifierRequest,
};
use serde_json::json;

use crate::support::{self, SECRET, bytes, call, error, still_healthy, tool, world, world_with};

// The hostile components' tests live with the other attacks on what the
// host holds.
pub(crate) use crate::hostile::{adv_hog, adv_http_hog};

#[tokio::test]
pub(crate) async fn json() {
    let w = world().await;
    let r = call(
        &w.host,
        "json",
        json!({"value": {"a": [{"b": 1}, {"b": 2}]}, "select": "/a/1/b"}),
    )
    .await;
    assert_eq!(r.outcome, Ok(json!(2)));
    let r = call(
        &w.host,
        "json",
        json!({"value": {"a": {"b": 1}}, "reshape": {"x": "/a/b", "y": "/zz"}}),
    )
    .await;
    assert_eq!(r.outcome, Ok(json!({"x": 1, "y": null})));
    let r = call(&w.host, "json", json!({"value": {}, "select": "/missing"})).await;
    assert!(matches!(error(&r), InvokeError::Tool(ToolError::Failed(m)) if m.contains("/missing")));
    let r = call(&w.host, "json", json!({"value": {}, "select": "no-slash"})).await;
    assert!(matches!(
        error(&r),
        InvokeError::Tool(ToolError::InvalidInput(_))
    ));
}

#[tokio::test]
pub(crate) async fn text() {
    let w = world().await;
    let t = "a1 b22 c333";
    let r = call(
        &w.host,
        "text",
        json!({"op": "find", "pattern": "b\\d+", "text": t}),
    )
    .await;
    assert_eq!(
        r.outcome,
        Ok(json!({"matches": [{"start": 3, "end": 6, "text": "b22"}]}))
    );
    let r = call(
        &w.host,
        "text",
        json!({"op": "extract", "pattern": "(?<l>[a-z])(\\d+)", "text": "x9"}),
    )
    .await;
    assert_eq!(
        r.outcome,
        Ok(json!({"captures": [{"0": "x9", "l": "x", "2": "9"}]}))
    );
    let r = call(
        &w.host,
        "text",
        json!({"op": "replace", "pattern": "\\d", "text": t, "replacement": "#"}),
    )
    .await;
    assert_eq!(r.outcome, Ok(json!({"text": "a# b## c###", "replaced": 6})));
    let r = call(
        &w.host,
        "text",
        json!({"op": "count", "pattern": "\\d+", "text": t}),
    )
    .await;
    assert_eq!(r.outcome, Ok(json!({"count": 3})));
    let r = call(
        &w.host,
        "text",
        json!({"op": "count", "pattern": "(", "text": ""}),
    )
    .await;
    assert!(
        matches!(error(&r), InvokeError::Tool(ToolError::InvalidInput(m)) if m.contains("bad pattern"))
    );
    let r = call(
        &w.host,
        "text",
        json!({"op": "shout", "pattern": "", "text": ""}),
    )
    .await;
    assert!(matches!(
        error(&r),
        InvokeError::Tool(ToolError::InvalidInput(_))
    ));
}

#[tokio::test]
pub(crate) async fn fs_read() {
    let w = world().await;
    // Inside the grant: a file, a relative path, a directory.
    let r = call(&w.host, "fs-read", json!({"path": "/data/notes.txt"})).await;
    assert_eq!(
        r.outcome,
        Ok(json!({"path": "/data/notes.txt", "content": "inside the grant\n"}))
    );
    let r = call(&w.host, "fs-read", json!({"path": "sub/inner.txt"})).await;
    assert_eq!(
        r.outcome.as_ref().map(|v| v["content"].clone()),
        Ok(json!("deeper\n"))
    );
    let r = call(&w.host, "fs-read", json!({"path": "/data"})).await;
    assert_eq!(
        r.outcome.as_ref().map(|v| v["entries"].clone()),
        Ok(json!(["link-file", "link-out", "notes.txt", "sub"]))
    );
    // Every open is recorded with its guest path.
    assert!(
        r.record
            .host_calls
            .iter()
            .any(|c| c.function == "[method]descriptor.open-at" && c.args.starts_with("/data ")),
        "{:#?}",
        r.record.host_calls
    );

    // Outside the grant: `..`, a symlink to a directory outside, a symlink
    // to a file outside. The host refuses; the invocation fails with the
    // refusal, whatever the guest made of it.
    for path in [
        "/data/../secret.txt",
        "/data/sub/../../secret.txt",
        "/data/link-out/secret.txt",
        "/data/link-file",
    ] {
        let r = call(&w.host, "fs-read", json!({ "path": path })).await;
        match error(&r) {
            InvokeError::CapabilityDenied {
                component,
                capability,
                ..
            } => {
                assert_eq!(component, "fs-read");
                assert_eq!(capability, "fs-read:/data", "{path}");
            }
            other => panic!("{path}: expected CapabilityDenied, got {other:?}"),
        }
        assert!(!r.record.refusals.is_empty(), "{path}");
        assert!(
            !format!("{r:?}").contains(SECRET),
            "{path} leaked the secret"
        );
    }
    // An absolute path outside every mount never reaches the host: the
    // guest's C library has no preopen for it.
    let r = call(&w.host, "fs-read", json!({"path": "/etc/hostname"})).await;
    assert!(
        matches!(error(&r), InvokeError::Tool(ToolError::Failed(_))),
        "{:?}",
        r.outcome
    );
    still_healthy(&w.host).await;
}

fn ledger_lines(w: &support::World) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(w.ledger.join("ledger.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[tokio::test]
pub(crate) async fn ledger() {
    let w = world().await;
    let append = |key: &str| ToolRequest::new(tool("ledger"), json!({"entry": {"paid": 5}}), key);
    let first = w.host.invoke_tool(append("k1")).await;
    assert_eq!(first.outcome, Ok(json!({"appended": true, "lines": 1})));
    // Non-idempotent: the same key appends again.
    let again = w.host.invoke_tool(append("k1")).await;
    assert_eq!(again.outcome, Ok(json!({"appended": true, "lines": 2})));
    assert_eq!(
        ledger_lines(&w),
        [
            json!({"key": "k1", "entry": {"paid": 5}}),
            json!({"key": "k1", "entry": {"paid": 5}})
        ]
    );
    // The write is in the record, under the fs-write grant.
    assert_eq!(
        first.record.capabilities[0].capability.to_string(),
        "fs-write:/ledger"
    );
    assert!(
        first
            .record
            .host_calls
            .iter()
            .any(|c| c.args.starts_with("/ledger/ledger.jsonl") && c.result == "ok")
    );
    let bad = w
        .host
        .invoke_tool(ToolRequest::new(
            tool("ledger"),
            json!({"file": "../x", "entry": 1}),
            "k2",
        ))
        .await;
    assert!(matches!(
        error(&bad),
        InvokeError::Tool(ToolError::InvalidInput(_))
    ));
}

#[tokio::test]
pub(crate) async fn ledger_idempotent() {
    let w = world().await;
    let append =
        |key: &str| ToolRequest::new(tool("ledger-idempotent"), json!({"entry": "x"}), key);
    assert_eq!(
        w.host.invoke_tool(append("k1")).await.outcome,
        Ok(json!({"appended": true, "lines": 1}))
    );
    // The same key again: at most once.
    assert_eq!(
        w.host.invoke_tool(append("k1")).await.outcome,
        Ok(json!({"appended": false, "lines": 1}))
    );
    assert_eq!(
        w.host.invoke_tool(append("k2")).await.outcome,
        Ok(json!({"appended": true, "lines": 2}))
    );
    let keys: Vec<_> = ledger_lines(&w).iter().map(|l| l["key"].clone()).collect();
    assert_eq!(keys, [json!("k1"), json!("k2")]);
}

#[tokio::test]
pub(crate) async fn http_get() {
    let w = world().await;
    let url = format!("http://127.0.0.1:{}/hello?x=1", w.server.port);
    let r = call(&w.host, "http-get", json!({ "url": url })).await;
    let out = r.outcome.as_ref().expect("allowed");
    assert_eq!(out["status"], 200);
    assert_eq!(out["body"], "hello");
    assert_eq!(r.record.host_calls.len(), 1);
    assert_eq!(r.record.host_calls[0].args, format!("GET {url}"));
    assert_eq!(r.record.host_calls[0].result, "ok: 200");
    let served = w.server.accepted();
    assert_eq!(served, 1);

    // Any other host, or another port on the same host, is refused before a
    // connection is made.
    let other = support::Server::start().await;
    for url in [
        format!("http://127.0.0.1:{}/", other.port),
        "http://example.com/".to_owned(),
        "https://127.0.0.1/".to_owned(),
    ] {
        let r = call(&w.host, "http-get", json!({ "url": url })).await;
        match error(&r) {
            InvokeError::CapabilityDenied {
                capability,
                attempted,
                ..
            } => {
                assert_eq!(capability, "http");
                assert!(
                    attempted.contains(url.trim_end_matches('/')),
                    "{attempted} vs {url}"
                );
            }
            e => panic!("{url}: expected CapabilityDenied, got {e:?}"),
        }
        assert!(
            r.record.host_calls[0].result.starts_with("refused:"),
            "{:?}",
            r.record.host_calls
        );
    }
    assert_eq!(other.accepted(), 0);
    assert_eq!(w.server.accepted(), served);
    still_healthy(&w.host).await;
}

async fn verify(
    host: &PluginHost,
    name: &str,
    output: serde_json::Value,
    config: serde_json::Value,
) -> poimen_sandbox::VerifierInvocation {
    host.invoke_verifier(VerifierRequest::new(
        tool(name),
        json!({"q": 1}),
        output,
        config,
    ))
    .await
}

#[tokio::test]
pub(crate) async fn json_schema() {
    let w = world().await;
    let schema = json!({"schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}});
    let ok = verify(&w.host, "json-schema", json!({"n": 1}), schema.clone()).await;
    let v = ok.outcome.expect("verdict");
    assert!(v.pass);
    assert_eq!(v.score, 1.0);
    let bad = verify(&w.host, "json-schema", json!({"n": "one"}), schema)
        .await
        .outcome
        .expect("verdict");
    assert!(!bad.pass);
    assert!(bad.reason.contains("/n"), "{}", bad.reason);
    let r = verify(
        &w.host,
        "json-schema",
        json!(1),
        json!({"schema": {"type": 12}}),
    )
    .await;
    assert!(matches!(
        r.outcome,
        Err(InvokeError::Tool(ToolError::InvalidInput(_)))
    ));
    assert_eq!(r.record.kind, poimen_sandbox::record::CallKind::Verifier);
}

#[tokio::test]
pub(crate) async fn matches() {
    let w = world().await;
    let out = json!({"answer": {"text": "The total is 42."}});
    for (config, pass) in [
        (
            json!({"pointer": "/answer/text", "regex": "\\b42\\b"}),
            true,
        ),
        (
            json!({"pointer": "/answer/text", "contains": "total"}),
            true,
        ),
        (
            json!({"pointer": "/answer/text", "equals": "The total is 42."}),
            true,
        ),
        (json!({"pointer": "/answer/text", "regex": "^\\d"}), false),
        (json!({"pointer": "/missing", "contains": "x"}), false),
    ] {
        let v = verify(&w.host, "matches", out.clone(), config.clone())
            .await
            .outcome
            .expect("verdict");
        assert_eq!(v.pass, pass, "{config}: {}", v.reason);
    }
    let r = verify(&w.host, "matches", out, json!({"regex": "a", "equals": 1})).await;
    assert!(matches!(
        r.outcome,
        Err(InvokeError::Tool(ToolError::InvalidInput(_)))
    ));
}

#[tokio::test]
pub(crate) async fn adv_spin() {
    let w = world().await;
    let r = w
        .host
        .invoke_tool(
            ToolRequest::new(tool("adv-spin"), json!({}), "k").timeout(Duration::from_millis(300)),
        )
        .await;
    assert_eq!(
        error(&r),
        &InvokeError::Timeout {
            limit: Duration::from_millis(300)
        }
    );
    assert_eq!(
        r.record.outcome,
        poimen_sandbox::record::Outcome::Error {
            kind: "timeout".into(),
            message: "timed out after 300ms".into()
        }
    );
    assert!(r.record.fuel_consumed.is_some_and(|f| f > 0));
    still_healthy(&w.host).await;

    // Under a small fuel budget the same loop runs out of fuel instead.
    let w = world_with(|p| {
        p.limit(
            "adv-spin",
            LimitOverrides {
                fuel: Some(5_000_000),
                ..LimitOverrides::default()
            },
        )
    })
    .await;
    let r = call(&w.host, "adv-spin", json!({})).await;
    assert_eq!(error(&r), &InvokeError::FuelExhausted { limit: 5_000_000 });
    assert_eq!(r.record.fuel_consumed, Some(5_000_000));
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_grow_memory() {
    let w = world().await;
    let r = call(&w.host, "adv-grow-memory", json!({})).await;
    match error(&r) {
        InvokeError::MemoryExhausted {
            limit_bytes,
            requested_bytes,
        } => {
            assert_eq!(*limit_bytes, 64 << 20);
            assert!(requested_bytes > limit_bytes);
        }
        e => panic!("expected MemoryExhausted, got {e:?}"),
    }
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_stack_overflow() {
    let w = world().await;
    let r = call(&w.host, "adv-stack-overflow", json!({})).await;
    assert_eq!(error(&r), &InvokeError::StackOverflow);
    // A bounded recursion is fine: the component works, the stack was the limit.
    let r = call(&w.host, "adv-stack-overflow", json!({"depth": 100})).await;
    assert!(r.outcome.is_ok(), "{:?}", r.outcome);
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_panic() {
    let w = world().await;
    let r = call(&w.host, "adv-panic", json!({"why": "testing"})).await;
    match error(&r) {
        InvokeError::GuestPanicked {
            language,
            message,
            stderr,
        } => {
            assert_eq!(*language, poimen_sandbox::GuestLanguage::Rust);
            assert_eq!(message, r#"adversarial panic on {"why":"testing"}"#);
            assert!(stderr.contains("panicked at"), "{stderr}");
        }
        e => panic!("expected GuestPanicked, got {e:?}"),
    }
    assert!(r.record.stderr.text.contains("adversarial panic"));
    assert!(r.record.baseline.stderr_bytes > 0);
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_huge_output() {
    let w = world().await;
    let r = call(&w.host, "adv-huge-output", json!({"mib": 100})).await;
    match error(&r) {
        InvokeError::OutputTooLarge { bytes, limit_bytes } => {
            assert!(*bytes > 100 << 20, "{bytes}");
            assert_eq!(*limit_bytes, poimen_sandbox::limits::DEFAULT_OUTPUT_BYTES);
        }
        e => panic!("expected OutputTooLarge, got {e:?}"),
    }
    // Under the limit, the same component is fine.
    let r = call(&w.host, "adv-huge-output", json!({"mib": 1})).await;
    assert_eq!(
        r.outcome.as_ref().map(|v| v.as_array().map(Vec::len)),
        Ok(Some(16))
    );
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_fs_escape() {
    let w = world().await;
    // Timestamps are the virtual clock's (2000-01-01T00:00:00Z), never the
    // disk's: `stat-at` and `stat`, all three times.
    let r = call(
        &w.host,
        "adv-fs-escape",
        json!({"path": "notes.txt", "stat": true}),
    )
    .await;
    let frozen = "946684800.000000000";
    assert_eq!(
        r.outcome,
        Ok(json!(format!(
            "stat-at: {frozen} {frozen} {frozen}; stat: {frozen} {frozen} {frozen}"
        ))),
        "{:?}",
        r.outcome
    );
    // Raw `open-at` calls, so every attempt reaches the host.
    for (args, why) in [
        (json!({"path": "../secret.txt"}), "`..` leaves the mount"),
        (
            json!({"path": "sub/../../secret.txt"}),
            "`..` leaves the mount",
        ),
        (
            json!({"path": "/etc/passwd"}),
            "absolute paths are not resolved against a mount",
        ),
        (
            json!({"path": "link-out/secret.txt"}),
            "the path leads outside the mount (a symlink?)",
        ),
        (
            json!({"path": "link-file"}),
            "the path leads outside the mount (a symlink?)",
        ),
        (
            json!({"path": "new.txt", "write": true}),
            "the mount is read-only",
        ),
    ] {
        let r = call(&w.host, "adv-fs-escape", args.clone()).await;
        match error(&r) {
            InvokeError::CapabilityDenied {
                component,
                capability,
                why: got,
                policy,
                ..
            } => {
                assert_eq!(component, "adv-fs-escape");
                assert_eq!(capability, "fs-read:/data");
                assert_eq!(got, why, "{args}");
                assert_eq!(policy, "the policy given by the embedder");
            }
            e => panic!("{args}: expected CapabilityDenied, got {e:?}"),
        }
        let refused = r
            .record
            .host_calls
            .iter()
            .find(|c| c.result.starts_with("refused:"));
        assert!(
            refused.is_some_and(|c| c.function == "[method]descriptor.open-at"),
            "{args}: {:#?}",
            r.record.host_calls
        );
        assert!(
            !format!("{r:?}").contains(SECRET),
            "{args} leaked the secret"
        );
    }
    assert!(!w.data.join("new.txt").exists());
    // Inside the grant, the same raw calls work.
    let r = call(
        &w.host,
        "adv-fs-escape",
        json!({"path": "sub/../notes.txt"}),
    )
    .await;
    assert_eq!(r.outcome, Ok(json!("inside the grant\n")));
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_bad_output() {
    let w = world().await;
    let declared = &w
        .host
        .tools()
        .list()
        .into_iter()
        .find(|t| t.info.name == "adv-bad-output")
        .expect("loaded")
        .info;
    assert_eq!(declared.output_schema["properties"]["n"]["type"], "integer");

    // `{"n": "seven"}` breaks the declared `{"n": <integer>}`: refused, and
    // the output is not returned.
    let r = call(&w.host, "adv-bad-output", json!({})).await;
    let (tool, violations) = match error(&r) {
        InvokeError::OutputSchema { tool, violations } => (tool, violations),
        e => panic!("expected OutputSchema, got {e:?}"),
    };
    assert_eq!(tool, "adv-bad-output@0.1.0");
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(
        (violations[0].at.as_str(), violations[0].rule.as_str()),
        ("/n", "type")
    );
    assert!(violations[0].message.contains("seven"), "{violations:?}");
    let message = error(&r).to_string();
    assert!(
        message.starts_with(
            "the component `adv-bad-output@0.1.0` returned output that breaks its declared output schema: at /n: type: "
        ) && message.ends_with("; fix the component or its declared schema"),
        "{message}"
    );
    // The record says so, with the same message, and carries the identity.
    assert_eq!(
        r.record.outcome,
        poimen_sandbox::record::Outcome::Error {
            kind: "output_schema".into(),
            message: message.clone(),
        }
    );
    assert_eq!(
        r.record.tool.as_ref().map(|t| t.name.as_str()),
        Some("adv-bad-output")
    );

    // The same component with a valid output passes, right after the refusal.
    let r = call(&w.host, "adv-bad-output", json!({"n": 7})).await;
    assert_eq!(r.outcome, Ok(json!({"n": 7})));
    assert!(matches!(
        r.record.outcome,
        poimen_sandbox::record::Outcome::Ok { .. }
    ));

    // Other rules, at the top level: a missing key, the wrong type.
    for (raw, rule) in [(json!({"m": 1}), "required"), (json!([1]), "type")] {
        let r = call(&w.host, "adv-bad-output", json!({ "raw": raw })).await;
        match error(&r) {
            InvokeError::OutputSchema { violations, .. } => {
                assert_eq!(violations.len(), 1, "{raw}: {violations:?}");
                assert_eq!(
                    (violations[0].at.as_str(), violations[0].rule.as_str()),
                    ("", rule),
                    "{raw}"
                );
            }
            e => panic!("{raw}: expected OutputSchema, got {e:?}"),
        }
        assert!(
            error(&r)
                .to_string()
                .contains(&format!("at the top level: {rule}: ")),
            "{}",
            error(&r)
        );
    }
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_sockets() {
    // `wasi:sockets` is linked and denied: the component loads (a language
    // runtime imports sockets whether or not the tool uses them), and its
    // attempt to open a socket is refused, recorded, and fails the call.
    let w = world().await;
    let entry = w
        .host
        .load_component("test:adv-sockets", bytes(plugin_artifacts::ADV_SOCKETS))
        .await
        .expect("loads, sockets linked and denied");
    assert_eq!(entry.info.name, "adv-sockets");
    let r = call(&w.host, "adv-sockets", json!({})).await;
    match error(&r) {
        InvokeError::CapabilityDenied {
            component,
            capability,
            attempted,
            why,
            ..
        } => {
            assert_eq!(component, "adv-sockets");
            assert_eq!(capability, "sockets");
            assert!(attempted.contains("create-tcp-socket"), "{attempted}");
            assert!(why.contains("wasi:http"), "{why}");
        }
        e => panic!("expected CapabilityDenied, got {e:?}"),
    }
    assert_eq!(r.record.refusals.len(), 1, "{:?}", r.record.refusals);
    assert!(
        r.record
            .host_calls
            .iter()
            .any(|c| c.interface == "wasi:sockets/tcp-create-socket"
                && c.result.starts_with("refused")),
        "{:#?}",
        r.record.host_calls
    );
    still_healthy(&w.host).await;
}

#[tokio::test]
pub(crate) async fn adv_undeclared_http() {
    // An import of `wasi:http` the component does not declare is linked
    // with nothing granted: it loads, and every request is refused and
    // recorded — even under a policy that would grant `http`, because the
    // grant follows the declaration.
    let generous = Policy::in_code()
        .allow_http("adv-undeclared-http", "example.com")
        .expect("policy");
    let host = support::builder()
        .policy(generous)
        .build()
        .await
        .expect("host");
    let entry = host
        .load_component(
            "test:adv-undeclared-http",
            bytes(plugin_artifacts::ADV_UNDECLARED_HTTP),
        )
        .await
        .expect("loads, http linked and denied");
    assert!(entry.info.capabilities.is_empty());
    let r = call(&host, "adv-undeclared-http", json!({})).await;
    match error(&r) {
        InvokeError::CapabilityDenied {
            capability,
            attempted,
            why,
            ..
        } => {
            assert_eq!(capability, "http");
            assert!(attempted.contains("example.com"), "{attempted}");
            assert!(why.contains("no `http` grant"), "{why}");
        }
        e => panic!("expected CapabilityDenied, got {e:?}"),
    }
    assert!(r.record.capabilities.is_empty(), "nothing was granted");
    assert_eq!(r.record.refusals.len(), 1);
    host.load_component("test:text", bytes(plugin_artifacts::TEXT))
        .await
        .expect("text");
    still_healthy(&host).await;
}

#[tokio::test]
pub(crate) async fn adv_impostor() {
    // A plugin directory holding a third-party component that names itself
    // `fs-read` 0.1.9, beside the bundled `fs-read` 0.1.0.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("mkdir");
    let file = plugins.join("impostor.wasm");
    std::fs::copy(plugin_artifacts::ADV_IMPOSTOR, &file).expect("copy");
    let policy = || {
        Policy::in_code()
            .grant_fs_read("fs-read", "/data", &data)
            .expect("policy")
    };
    let real = bytes(plugin_artifacts::FS_READ);

    // Tolerant (as poimen runs): the host starts; the impostor is refused,
    // naming the reservation; `fs-read@^0.1` is still the bundled one.
    let host = support::builder()
        .policy(policy())
        .component_bytes("bundled:fs-read", real.clone())
        .plugin_dir(&plugins)
        .withhold_ungranted(true)
        .build()
        .await
        .expect("one bad plugin file never stops the host");
    let refused = host.refused();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].origin, file.display().to_string());
    assert!(
        refused[0].reason.contains(
            "names itself `fs-read`, a name reserved by the bundled component bundled:fs-read"
        ),
        "{}",
        refused[0].reason
    );
    let served: Vec<_> = host
        .tools()
        .list()
        .into_iter()
        .filter(|t| t.info.name == "fs-read")
        .collect();
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].origin, "bundled:fs-read");
    assert_eq!(served[0].info.version.to_string(), "0.1.0");

    // Even while the bundled one is withheld (no grant), its name is taken.
    let host = support::builder()
        .component_bytes("bundled:fs-read", real.clone())
        .plugin_dir(&plugins)
        .withhold_ungranted(true)
        .build()
        .await
        .expect("host");
    assert_eq!(host.refused().len(), 1);
    assert!(host.tools().list().iter().all(|t| t.info.name != "fs-read"));

    // Strict: the build fails, naming the impostor.
    let err = support::builder()
        .policy(policy())
        .component_bytes("bundled:fs-read", real)
        .plugin_dir(&plugins)
        .build()
        .await
        .expect_err("refused");
    match err {
        poimen_sandbox::BuildError::Refused(errors) => {
            assert!(
                matches!(&errors[..], [LoadError::ReservedName { name, .. }] if name == "fs-read"),
                "{errors:?}"
            );
        }
        other => panic!("expected Refused, got {other:?}"),
    }

    // Alone (no first-party fs-read given), it loads like any component.
    let host = support::builder()
        .policy(
            Policy::in_code()
                .grant_fs_read("fs-read", "/data", &data)
                .expect("policy"),
        )
        .component_bytes("third-party", bytes(plugin_artifacts::ADV_IMPOSTOR))
        .build()
        .await
        .expect("host");
    let r = call(&host, "fs-read", json!({})).await;
    assert_eq!(r.outcome, Ok(json!("impostor")));
}
