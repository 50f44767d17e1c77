//! The hostcall boundary: records, concurrency, cancellation, registries,
//! load-time capability checks, digests, the compile cache, inspection.

use std::time::Duration;

use poimen_sandbox::imports::Linked;
use poimen_sandbox::record::{CallKind, Outcome, b3};
use poimen_sandbox::{
    BuildError, Capability, EffectClass, ImportClass, InvokeError, LoadError, PluginHost,
    PluginKind, ToolRegistry, ToolRequest, VerifierRegistry, WIT_PACKAGE,
};
use serde_json::json;

use crate::support::{self, bytes, call, error, still_healthy, tool, world};

#[tokio::test]
async fn every_invocation_has_a_complete_serializable_record() {
    let w = world().await;
    // Keys are out of order and numbers unnormalized: the record holds the
    // canonical form (RFC 8785) and its hash.
    let args = json!({"value": {"b": 1.0, "a": [1e2]}, "select": "/a/0"});
    let r = w
        .host
        .invoke_tool(ToolRequest::new(tool("json@^0.1"), args, "run-1/step-2/0"))
        .await;
    // The guest parsed the canonical text, where `1e2` is `100`.
    assert_eq!(r.outcome, Ok(json!(100)));
    let rec = &r.record;
    assert_eq!(rec.kind, CallKind::Tool);
    assert_eq!(rec.requested, "json@^0.1");
    let id = rec.tool.as_ref().expect("identity");
    assert_eq!(
        (
            id.name.as_str(),
            id.version.as_str(),
            id.wit_package.as_str()
        ),
        ("json", "0.1.0", WIT_PACKAGE)
    );
    assert_eq!(id.digest, b3(&bytes(plugin_artifacts::JSON)));
    assert_eq!(rec.args, r#"{"select":"/a/0","value":{"a":[100],"b":1}}"#);
    assert_eq!(rec.args_hash, b3(rec.args.as_bytes()));
    assert_eq!(rec.idempotency_key.as_deref(), Some("run-1/step-2/0"));
    assert!(rec.capabilities.is_empty());
    assert!(rec.host_calls.is_empty() && rec.refusals.is_empty());
    assert_eq!(
        rec.outcome,
        Outcome::Ok {
            output_hash: b3(b"100"),
            output_bytes: 3
        }
    );
    assert!(rec.fuel_consumed.is_some_and(|f| f > 0));
    assert_eq!(rec.limits, poimen_sandbox::CallLimits::default());
    let back: poimen_sandbox::HostcallRecord =
        serde_json::from_str(&serde_json::to_string(rec).expect("ser")).expect("de");
    assert_eq!(&back, rec);

    // A failure has a record too, with the error's kind.
    let r = call(&w.host, "nope", json!({})).await;
    assert_eq!(r.record.tool, None);
    assert!(matches!(&r.record.outcome, Outcome::Error { kind, .. } if kind == "not_found"));
}

#[tokio::test]
async fn the_same_call_is_the_same_record_but_for_wall_time() {
    let w = world().await;
    let again = || {
        w.host.invoke_tool(ToolRequest::new(
            tool("text"),
            json!({"op": "count", "pattern": "x", "text": "xx"}),
            "k",
        ))
    };
    let (mut a, mut b) = (again().await.record, again().await.record);
    a.wall_time_us = 0;
    b.wall_time_us = 0;
    assert_eq!(a, b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_simultaneous_invocations_keep_separate_records() {
    let w = world().await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..64u64 {
        let host = w.host.clone();
        set.spawn(async move {
            let text = "x".repeat(usize::try_from(i).expect("small"));
            let (name, args) = if i % 2 == 0 {
                ("text", json!({"op": "count", "pattern": "x", "text": text}))
            } else {
                ("json", json!({"value": {"i": i}, "select": "/i"}))
            };
            let r = host
                .invoke_tool(ToolRequest::new(tool(name), args.clone(), format!("k{i}")))
                .await;
            (i, name, args, r)
        });
    }
    let mut seen = 0;
    while let Some(done) = set.join_next().await {
        let (i, name, args, r) = done.expect("task");
        let expected = if name == "text" {
            json!({"count": i})
        } else {
            json!(i)
        };
        assert_eq!(r.outcome, Ok(expected), "call {i}");
        assert_eq!(r.record.idempotency_key, Some(format!("k{i}")));
        assert_eq!(
            r.record.args,
            serde_json_canonicalizer::to_string(&args).expect("jcs")
        );
        assert_eq!(r.record.tool.as_ref().map(|t| t.name.as_str()), Some(name));
        seen += 1;
    }
    assert_eq!(seen, 64);
    assert_eq!(w.host.in_flight(), 0);
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    // Generous: the assertion is on the outcome, not on how fast it comes.
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_future_interrupts_a_spinning_guest() {
    let w = world().await;
    // Abort the task awaiting the invocation.
    let host = w.host.clone();
    let task = tokio::spawn(async move {
        host.invoke_tool(
            ToolRequest::new(tool("adv-spin"), json!({}), "k").timeout(Duration::from_secs(600)),
        )
        .await
    });
    wait_for("the guest to start", || w.host.in_flight() == 1).await;
    task.abort();
    let joined = task.await;
    assert!(joined.is_err_and(|e| e.is_cancelled()));
    wait_for("the guest to stop", || w.host.in_flight() == 0).await;

    // Drop the future itself, in a select.
    let spin = w.host.invoke_tool(
        ToolRequest::new(tool("adv-spin"), json!({}), "k2").timeout(Duration::from_secs(600)),
    );
    tokio::select! {
        _ = spin => panic!("a spinning guest returned"),
        () = wait_for("the second guest to start", || w.host.in_flight() == 1) => {}
    }
    wait_for("the second guest to stop", || w.host.in_flight() == 0).await;
    still_healthy(&w.host).await;
}

#[tokio::test]
async fn registries_resolve_by_name_and_range_and_explain_misses() {
    let w = world().await;
    let tools = w.host.tools();
    let info = tools.resolve_tool(&tool("json@^0.1")).expect("json");
    assert_eq!(
        (info.name.as_str(), info.effect),
        ("json", EffectClass::Pure)
    );
    assert!(info.input_schema.is_object());

    let miss = tools.resolve_tool(&tool("json@^2")).expect_err("range");
    assert_eq!(miss.available_versions, ["0.1.0"]);
    assert!(miss.nearest.is_empty());
    let miss = tools.resolve_tool(&tool("jsn")).expect_err("name");
    assert_eq!(miss.nearest.first().map(String::as_str), Some("json"));
    assert!(
        miss.registry.contains("tools") && miss.registry.contains("embedder"),
        "{}",
        miss.registry
    );
    // Tools and verifiers are separate registries.
    assert!(tools.resolve_tool(&tool("matches")).is_err());
    let verifiers = w.host.verifiers();
    assert_eq!(
        verifiers
            .resolve_verifier(&tool("matches"))
            .expect("matches")
            .name,
        "matches"
    );

    let listed = tools.list();
    let names: Vec<&str> = listed.iter().map(|e| e.info.name.as_str()).collect();
    assert!(
        names.contains(&"fs-read") && names.contains(&"adv-spin"),
        "{names:?}"
    );
    let entry = |n: &str| listed.iter().find(|e| e.info.name == n).expect(n);
    assert_eq!(entry("fs-read").eligibility, Ok(()));
    assert_eq!(entry("fs-read").kind, PluginKind::Tool);
    assert_eq!(
        entry("fs-read").info.capabilities,
        ["fs-read:/data".parse::<Capability>().expect("cap")]
    );
    assert!(
        entry("fs-read")
            .imports
            .iter()
            .any(|i| i.class == ImportClass::Filesystem)
    );
    assert!(
        entry("json")
            .imports
            .iter()
            .all(|i| i.class == ImportClass::Baseline),
        "a pure plugin needs no capability"
    );
    assert_eq!(
        entry("ledger").eligibility.as_ref().map_err(Vec::len),
        Err(2)
    );
    assert_eq!(
        entry("ledger-idempotent")
            .eligibility
            .as_ref()
            .map_err(Vec::len),
        Err(1)
    );
    assert!(entry("http-get").eligibility.is_err());
    assert_eq!(entry("json").describe_record.kind, CallKind::Describe);
    assert_eq!(verifiers.list().len(), 2);
}

#[tokio::test]
async fn a_pinned_digest_must_match() {
    let w = world().await;
    let digest = b3(&bytes(plugin_artifacts::TEXT));
    let args = json!({"op": "count", "pattern": "a", "text": "a"});
    let ok = w
        .host
        .invoke_tool(ToolRequest::new(tool("text"), args.clone(), "k").pinned(&digest))
        .await;
    assert_eq!(ok.outcome, Ok(json!({"count": 1})));
    let wrong = w
        .host
        .invoke_tool(ToolRequest::new(tool("text"), args, "k").pinned("b3:0000"))
        .await;
    assert_eq!(
        error(&wrong),
        &InvokeError::DigestMismatch {
            tool: "text".into(),
            expected: "b3:0000".into(),
            found: digest
        }
    );
}

#[tokio::test]
async fn declared_capabilities_must_be_granted_at_load() {
    // The built-in policy grants nothing: fs-read cannot load.
    let host = support::builder().build().await.expect("host");
    let e = host
        .load_component("test:fs-read", bytes(plugin_artifacts::FS_READ))
        .await
        .expect_err("denied");
    match &e {
        LoadError::CapabilityDenied {
            component,
            capability,
            policy,
            hint,
            ..
        } => {
            assert_eq!(component, "fs-read");
            assert_eq!(capability, "fs-read:/data");
            assert!(policy.contains("built-in default policy"), "{policy}");
            assert!(hint.contains("fs-read = { \"/data\""), "{hint}");
        }
        e => panic!("expected CapabilityDenied, got {e:?}"),
    }
    // A pure plugin loads with no capability at all.
    host.load_component("test:json", bytes(plugin_artifacts::JSON))
        .await
        .expect("pure plugin loads");
    still_healthy_json(&host).await;

    // At build, every refusal is listed.
    let dir = tempfile::tempdir().expect("dir");
    for (name, path) in [
        ("a.wasm", plugin_artifacts::ADV_SOCKETS),
        ("b.wasm", plugin_artifacts::HTTP_GET),
        ("c.wasm", plugin_artifacts::TEXT),
    ] {
        std::fs::copy(path, dir.path().join(name)).expect("copy");
    }
    match support::builder().plugin_dir(dir.path()).build().await {
        Err(BuildError::Refused(errors)) => {
            // The sockets import is linked and denied, not a refusal.
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(
                matches!(&errors[0], LoadError::CapabilityDenied { capability, .. } if capability == "http")
            );
        }
        other => panic!("expected Refused, got {other:?}"),
    }
}

#[tokio::test]
async fn a_grant_pinned_to_a_digest_goes_to_that_component_only() {
    let data = tempfile::tempdir().expect("data");
    std::fs::write(data.path().join("notes.txt"), "pinned").expect("write");
    let real = b3(&bytes(plugin_artifacts::FS_READ));
    let other = format!("b3:{}", "0".repeat(64));
    let host_with = |pin: &str| {
        let policy = poimen_sandbox::Policy::in_code()
            .grant_fs_read("fs-read", "/data", data.path())
            .and_then(|p| p.pin_digest("fs-read", pin))
            .expect("policy");
        support::builder()
            .policy(policy)
            .withhold_ungranted(true)
            .component_bytes("t:fs-read", bytes(plugin_artifacts::FS_READ))
            .build()
    };
    // Pinned to this very component: granted.
    let host = host_with(&real).await.expect("host");
    let r = call(&host, "fs-read", json!({"path": "notes.txt"})).await;
    assert!(r.outcome.is_ok(), "{:?}", r.outcome);
    // Pinned to another: this one has the name, not the grant.
    let host = host_with(&other).await.expect("host");
    let withheld = host.withheld();
    assert_eq!(withheld.len(), 1, "{withheld:?}");
    assert!(
        withheld[0].reason.contains("grants only") && withheld[0].reason.contains(&real),
        "{}",
        withheld[0].reason
    );
}

#[tokio::test]
async fn a_withheld_component_is_withheld_again_at_the_next_start_without_compiling() {
    let plugins = tempfile::tempdir().expect("dir");
    let cache = tempfile::tempdir().expect("dir");
    std::fs::copy(plugin_artifacts::FS_READ, plugins.path().join("a.wasm")).expect("copy");
    let start = |policy: Option<poimen_sandbox::Policy>| {
        let mut b = PluginHost::builder()
            .cache_dir(cache.path())
            .plugin_dir(plugins.path())
            .withhold_ungranted(true);
        if let Some(p) = policy {
            b = b.policy(p);
        }
        b.build()
    };
    let first = start(None).await.expect("host");
    assert_eq!(first.compiles(), 1);
    let reason = first.withheld()[0].reason.clone();
    // Nothing compiled is kept for it; its description is.
    assert_eq!(support::compiled_files(cache.path()), 0);
    let second = start(None).await.expect("host");
    assert_eq!(
        second.compiles(),
        0,
        "withheld again from its kept description"
    );
    let withheld = second.withheld();
    assert_eq!(withheld.len(), 1, "{withheld:?}");
    assert_eq!(withheld[0].info.name, "fs-read");
    assert_eq!(withheld[0].reason, reason);
    // A policy that grants it now takes the full path: compiled, loaded.
    let data = tempfile::tempdir().expect("data");
    let policy = poimen_sandbox::Policy::in_code()
        .grant_fs_read("fs-read", "/data", data.path())
        .expect("policy");
    let granted = start(Some(policy)).await.expect("host");
    assert!(granted.withheld().is_empty(), "{:?}", granted.withheld());
    assert!(
        granted
            .tools()
            .list()
            .iter()
            .any(|e| e.info.name == "fs-read")
    );
    assert_eq!(granted.compiles(), 1);
}

#[tokio::test]
async fn withholding_builds_the_host_and_names_the_missing_grant_on_every_use() {
    let dir = tempfile::tempdir().expect("dir");
    for (name, path) in [
        ("a.wasm", plugin_artifacts::FS_READ),
        ("b.wasm", plugin_artifacts::TEXT),
    ] {
        std::fs::copy(path, dir.path().join(name)).expect("copy");
    }
    let host = support::builder()
        .plugin_dir(dir.path())
        .withhold_ungranted(true)
        .build()
        .await
        .expect("a withheld component does not fail the build");
    let withheld = host.withheld();
    assert_eq!(withheld.len(), 1, "{withheld:?}");
    assert_eq!(withheld[0].info.name, "fs-read");
    assert!(withheld[0].origin.ends_with("a.wasm"));
    assert!(
        withheld[0].reason.contains("fs-read:/data") && withheld[0].reason.contains("to grant it"),
        "{}",
        withheld[0].reason
    );
    assert!(host.tools().list().iter().all(|e| e.info.name != "fs-read"));

    // Invoking it is refused before any guest code runs, with the reason.
    let r = call(&host, "fs-read", json!({"path": "x"})).await;
    match error(&r) {
        InvokeError::Withheld { tool, reason } => {
            assert!(tool.starts_with("fs-read@"), "{tool}");
            assert!(reason.contains("fs-read:/data"), "{reason}");
        }
        e => panic!("expected Withheld, got {e:?}"),
    }
    // The validator's view says the same.
    let u = ToolRegistry::resolve_tool(&host.tools(), &tool("fs-read")).expect_err("withheld");
    assert!(
        u.withheld
            .as_deref()
            .is_some_and(|w| w.contains("fs-read:/data")),
        "{u:?}"
    );
    // The rest of the host works.
    let r = call(
        &host,
        "text",
        json!({"op": "count", "pattern": "o", "text": "ok"}),
    )
    .await;
    assert!(r.outcome.is_ok(), "{:?}", r.outcome);
}

async fn still_healthy_json(host: &PluginHost) {
    let r = call(host, "json", json!({"value": [1], "select": "/0"})).await;
    assert_eq!(r.outcome, Ok(json!(1)));
}

#[tokio::test]
async fn a_policy_file_fixture_grants_its_mounts() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/policy/fs-read.toml"
    );
    let host = support::builder()
        .policy_file(fixture)
        .component_bytes("test:fs-read", bytes(plugin_artifacts::FS_READ))
        .build()
        .await
        .expect("host");
    let r = call(&host, "fs-read", json!({"path": "hello.txt"})).await;
    assert_eq!(
        r.outcome.as_ref().map(|v| v["content"].clone()),
        Ok(json!("hello from the fixture\n"))
    );
    assert_eq!(r.record.limits.timeout, Duration::from_secs(5));
    let grant = &r.record.capabilities[0];
    assert!(
        grant
            .host_dir
            .as_ref()
            .is_some_and(|d| d.ends_with("fixtures/policy/data")),
        "{grant:?}"
    );
}

#[tokio::test]
async fn the_compile_cache_is_used_the_second_time() {
    let dir = tempfile::tempdir().expect("dir");
    let build = || {
        PluginHost::builder()
            .cache_dir(dir.path())
            .component_bytes("t", bytes(plugin_artifacts::ADV_SPIN))
            .build()
    };
    let first = build().await.expect("host").tools().list();
    let second = build().await.expect("host").tools().list();
    assert_eq!(first[0].cache, poimen_sandbox::CacheOutcome::Compiled);
    assert_eq!(second[0].cache, poimen_sandbox::CacheOutcome::Hit);
    assert_eq!(support::compiled_files(dir.path()), 1);
}

#[tokio::test]
async fn a_cached_component_is_described_from_the_cache_without_running_it() {
    let dir = tempfile::tempdir().expect("dir");
    let build = |origin: &'static str| {
        PluginHost::builder()
            .cache_dir(dir.path())
            .component_bytes(origin, bytes(plugin_artifacts::JSON))
            .build()
    };
    let first = build("first").await.expect("host").tools().list();
    let second = build("second").await.expect("host").tools().list();
    assert!(!first[0].describe_cached, "the first load calls describe");
    assert!(second[0].describe_cached, "a hit reads the description");
    assert_eq!(first[0].info, second[0].info);
    // The record is the one `describe` made, named for this load.
    let (mut a, mut b) = (
        first[0].describe_record.clone(),
        second[0].describe_record.clone(),
    );
    assert_eq!(b.requested, "second");
    (a.requested, a.wall_time_us, b.requested, b.wall_time_us) = Default::default();
    assert_eq!(a, b);

    // A description file that was tampered with is not believed: the
    // component is described again (and the file rewritten).
    let described: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "described"))
        .collect();
    assert_eq!(described.len(), 1);
    let mut text = std::fs::read(&described[0]).expect("read");
    let at = text.len() - 10;
    text[at] ^= 1;
    std::fs::write(&described[0], text).expect("tamper");
    let third = build("third").await.expect("host").tools().list();
    assert!(!third[0].describe_cached);
    assert_eq!(third[0].info, first[0].info);
    let fourth = build("fourth").await.expect("host").tools().list();
    assert!(fourth[0].describe_cached, "rewritten");
}

#[tokio::test]
async fn the_compile_cache_keeps_nothing_it_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let cached = || support::compiled_files(dir.path());
    // Nothing grants `fs-read` its directory: refused at load, by inspect's
    // verdict too, and nothing compiled is left behind.
    let host = PluginHost::builder()
        .cache_dir(dir.path())
        .build()
        .await
        .expect("host");
    let refused = host
        .load_component("t:fs-read", bytes(plugin_artifacts::FS_READ))
        .await;
    assert!(
        matches!(
            refused,
            Err(poimen_sandbox::LoadError::CapabilityDenied { .. })
        ),
        "{refused:?}"
    );
    host.inspect(bytes(plugin_artifacts::FS_READ))
        .await
        .expect("inspect");
    assert_eq!(cached(), 0);
    // What is accepted is kept: inspecting one this host would load, then
    // loading it, compiles it once.
    host.inspect(bytes(plugin_artifacts::JSON))
        .await
        .expect("inspect");
    assert_eq!(cached(), 1);
    let entry = host
        .load_component("t:json", bytes(plugin_artifacts::JSON))
        .await
        .expect("load");
    assert_eq!(entry.cache, poimen_sandbox::CacheOutcome::Hit);
    assert_eq!(cached(), 1);
}

#[tokio::test]
async fn inspect_reports_descriptor_imports_and_problems() {
    let w = world().await;
    let i = w
        .host
        .inspect(bytes(plugin_artifacts::HTTP_GET))
        .await
        .expect("inspect");
    assert_eq!(i.kind, PluginKind::Tool);
    assert_eq!(i.info.name, "http-get");
    assert_eq!(i.info.capabilities, [Capability::Http]);
    assert!(
        i.imports
            .iter()
            .any(|x| x.class == ImportClass::Http && x.linked == Linked::Declared)
    );
    assert!(i.eligibility.is_err());

    // Undeclared HTTP: linked, denied.
    let i = w
        .host
        .inspect(bytes(plugin_artifacts::ADV_UNDECLARED_HTTP))
        .await
        .expect("inspect");
    let http: Vec<_> = i
        .imports
        .iter()
        .filter(|x| x.class == ImportClass::Http)
        .collect();
    assert_eq!(http.len(), 2, "{:?}", i.imports);
    assert!(http.iter().all(|x| x.linked == Linked::Denied));
    // Sockets: always linked, denied.
    let i = w
        .host
        .inspect(bytes(plugin_artifacts::ADV_SOCKETS))
        .await
        .expect("sockets are linked, denied");
    assert!(
        i.imports
            .iter()
            .filter(|x| x.class == ImportClass::Sockets)
            .all(|x| x.linked == Linked::Denied)
    );
    assert!(i.imports.iter().any(|x| x.class == ImportClass::Sockets));
    // Inspection registers nothing.
    assert!(
        w.host
            .tools()
            .list()
            .iter()
            .all(|t| t.info.name != "adv-undeclared-http")
    );
    // The free function, on a throwaway host.
    let e = poimen_sandbox::inspect(b"not wasm".to_vec())
        .await
        .expect_err("junk");
    assert!(matches!(e, LoadError::Compile { .. }));
}

#[tokio::test]
async fn the_allocator_is_pooling_unless_turned_off() {
    let w = world().await;
    assert_eq!(w.host.allocator(), poimen_sandbox::AllocatorKind::Pooling);
    let h = PluginHost::builder()
        .pooling(false)
        .build()
        .await
        .expect("host");
    assert_eq!(h.allocator(), poimen_sandbox::AllocatorKind::OnDemand);
    let h = PluginHost::builder()
        .pool_instances(u32::MAX / 8)
        .build()
        .await
        .expect("host falls back");
    assert_eq!(h.allocator(), poimen_sandbox::AllocatorKind::OnDemand);
}

#[tokio::test]
async fn a_host_without_fuel_records_none() {
    let host = support::builder()
        .fuel(false)
        .component_bytes("t", bytes(plugin_artifacts::TEXT))
        .build()
        .await
        .expect("host");
    let r = call(
        &host,
        "text",
        json!({"op": "count", "pattern": "a", "text": "a"}),
    )
    .await;
    assert_eq!(r.outcome, Ok(json!({"count": 1})));
    assert_eq!(r.record.fuel_consumed, None);
    assert_eq!(r.record.limits.fuel, None);
}

#[tokio::test]
async fn a_call_is_effect_free_or_repeatable_only_for_a_pure_component_granted_no_way_out() {
    // What the executor asks before it skips the write-ahead intent of a
    // call: pure, and nothing granted that an effect could go through.
    let data = tempfile::tempdir().expect("data");
    let ledger = tempfile::tempdir().expect("ledger");
    let policy = poimen_sandbox::Policy::in_code()
        .grant_fs_read("fs-read", "/data", data.path())
        .and_then(|p| p.grant_fs_write("ledger-idempotent", "/ledger", ledger.path()))
        .and_then(|p| p.allow_http("http-get", "127.0.0.1"))
        .expect("policy");
    let host = support::builder()
        .policy(policy)
        .withhold_ungranted(true)
        .component_bytes("t:json", bytes(plugin_artifacts::JSON))
        .component_bytes("t:text", bytes(plugin_artifacts::TEXT))
        .component_bytes("t:json-schema", bytes(plugin_artifacts::JSON_SCHEMA))
        .component_bytes("t:fs-read", bytes(plugin_artifacts::FS_READ))
        .component_bytes("t:http-get", bytes(plugin_artifacts::HTTP_GET))
        .component_bytes(
            "t:ledger-idempotent",
            bytes(plugin_artifacts::LEDGER_IDEMPOTENT),
        )
        .build()
        .await
        .expect("host");
    assert!(host.withheld().is_empty(), "{:?}", host.withheld());
    let free = |name: &str, path: &str| {
        host.effect_free(&tool(&format!("{name}@^0.1")), &b3(&bytes(path)))
    };
    // Pure, nothing granted (scratch leaves nothing behind).
    assert!(free("json", plugin_artifacts::JSON));
    assert!(free("text", plugin_artifacts::TEXT));
    // Pure, a read-only mount: reads change nothing.
    assert!(free("fs-read", plugin_artifacts::FS_READ));
    // Pure by its own word, but granted the network: an effect could go
    // out through it, so the call keeps its write-ahead intent.
    assert!(!free("http-get", plugin_artifacts::HTTP_GET));
    // An effect by its own word (and a writable mount).
    assert!(!free(
        "ledger-idempotent",
        plugin_artifacts::LEDGER_IDEMPOTENT
    ));
    // Another component's digest, or a name not loaded: not known to be free.
    assert!(!free("json", plugin_artifacts::TEXT));
    assert!(!host.effect_free(&tool("nope@^0.1"), &b3(&bytes(plugin_artifacts::JSON))));

    // Repeatable — the outcome a function of component, arguments, limits
    // and seed, so an identical recorded call may stand in for it (shadow
    // evaluation): pure and granted nothing at all. A read-only mount reads
    // a world that may have changed since.
    let repeatable = |kind: PluginKind, name: &str, path: &str| {
        host.repeatable(
            kind,
            &tool(&format!("{name}@^0.1")),
            Some(&b3(&bytes(path))),
        )
    };
    let json = repeatable(PluginKind::Tool, "json", plugin_artifacts::JSON).expect("json");
    assert_eq!(json.digest, b3(&bytes(plugin_artifacts::JSON)));
    // The limits a call runs under, as its record says.
    let inv = host
        .invoke_tool(ToolRequest::new(
            tool("json@^0.1"),
            json!({"value": {"a": 1}, "select": "/a"}),
            "k",
        ))
        .await;
    assert_eq!(inv.outcome, Ok(json!(1)));
    assert_eq!(inv.record.limits, json.limits);
    assert!(repeatable(PluginKind::Tool, "text", plugin_artifacts::TEXT).is_some());
    assert!(repeatable(PluginKind::Tool, "fs-read", plugin_artifacts::FS_READ).is_none());
    assert!(repeatable(PluginKind::Tool, "http-get", plugin_artifacts::HTTP_GET).is_none());
    assert!(
        repeatable(
            PluginKind::Tool,
            "ledger-idempotent",
            plugin_artifacts::LEDGER_IDEMPOTENT
        )
        .is_none()
    );
    assert!(repeatable(PluginKind::Tool, "json", plugin_artifacts::TEXT).is_none());
    // Unpinned, the component the reference resolves to; a verifier granted
    // nothing is repeatable, and a tool's name is not a verifier's.
    assert_eq!(
        host.repeatable(PluginKind::Tool, &tool("text@^0.1"), None)
            .map(|r| r.digest),
        Some(b3(&bytes(plugin_artifacts::TEXT)))
    );
    let schema = repeatable(
        PluginKind::Verifier,
        "json-schema",
        plugin_artifacts::JSON_SCHEMA,
    )
    .expect("json-schema");
    assert_eq!(schema.digest, b3(&bytes(plugin_artifacts::JSON_SCHEMA)));
    assert!(repeatable(PluginKind::Verifier, "json", plugin_artifacts::JSON).is_none());
}
