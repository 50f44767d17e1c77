//! The example plugins written in Python and JavaScript
//! (`examples/plugins/`, built from source by `examples/plugins/build.sh`):
//! their default builds load with their undeclared filesystem, HTTP and
//! socket imports linked and denied; good input, bad input, an exception
//! and a `print` each end as a Rust plugin's would; and the pool serves 64
//! concurrent Python calls.
//!
//! These fail (never skip) when the components cannot be built: the build
//! needs python3 with pip and node with npm.

use std::sync::OnceLock;

use poimen_sandbox::imports::Linked;
use poimen_sandbox::{
    GuestLanguage, InvokeError, PluginHost, ToolError, ToolRequest, VerifierRequest,
};
use serde_json::{Value, json};

use crate::support::{bytes, call, error, tool};

fn lang() -> &'static plugin_artifacts::lang::LangPlugins {
    plugin_artifacts::lang::lang_plugins()
        .unwrap_or_else(|e| panic!("the Python and JavaScript example plugins: {e}"))
}

/// The language components are large (12–18 MiB, ~40 MB compiled): a
/// cache primed once per binary, so each compiles once — the same
/// directory the end-to-end tests' `poimen` processes use (entries are
/// keyed by digest and engine settings, and the settings are the same), so
/// whichever binary runs first compiles them for both.
fn lang_cache() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("poimen-e2e-cache")
}

/// A host with the four example components and nothing else.
async fn lang_host(builder: poimen_sandbox::PluginHostBuilder) -> PluginHost {
    static PRIMED: OnceLock<()> = OnceLock::new();
    let plugins = lang();
    PRIMED.get_or_init(|| {
        let paths: Vec<_> = plugins.all().iter().map(|(_, p)| p.to_path_buf()).collect();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let host = PluginHost::builder()
                    .cache_dir(lang_cache())
                    .build()
                    .await
                    .expect("host");
                for p in paths {
                    host.inspect(std::fs::read(&p).expect("component"))
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                }
            });
        })
        .join()
        .expect("priming the language cache");
    });
    let mut b = builder.cache_dir(lang_cache());
    for (name, path) in plugins.all() {
        b = b.component_bytes(format!("example:{name}"), bytes(&path.to_string_lossy()));
    }
    b.build().await.expect("a host with the language plugins")
}

async fn verify(
    host: &PluginHost,
    name: &str,
    output: Value,
    config: Value,
) -> poimen_sandbox::VerifierInvocation {
    host.invoke_verifier(VerifierRequest::new(tool(name), json!({}), output, config))
        .await
}

#[tokio::test]
async fn default_builds_load_with_undeclared_imports_linked_and_denied() {
    let host = lang_host(PluginHost::builder()).await;
    let entries: Vec<_> = host
        .tools()
        .list()
        .into_iter()
        .chain(host.verifiers().list())
        .collect();
    assert_eq!(entries.len(), 4, "{entries:?}");
    for e in &entries {
        assert!(e.grants.is_empty(), "{}: {:?}", e.info.name, e.grants);
        let denied: Vec<&str> = e
            .imports
            .iter()
            .filter(|i| i.linked == Linked::Denied)
            .map(|i| i.name.as_str())
            .collect();
        assert!(
            denied.iter().any(|i| i.starts_with("wasi:filesystem/")),
            "{}: {denied:?}",
            e.info.name
        );
        if e.info.name.ends_with("-py") {
            assert!(
                denied.iter().any(|i| i.starts_with("wasi:sockets/")),
                "{}: {denied:?}",
                e.info.name
            );
        }
        assert!(
            e.imports.iter().all(|i| i.linked != Linked::Refused),
            "{}: {:?}",
            e.info.name,
            e.imports
        );
    }
}

#[tokio::test]
async fn python_tool_good_bad_exception_and_print() {
    let host = lang_host(PluginHost::builder()).await;
    let r = call(&host, "word-count-py", json!({"text": "one two  three"})).await;
    assert_eq!(r.outcome, Ok(json!({"words": 3})), "{:?}", r.record.stderr);
    // `print()` reaches the record and never breaks the call.
    assert!(
        r.record
            .stderr
            .text
            .contains("counting the words of 14 characters"),
        "{:?}",
        r.record.stderr
    );
    assert!(r.record.baseline.stdout_bytes > 0);
    assert!(r.record.refusals.is_empty(), "{:?}", r.record.refusals);

    let r = call(&host, "word-count-py", json!({"text": 7})).await;
    assert_eq!(
        error(&r),
        &InvokeError::Tool(ToolError::InvalidInput("`text` must be a string".into()))
    );

    let r = call(&host, "word-count-py", json!({"text": "a b", "fail": true})).await;
    match error(&r) {
        InvokeError::GuestPanicked {
            language,
            message,
            stderr,
        } => {
            assert_eq!(*language, GuestLanguage::Python, "{message}\n{stderr}");
            assert!(
                message.starts_with("ValueError: asked to fail on 'a b'"),
                "{message}"
            );
            assert!(message.contains("app.py"), "{message}");
            assert!(
                stderr.contains("Traceback (most recent call last)"),
                "{stderr}"
            );
            assert!(stderr.contains("counting the words"), "{stderr}");
        }
        e => panic!("expected a Python exception, got {e:?}"),
    }
    let shown = error(&r).to_string();
    assert!(
        shown.starts_with("guest raised an uncaught Python exception: ValueError"),
        "{shown}"
    );
    assert_eq!(
        r.record.stderr.text,
        match error(&r) {
            InvokeError::GuestPanicked { stderr, .. } => stderr.clone(),
            _ => unreachable!(),
        }
    );
    // The same host serves the next call.
    let r = call(&host, "word-count-py", json!({"text": "still here"})).await;
    assert_eq!(r.outcome, Ok(json!({"words": 2})));
}

#[tokio::test]
async fn javascript_tool_good_bad_exception_and_print() {
    let host = lang_host(PluginHost::builder()).await;
    let r = call(&host, "word-count-js", json!({"text": "one two  three"})).await;
    assert_eq!(r.outcome, Ok(json!({"words": 3})), "{:?}", r.record.stderr);
    assert!(
        r.record
            .stderr
            .text
            .contains("counting the words of 14 characters"),
        "{:?}",
        r.record.stderr
    );
    assert!(r.record.refusals.is_empty(), "{:?}", r.record.refusals);

    let r = call(&host, "word-count-js", json!({"text": 7})).await;
    assert_eq!(
        error(&r),
        &InvokeError::Tool(ToolError::InvalidInput("`text` must be a string".into()))
    );

    let r = call(&host, "word-count-js", json!({"text": "a b", "fail": true})).await;
    match error(&r) {
        InvokeError::GuestPanicked {
            language,
            message,
            stderr,
        } => {
            assert_eq!(*language, GuestLanguage::JavaScript, "{message}\n{stderr}");
            assert!(
                message.starts_with(r#"Error: asked to fail on "a b" (thrown from an export"#),
                "{message}"
            );
        }
        e => panic!("expected a JavaScript error, got {e:?}"),
    }
    assert!(
        error(&r)
            .to_string()
            .starts_with("guest threw an uncaught JavaScript error: Error: asked to fail"),
        "{}",
        error(&r)
    );
    let r = call(&host, "word-count-js", json!({"text": "still here"})).await;
    assert_eq!(r.outcome, Ok(json!({"words": 2})));
}

#[tokio::test]
async fn python_and_javascript_verifiers_judge_and_refuse_bad_config() {
    let host = lang_host(PluginHost::builder()).await;
    let v = verify(
        &host,
        "max-words-py",
        json!({"summary": "a b c"}),
        json!({"max": 3}),
    )
    .await;
    let verdict = v.outcome.expect("verdict");
    assert!(verdict.pass, "{verdict:?}");
    assert_eq!(verdict.score, 1.0);
    let v = verify(
        &host,
        "max-words-py",
        json!({"summary": "a b c d"}),
        json!({"max": 2}),
    )
    .await;
    let verdict = v.outcome.expect("verdict");
    assert!(!verdict.pass);
    assert_eq!(verdict.score, 0.5);
    assert_eq!(verdict.reason, "4 words, more than 2");
    let v = verify(&host, "max-words-py", json!("x"), json!({"max": -1})).await;
    assert_eq!(
        v.outcome,
        Err(InvokeError::Tool(ToolError::InvalidInput(
            "`max` must be a non-negative integer".into()
        )))
    );

    let v = verify(
        &host,
        "contains-js",
        json!({"a": "needle here"}),
        json!({"needle": "needle"}),
    )
    .await;
    let verdict = v.outcome.expect("verdict");
    assert!(verdict.pass && verdict.score == 1.0, "{verdict:?}");
    let v = verify(
        &host,
        "contains-js",
        json!({"a": "hay"}),
        json!({"needle": "needle"}),
    )
    .await;
    assert!(!v.outcome.expect("verdict").pass);
    let v = verify(&host, "contains-js", json!({}), json!({"needle": 1})).await;
    assert_eq!(
        v.outcome,
        Err(InvokeError::Tool(ToolError::InvalidInput(
            "`needle` must be a string".into()
        )))
    );
}

/// The documented ceiling: a host runs `max_concurrent` calls at once (64
/// here), each in its own instance from the pool; a language runtime's
/// instance fits the pool's per-component limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_python_calls() {
    let host = lang_host(PluginHost::builder().max_concurrent(64)).await;
    assert_eq!(host.allocator(), poimen_sandbox::AllocatorKind::Pooling);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..64usize {
        let host = host.clone();
        calls.spawn(async move {
            let text = "w ".repeat(i + 1);
            let r = host
                .invoke_tool(ToolRequest::new(
                    tool("word-count-py"),
                    json!({ "text": text }),
                    format!("concurrent-{i}"),
                ))
                .await;
            (i, r.outcome)
        });
    }
    let mut done = 0;
    while let Some(joined) = calls.join_next().await {
        let (i, outcome) = joined.expect("a call's task");
        assert_eq!(outcome, Ok(json!({"words": i + 1})), "call {i}");
        done += 1;
    }
    assert_eq!(done, 64);
    assert_eq!(host.in_flight(), 0);
}

/// A pool too small for the calls admitted at once (4 component instances,
/// 32 core instances, 8 memories for 8 concurrent calls of a runtime that
/// needs several of each): calls wait for room, none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_delays_calls_and_never_fails_them() {
    let host = lang_host(PluginHost::builder().max_concurrent(8).pool_instances(4)).await;
    assert_eq!(host.allocator(), poimen_sandbox::AllocatorKind::Pooling);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..16usize {
        let host = host.clone();
        let name = if i % 2 == 0 {
            "word-count-py"
        } else {
            "word-count-js"
        };
        calls.spawn(async move {
            let r = host
                .invoke_tool(ToolRequest::new(
                    tool(name),
                    json!({ "text": "a b c" }),
                    format!("small-pool-{i}"),
                ))
                .await;
            (i, r.outcome)
        });
    }
    while let Some(joined) = calls.join_next().await {
        let (i, outcome) = joined.expect("a call's task");
        assert_eq!(outcome, Ok(json!({"words": 3})), "call {i}");
    }
}
