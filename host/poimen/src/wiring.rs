//! The one place the crates are wired into a running kernel: the sandbox
//! as the executor's `ToolHost` ([`crate::tools::SandboxTools`]), stored
//! versions as its `WorkflowLoader` ([`crate::loader::StoreLoader`]), and an
//! `Executor` over them. The host, shadow evaluation, the integration tests
//! and the benchmarks all build their kernels here.

use std::sync::Arc;

use poimen_executor::{Clock, Executor, ExecutorConfig, ModelProvider, ToolHost};
use poimen_sandbox::PluginHost;
use poimen_store::Store;

use crate::loader::StoreLoader;
use crate::tools::SandboxTools;

/// A store, a plugin host and an executor over them.
#[derive(Debug, Clone)]
pub struct Wiring {
    pub store: Arc<dyn Store>,
    pub sandbox: PluginHost,
    pub loader: Arc<StoreLoader>,
    pub executor: Executor,
}

impl Wiring {
    /// Wires an executor over `store` and `sandbox`.
    pub fn new(
        store: Arc<dyn Store>,
        sandbox: PluginHost,
        models: Arc<dyn ModelProvider>,
        clock: Arc<dyn Clock>,
        config: ExecutorConfig,
    ) -> Wiring {
        let tools = Arc::new(SandboxTools::new(sandbox.clone()));
        Wiring::with_tools(store, sandbox, tools, models, clock, config)
    }

    /// Wires an executor whose tools are reached through `tools` (a layer
    /// over the sandbox: shadow evaluation replays some calls).
    pub fn with_tools(
        store: Arc<dyn Store>,
        sandbox: PluginHost,
        tools: Arc<dyn ToolHost>,
        models: Arc<dyn ModelProvider>,
        clock: Arc<dyn Clock>,
        config: ExecutorConfig,
    ) -> Wiring {
        let loader = Arc::new(StoreLoader::new(store.clone(), sandbox.clone()));
        let executor = Executor::new(store.clone(), tools, models, clock, loader.clone(), config);
        Wiring {
            store,
            sandbox,
            loader,
            executor,
        }
    }

    /// [`Wiring::new`], with ephemeral runs kept in `ephemeral` (the host
    /// observes it as it observes `store`).
    pub fn with_ephemeral_store(
        store: Arc<dyn Store>,
        ephemeral: Arc<dyn Store>,
        sandbox: PluginHost,
        models: Arc<dyn ModelProvider>,
        clock: Arc<dyn Clock>,
        config: ExecutorConfig,
    ) -> Wiring {
        let tools = Arc::new(SandboxTools::new(sandbox.clone()));
        let loader = Arc::new(StoreLoader::new(store.clone(), sandbox.clone()));
        let executor = Executor::with_ephemeral_store(
            store.clone(),
            ephemeral,
            tools,
            models,
            clock,
            loader.clone(),
            config,
        );
        Wiring {
            store,
            sandbox,
            loader,
            executor,
        }
    }
}
