//! Scripted implementations of the executor's effect traits: tools and
//! verifiers answered by closures ([`ScriptedTools`]), a clock that moves
//! only when told ([`ManualClock`]), and a loader of workflows held in
//! memory ([`MemoryLoader`]). With `poimen_store::MemoryStore` they run the
//! whole walk — every step kind, joins, retries with backoff, loops,
//! budgets, cancellation — in milliseconds, without wasmtime, a database
//! or a network. Embedders use them in their own tests too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use poimen_workflow::{
    EffectClass, MemoryRegistry, MemoryWorkflows, Registries, ToolInfo, ToolRef, ToolRegistry,
    Unresolved, ValidationError, VerifierRegistry, WorkflowDef, WorkflowVersion,
};
use serde_json::Value;

use crate::effects::{
    Clock, Failure, FailureClass, Sleep, ToolCall, ToolHost, ToolIdentity, ToolResult, Verdict,
    VerifierCall, VerifierResult,
};
use crate::runnable::{Runnable, WorkflowLoader};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ------------------------------------------------------------------ clock

/// A clock that moves only when told (or, in auto mode, exactly as far as
/// each sleep asks): runs see deterministic timestamps, and backoff costs no
/// wall time.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
    auto: bool,
    sleepers: Mutex<Vec<(i64, tokio::sync::oneshot::Sender<()>)>>,
    slept: Mutex<Vec<Duration>>,
}

impl ManualClock {
    fn with(start_ms: i64, auto: bool) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: AtomicI64::new(start_ms),
            auto,
            sleepers: Mutex::new(Vec::new()),
            slept: Mutex::new(Vec::new()),
        })
    }

    /// A clock at `start_ms` that moves only on [`ManualClock::advance`]; a
    /// sleep waits until the clock has been advanced past its end.
    pub fn new(start_ms: i64) -> Arc<ManualClock> {
        ManualClock::with(start_ms, false)
    }

    /// A clock at `start_ms` where every sleep moves the clock forward by
    /// its duration and returns at once.
    pub fn auto(start_ms: i64) -> Arc<ManualClock> {
        ManualClock::with(start_ms, true)
    }

    /// Moves the clock forward, waking every sleep that has ended.
    pub fn advance(&self, by: Duration) {
        let now = self
            .now
            .fetch_add(millis(by), Ordering::SeqCst)
            .saturating_add(millis(by));
        let mut sleepers = lock(&self.sleepers);
        let (due, waiting): (Vec<_>, Vec<_>) =
            sleepers.drain(..).partition(|(until, _)| *until <= now);
        *sleepers = waiting;
        for (_, wake) in due {
            let _ = wake.send(());
        }
    }

    /// Sleeps waiting for the clock to move.
    pub fn sleeping(&self) -> usize {
        lock(&self.sleepers).len()
    }

    /// Every sleep asked for, in order.
    pub fn slept(&self) -> Vec<Duration> {
        lock(&self.slept).clone()
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        lock(&self.slept).push(duration);
        if self.auto {
            // Time passes for whoever sleeps — and for every timer.
            self.advance(duration);
            return Box::pin(std::future::ready(()));
        }
        self.sleep_until(self.now_ms().saturating_add(millis(duration)))
    }

    fn sleep_until(&self, at_ms: i64) -> Sleep {
        if at_ms <= self.now_ms() {
            return Box::pin(std::future::ready(()));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        lock(&self.sleepers).push((at_ms, tx));
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

// ------------------------------------------------------------------ tools

type Behaviour = dyn Fn(&ToolCall, u32) -> Result<Value, Failure> + Send + Sync;
type Judge = dyn Fn(&VerifierCall) -> Verdict + Send + Sync;

enum Act {
    /// Answers at once.
    Answer(Arc<Behaviour>),
    /// Never answers; only dropping the call ends it.
    Hang,
    /// Waits for a pass through the gate ([`ScriptedTools::open_gate`]),
    /// then echoes.
    Gated,
}

/// Tools and verifiers answered by closures, with every call recorded.
pub struct ScriptedTools {
    tools: MemoryRegistry,
    verifiers: MemoryRegistry,
    acts: BTreeMap<String, Act>,
    judges: BTreeMap<String, Arc<Judge>>,
    calls: Mutex<Vec<ToolCall>>,
    per_tool: Mutex<BTreeMap<String, u32>>,
    in_flight: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
    /// Tools answered as effect-free (see [`ToolHost::effect_free`]).
    effect_free: std::collections::BTreeSet<String>,
}

impl std::fmt::Debug for ScriptedTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedTools")
            .field("tools", &self.acts.keys().collect::<Vec<_>>())
            .field("verifiers", &self.judges.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for ScriptedTools {
    fn default() -> Self {
        ScriptedTools::new()
    }
}

/// The identity a scripted component gets: its digest is the Blake3 of
/// `name@version`.
fn info(name: &str, effect: EffectClass) -> ToolInfo {
    ToolInfo {
        name: name.to_owned(),
        version: semver::Version::new(1, 0, 0),
        digest: format!(
            "b3:{}",
            blake3::hash(format!("{name}@1.0.0").as_bytes()).to_hex()
        ),
        description: format!("scripted `{name}`"),
        input_schema: Value::Bool(true),
        output_schema: Value::Bool(true),
        capabilities: Vec::new(),
        effect,
        max_timeout_ms: None,
        workflow: None,
    }
}

impl ScriptedTools {
    pub fn new() -> ScriptedTools {
        ScriptedTools {
            tools: MemoryRegistry::new("scripted tools"),
            verifiers: MemoryRegistry::new("scripted verifiers"),
            acts: BTreeMap::new(),
            judges: BTreeMap::new(),
            calls: Mutex::new(Vec::new()),
            per_tool: Mutex::new(BTreeMap::new()),
            in_flight: Arc::new(AtomicUsize::new(0)),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            effect_free: std::collections::BTreeSet::new(),
        }
    }

    /// Answers [`ToolHost::effect_free`] with `true` for the tool `name`
    /// (as the sandbox does for a pure component granted no network and
    /// no writable mount); every other tool keeps the write-ahead path.
    pub fn effect_free(mut self, name: &str) -> ScriptedTools {
        self.effect_free.insert(name.to_owned());
        self
    }

    /// A tool `name` at version 1.0.0: `answer` gets the call and how many
    /// calls of this tool came before it (0 for the first).
    pub fn tool(
        mut self,
        name: &str,
        effect: EffectClass,
        answer: impl Fn(&ToolCall, u32) -> Result<Value, Failure> + Send + Sync + 'static,
    ) -> ScriptedTools {
        self.tools.insert(info(name, effect));
        self.acts
            .insert(name.to_owned(), Act::Answer(Arc::new(answer)));
        self
    }

    /// A pure tool answering its arguments back.
    pub fn echo(self, name: &str) -> ScriptedTools {
        self.tool(name, EffectClass::Pure, |call, _| Ok(call.args.clone()))
    }

    /// A pure tool that fails `failures` times (with `class`), then echoes.
    pub fn flaky(self, name: &str, failures: u32, class: FailureClass) -> ScriptedTools {
        self.tool(name, EffectClass::Pure, move |call, n| {
            if n < failures {
                Err(Failure::new(class, format!("scripted failure {}", n + 1)))
            } else {
                Ok(call.args.clone())
            }
        })
    }

    /// A tool whose calls never answer: only cancelling them ends them.
    pub fn hanging(mut self, name: &str) -> ScriptedTools {
        self.tools.insert(info(name, EffectClass::Pure));
        self.acts.insert(name.to_owned(), Act::Hang);
        self
    }

    /// A workflow registered as the tool `name`: a call runs `version` as
    /// a child run (the version must be added to the loader).
    pub fn workflow_tool(mut self, name: &str, version: WorkflowVersion) -> ScriptedTools {
        let mut i = info(name, EffectClass::Idempotent);
        i.version = semver::Version::new(0, 0, 0);
        i.digest = version.to_string();
        i.workflow = Some(version);
        self.tools.insert(i);
        self
    }

    /// A tool whose calls wait at a gate: each call goes through once the
    /// test lets one more pass ([`ScriptedTools::open_gate`]), then echoes.
    pub fn gated(mut self, name: &str) -> ScriptedTools {
        self.tools.insert(info(name, EffectClass::Pure));
        self.acts.insert(name.to_owned(), Act::Gated);
        self
    }

    /// Lets `n` more calls of gated tools through.
    pub fn open_gate(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// A tool whose every call outlasts the time limit it is given: it
    /// fails as a sandbox's call does when its timeout fires, naming the
    /// limit it was given (so a test sees which timeout reached the host).
    pub fn timing_out(self, name: &str) -> ScriptedTools {
        self.tool(name, EffectClass::Pure, |call, _| {
            Err(Failure::new(
                FailureClass::Timeout,
                format!(
                    "scripted: did not answer within the call's {} ms limit",
                    call.timeout.as_millis()
                ),
            ))
        })
    }

    /// A verifier `name` at version 1.0.0.
    pub fn verifier(
        mut self,
        name: &str,
        judge: impl Fn(&VerifierCall) -> Verdict + Send + Sync + 'static,
    ) -> ScriptedTools {
        self.verifiers.insert(info(name, EffectClass::Pure));
        self.judges.insert(name.to_owned(), Arc::new(judge));
        self
    }

    /// Every tool call made, in order.
    pub fn calls(&self) -> Vec<ToolCall> {
        lock(&self.calls).clone()
    }

    /// Calls of one tool.
    pub fn calls_of(&self, name: &str) -> Vec<ToolCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.tool.name == name)
            .collect()
    }

    /// Tool calls running right now (a cancelled call stops counting when
    /// its future is dropped).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

impl ToolRegistry for ScriptedTools {
    fn resolve_tool(&self, tool: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.tools.resolve(tool)
    }
}

impl VerifierRegistry for ScriptedTools {
    fn resolve_verifier(&self, verifier: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.verifiers.resolve(verifier)
    }
}

/// Counts a call as in flight until it is dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl ToolHost for ScriptedTools {
    fn effect_free(&self, tool: &ToolIdentity) -> bool {
        self.effect_free.contains(&tool.name)
    }

    async fn invoke(&self, call: ToolCall) -> ToolResult {
        lock(&self.calls).push(call.clone());
        let n = {
            let mut per = lock(&self.per_tool);
            let n = per.entry(call.tool.name.clone()).or_default();
            *n += 1;
            *n - 1
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _guard = InFlight(self.in_flight.clone());
        let outcome = match self.acts.get(&call.tool.name) {
            Some(Act::Answer(answer)) => answer(&call, n),
            Some(Act::Hang) => std::future::pending().await,
            Some(Act::Gated) => match self.gate.acquire().await {
                Ok(pass) => {
                    pass.forget();
                    Ok(call.args.clone())
                }
                Err(_) => Err(Failure::new(FailureClass::Unavailable, "the gate closed")),
            },
            None => Err(Failure::new(
                FailureClass::Unavailable,
                format!("tool `{}` is not scripted", call.tool.name),
            )),
        };
        ToolResult {
            record: serde_json::json!({
                "scripted": call.tool.name,
                "call": n,
                "idempotency_key": call.idempotency_key,
            }),
            outcome,
            capabilities: Vec::new(),
        }
    }

    async fn verify(&self, call: VerifierCall) -> VerifierResult {
        let outcome = match self.judges.get(&call.verifier.name) {
            Some(judge) => Ok(judge(&call)),
            None => Err(Failure::new(
                FailureClass::Unavailable,
                format!("verifier `{}` is not scripted", call.verifier.name),
            )),
        };
        VerifierResult {
            outcome,
            record: serde_json::json!({"scripted": call.verifier.name}),
        }
    }
}

// ----------------------------------------------------------------- loader

/// Workflows validated against a [`ScriptedTools`] and held in memory.
#[derive(Debug, Default)]
pub struct MemoryLoader {
    workflows: Mutex<MemoryWorkflows>,
    runnables: Mutex<BTreeMap<WorkflowVersion, Arc<Runnable>>>,
}

impl MemoryLoader {
    pub fn new() -> Arc<MemoryLoader> {
        Arc::new(MemoryLoader::default())
    }

    /// Validates `def` against `tools` and the workflows added before it
    /// (its sub-workflows), and keeps it.
    pub fn add(
        &self,
        def: &WorkflowDef,
        tools: &ScriptedTools,
    ) -> Result<Arc<Runnable>, Vec<ValidationError>> {
        let validated = {
            let workflows = lock(&self.workflows);
            poimen_workflow::validate(
                def,
                &Registries {
                    tools,
                    verifiers: tools,
                    workflows: &*workflows,
                },
            )?
        };
        let runnable = Arc::new(Runnable::new(validated));
        lock(&self.workflows).insert(runnable.version, def.clone());
        lock(&self.runnables).insert(runnable.version, runnable.clone());
        Ok(runnable)
    }
}

#[async_trait]
impl WorkflowLoader for MemoryLoader {
    async fn load(&self, version: &WorkflowVersion) -> Result<Arc<Runnable>, Failure> {
        lock(&self.runnables).get(version).cloned().ok_or_else(|| {
            Failure::new(
                FailureClass::Unavailable,
                format!("version {version} is not held by this loader"),
            )
        })
    }
}
