#![allow(clippy::unwrap_used)]
use std::time::{Duration, Instant};
mod bare {
    wasmtime::component::bindgen!({ path: "../../wit", world: "poimen:plugin/tool@0.1.0", exports: { default: async } });
}
struct S {
    ctx: wasmtime_wasi::WasiCtx,
    table: wasmtime::component::ResourceTable,
}
impl wasmtime_wasi::WasiView for S {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        wasmtime_wasi::WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}
const ARGS: &str = r#"{"select":"/a/1","value":{"a":[1,2,3],"b":"x"}}"#;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let n: u32 = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(3000);
    let multi = std::env::args().nth(3).is_some();
    let bytes = std::fs::read(&path).unwrap();
    let rt = if multi {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let engine = poimen_sandbox::default_engine();
    let mut linker = wasmtime::component::Linker::<S>::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
    let c = wasmtime::component::Component::new(&engine, &bytes).unwrap();
    let pre = bare::ToolPre::new(linker.instantiate_pre(&c).unwrap()).unwrap();
    let bare = |timeout: bool| {
        let pre = &pre;
        let engine = &engine;
        async move {
            let mut store = wasmtime::Store::new(
                engine,
                S {
                    ctx: wasmtime_wasi::WasiCtx::builder().build(),
                    table: wasmtime::component::ResourceTable::new(),
                },
            );
            store.set_fuel(u64::MAX).unwrap();
            store.set_epoch_deadline(u64::MAX);
            let f = async {
                let t = pre.instantiate_async(&mut store).await.unwrap();
                t.call_invoke(&mut store, ARGS, "key")
                    .await
                    .unwrap()
                    .unwrap()
            };
            if timeout {
                tokio::time::timeout(Duration::from_secs(10), f)
                    .await
                    .unwrap()
            } else {
                f.await
            }
        }
    };
    rt.block_on(async {
        let host = poimen_sandbox::PluginHost::builder()
            .component_bytes("x", bytes.clone())
            .build()
            .await
            .unwrap();
        let args: serde_json::Value = serde_json::from_str(ARGS).unwrap();
        let tool: poimen_sandbox::ToolRef = "json@^0.1".parse().unwrap();
        let mode = std::env::var("MODE").unwrap_or_default();
        // warm up
        for _ in 0..200 {
            bare(false).await;
            host.invoke_tool(poimen_sandbox::ToolRequest::new(
                tool.clone(),
                args.clone(),
                "key",
            ))
            .await
            .outcome
            .unwrap();
        }
        let t = Instant::now();
        if mode == "bare" {
            for _ in 0..n {
                bare(false).await;
            }
        } else {
            for _ in 0..n {
                host.invoke_tool(poimen_sandbox::ToolRequest::new(
                    tool.clone(),
                    args.clone(),
                    "key",
                ))
                .await
                .outcome
                .unwrap();
            }
        }
        println!("{mode} wall {:?}", t.elapsed() / n);
    });
}
