//! The sandbox benchmark (`cargo bench -p poimen-sandbox --bench boundary`): what the recorded
//! hostcall boundary costs over bare wasmtime, and what the compile cache
//! saves at load.
//!
//! - `call/bare`: the `json` plugin pre-instantiated (`InstancePre`) on an
//!   engine with the host's settings; per iteration a fresh store with a
//!   minimal WASI context, instantiate, one `invoke`.
//! - `call/boundary`: the same component and input through
//!   `PluginHost::invoke_tool`: registry lookup, canonical arguments and their
//!   hash, a WASI context from grants, limits, the record.
//! - `load/compile` and `load/cached`: `PluginHost::load_component` of the same
//!   component without a cache, and with a warm on-disk cache.
//!
//! - `languages/{rust,python,javascript}`: a warm call counting the words of
//!   the same text with the Rust `text` plugin (`op: count`), the Python
//!   `word-count-py` and the JavaScript `word-count-js` examples (built by
//!   `examples/plugins/build.sh`), all on one host. Before it, each
//!   language component's cold compile time (median of 3 loads without a
//!   cache) and compiled size (what the cache keeps) are printed.
//!
//! Results go to the "Sandbox" section of BENCHMARKS.md (medians from
//! `target/criterion/*/new/estimates.json`). Knows nothing of how the host
//! is built inside; it uses the public API and plain wasmtime.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use poimen_sandbox::{PluginHost, ToolRequest};
use serde_json::json;
use wasmtime::Store;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

mod bare {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "poimen:plugin/tool@0.1.0",
        exports: { default: async },
    });
}

struct BareState {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiView for BareState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

const ARGS: &str = r#"{"select":"/a/1","value":{"a":[1,2,3],"b":"x"}}"#;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let bytes = std::fs::read(plugin_artifacts::JSON).expect("json component");

    // (a) bare wasmtime.
    // The host's own engine settings: pooling, epochs, fuel.
    let engine = poimen_sandbox::default_engine();
    let mut linker = Linker::<BareState>::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).expect("wasi");
    let component = Component::new(&engine, &bytes).expect("compile");
    let pre =
        bare::ToolPre::new(linker.instantiate_pre(&component).expect("pre")).expect("tool pre");
    let bare_call = || async {
        let mut store = Store::new(
            &engine,
            BareState {
                ctx: WasiCtx::builder().build(),
                table: ResourceTable::new(),
            },
        );
        store.set_fuel(u64::MAX).expect("fuel");
        store.set_epoch_deadline(u64::MAX);
        let tool = pre
            .instantiate_async(&mut store)
            .await
            .expect("instantiate");
        tool.call_invoke(&mut store, ARGS, "key")
            .await
            .expect("call")
            .expect("tool ok")
    };
    assert_eq!(rt.block_on(bare_call()), "2");

    // (b) the full boundary.
    let host = rt
        .block_on(
            PluginHost::builder()
                .component_bytes("bench:json", bytes.clone())
                .build(),
        )
        .expect("host");
    let args: serde_json::Value = serde_json::from_str(ARGS).expect("args");
    let tool: poimen_sandbox::ToolRef = "json@^0.1".parse().expect("ref");
    let full_call = || async {
        let r = host
            .invoke_tool(ToolRequest::new(tool.clone(), args.clone(), "key"))
            .await;
        r.outcome.expect("tool ok")
    };
    assert_eq!(rt.block_on(full_call()), json!(2));

    let mut g = c.benchmark_group("call");
    g.measurement_time(Duration::from_secs(10));
    g.bench_function("bare", |b| b.to_async(&rt).iter(bare_call));
    g.bench_function("boundary", |b| b.to_async(&rt).iter(full_call));
    g.finish();

    // Cold load, with and without the on-disk compile cache.
    let uncached = rt.block_on(PluginHost::builder().build()).expect("host");
    let dir = tempfile::tempdir().expect("dir");
    let cached = rt
        .block_on(PluginHost::builder().cache_dir(dir.path()).build())
        .expect("host");
    rt.block_on(cached.load_component("warm", bytes.clone()))
        .expect("warm the cache");
    let mut g = c.benchmark_group("load");
    g.sample_size(10);
    g.bench_function("compile", |b| {
        b.to_async(&rt).iter(|| async {
            uncached
                .load_component("bench", bytes.clone())
                .await
                .expect("load")
        })
    });
    g.bench_function("cached", |b| {
        b.to_async(&rt).iter(|| async {
            cached
                .load_component("bench", bytes.clone())
                .await
                .expect("load")
        })
    });
    g.finish();

    languages(c, &rt);
}

fn languages(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let lang = plugin_artifacts::lang::lang_plugins().expect("the example plugins");
    let py = std::fs::read(&lang.word_count_py).expect("python component");
    let js = std::fs::read(&lang.word_count_js).expect("javascript component");
    let text = std::fs::read(plugin_artifacts::TEXT).expect("text component");

    // Cold compile and compiled size, per language.
    for (name, bytes) in [("python", &py), ("javascript", &js), ("rust text", &text)] {
        let mut times = Vec::new();
        let mut compiled = 0;
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("dir");
            let host = rt
                .block_on(PluginHost::builder().cache_dir(dir.path()).build())
                .expect("host");
            let started = std::time::Instant::now();
            rt.block_on(host.load_component("bench", bytes.clone()))
                .expect("load");
            times.push(started.elapsed());
            compiled = std::fs::read_dir(dir.path())
                .expect("ls")
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum::<u64>();
        }
        times.sort();
        eprintln!(
            "cold load of {name}: {} bytes, median {:.2} s of 3 (compile + describe + cache write), compiled to {compiled} bytes",
            bytes.len(),
            times[1].as_secs_f64()
        );
    }

    let host = rt
        .block_on(
            PluginHost::builder()
                .component_bytes("bench:text", text)
                .component_bytes("bench:word-count-py", py)
                .component_bytes("bench:word-count-js", js)
                .build(),
        )
        .expect("host");
    let sentence = "the quick brown fox jumps over the lazy dog ".repeat(4);
    let calls = [
        (
            "rust",
            "text@^0.1",
            json!({"op": "count", "pattern": "\\S+", "text": sentence}),
            json!({"count": 36}),
        ),
        (
            "python",
            "word-count-py@^0.1",
            json!({"text": sentence}),
            json!({"words": 36}),
        ),
        (
            "javascript",
            "word-count-js@^0.1",
            json!({"text": sentence}),
            json!({"words": 36}),
        ),
    ];
    let mut g = c.benchmark_group("languages");
    g.measurement_time(Duration::from_secs(10));
    for (name, tool, args, expected) in calls {
        let tool: poimen_sandbox::ToolRef = tool.parse().expect("ref");
        let call = || async {
            host.invoke_tool(ToolRequest::new(tool.clone(), args.clone(), "key"))
                .await
                .outcome
                .expect("tool ok")
        };
        assert_eq!(rt.block_on(call()), expected, "{name}");
        g.bench_function(name, |b| b.to_async(rt).iter(call));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
