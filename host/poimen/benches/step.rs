//! What the interpreter adds per step, and what durability costs.
//!
//! - `tool_call/sandbox`: one call of the pure `json` tool straight through
//!   the sandbox — the floor every interpreted tool step pays.
//! - `run/ephemeral/{1,10}` and `run/durable/{1,10}`: a whole run of a chain
//!   of 1 or 10 pure tool steps, on the in-memory store (`durable: false`)
//!   and on SQLite. The per-step cost is the slope, (t10 − t1) / 9, which
//!   cancels the run's fixed start and finish.
//! - `fsync/4KiB`: a raw 4 KiB append + fsync on the same disk, in the same
//!   run — the unit a durable tool step is measured against (target: a
//!   durable step costs no more than 3 fsyncs more than an ephemeral one).
//!
//! - `paired`: the same runs and fsync timed back to back in each of 40
//!   rounds, the ratio taken per round — robust to the disk's drift (see
//!   [`paired`]); prints one line for tool steps and one for model steps
//!   (a chain of model steps answered by the scripted provider: what the
//!   model-call intent costs, without a provider's latency).
//!
//! - `flat`: an ephemeral step against a bare sandbox call, and per-step
//!   cost in a 10-step chain, a 1000-step chain and over 1 MiB of state
//!   (kernel overhead; see [`flat`]).
//! - `concurrent`: durable tool steps per second with 64 runs in flight
//!   at once against one run at a time (group commit; see [`concurrent`]).
//! - `profile-chain`: the 10-step chain of `flat` alone, many times, for a
//!   profiler (run only when named; see [`profile_chain`]).
//!
//! `cargo bench -p poimen --bench step`. Files live under Cargo's per-target temporary
//! directory, on the disk of the target dir (not a tmpfs, where fsync is free).

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use poimen::wiring::Wiring;
use poimen_executor::model::{Rule, ScriptedProvider};
use poimen_executor::{Executor, StartOptions, SystemClock};
use poimen_sandbox::ToolRequest;
use poimen_store::{RunStatus, SqliteStore, Store};
use poimen_workflow::{StepDef, ToolRef, WorkflowDef};
use serde_json::json;

fn bench_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("executor-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

fn json_tool() -> ToolRef {
    ToolRef::parse("json@^0.1").expect("tool ref")
}

/// A chain of `n` pure tool steps, each selecting from the previous output.
fn chain(n: usize, durable: bool) -> WorkflowDef {
    let mut def = WorkflowDef::new(format!("bench.chain{n}{}", if durable { "d" } else { "e" }))
        .with_durable(durable);
    for i in 0..n {
        let value = if i == 0 {
            json!({"n": "{{ inputs.n }}"})
        } else {
            json!(format!("{{{{ steps.s{}.output }}}}", i - 1))
        };
        def = def.with_step(StepDef::tool(
            format!("s{i}"),
            json_tool(),
            json!({"value": value, "select": ""}),
        ));
        if i > 0 {
            def = def.with_edge(format!("s{}", i - 1), format!("s{i}"));
        }
    }
    def
}

/// A step that writes `inputs.big` into the declared state key `big`,
/// then a chain of `n` pure tool steps: a run whose state holds the input.
fn big_state_chain(n: usize) -> WorkflowDef {
    let mut def = WorkflowDef::new(format!("bench.big{n}"))
        .with_durable(false)
        .with_state(
            "big",
            poimen_workflow::StateDecl::reduced(poimen_workflow::Reducer::Overwrite),
        )
        .with_step(
            StepDef::tool(
                "fill",
                json_tool(),
                json!({"value": "{{ inputs.big }}", "select": ""}),
            )
            .with_writes("big"),
        );
    let mut prev = "fill".to_owned();
    for i in 0..n {
        let id = format!("s{i}");
        def = def
            .with_step(StepDef::tool(
                id.as_str(),
                json_tool(),
                json!({"value": {"n": "{{ inputs.n }}"}, "select": ""}),
            ))
            .with_edge(prev.as_str(), id.as_str());
        prev = id;
    }
    def
}

/// A chain of `n` model steps, each prompt naming the previous answer.
fn model_chain(n: usize, durable: bool) -> WorkflowDef {
    let mut def = WorkflowDef::new(format!("bench.model{n}{}", if durable { "d" } else { "e" }))
        .with_durable(durable);
    for i in 0..n {
        let prompt = if i == 0 {
            "Say ok about {{ inputs.n }}".to_owned()
        } else {
            format!("Again: {{{{ steps.m{}.output }}}}", i - 1)
        };
        def = def.with_step(StepDef::model(format!("m{i}").as_str(), prompt));
        if i > 0 {
            def = def.with_edge(format!("m{}", i - 1), format!("m{i}"));
        }
    }
    def
}

struct Bench {
    wiring: Wiring,
    exec: Executor,
    sqlite: Arc<SqliteStore>,
}

async fn setup(dir: &std::path::Path) -> Bench {
    let sqlite = Arc::new(
        SqliteStore::open(dir.join("poimen.db"))
            .await
            .expect("store"),
    );
    let store: Arc<dyn Store> = sqlite.clone();
    let mut b = poimen_sandbox::PluginHost::builder().cache_dir(dir.join("cache"));
    for p in plugin_artifacts::BUNDLED {
        b = b.component_bytes(format!("bundled:{}", p.ident), p.bytes);
    }
    let sandbox = b.withhold_ungranted(true).build().await.expect("sandbox");
    let wiring = Wiring::new(
        store,
        sandbox,
        Arc::new(ScriptedProvider::new(vec![Rule::contains("", "ok")])),
        Arc::new(SystemClock),
        poimen_executor::ExecutorConfig::host("local"),
    );
    Bench {
        exec: wiring.executor.clone(),
        wiring,
        sqlite,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

impl Bench {
    /// The chain of `n` tool steps, validated and ready to run.
    fn prepare(
        &self,
        rt: &tokio::runtime::Runtime,
        n: usize,
        durable: bool,
    ) -> Arc<poimen_executor::Runnable> {
        self.ready(rt, &chain(n, durable))
    }

    /// `def`, validated and ready to run.
    fn ready(
        &self,
        rt: &tokio::runtime::Runtime,
        def: &WorkflowDef,
    ) -> Arc<poimen_executor::Runnable> {
        rt.block_on(async {
            let w = &self.wiring;
            let validated = poimen::check(&*w.store, &w.sandbox, def)
                .await
                .expect("validates");
            w.loader.runnable(validated)
        })
    }
}

/// A file for raw fsyncs; [`fsync_page`] appends to it.
fn fsync_file(path: PathBuf) -> std::fs::File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("fsync file")
}

/// One 4 KiB append + `fdatasync`: the unit of the target.
fn fsync_page(f: &mut std::fs::File) {
    f.write_all(&[7u8; 4096]).expect("write");
    f.sync_data().expect("fsync");
}

/// Whether a section printed as one line (`paired`, `concurrent`, `flat`)
/// runs: only under `cargo bench` (not `--test`), and only when the
/// command line's filter, if any, is part of its name.
fn section_wanted(name: &str) -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.iter().find(|a| !a.starts_with('-'));
    args.iter().any(|a| a == "--bench") && filter.is_none_or(|f| name.contains(f.as_str()))
}

/// Runs `r` on `input` `reps` times, one after another: the median, in µs.
fn median_run(
    rt: &tokio::runtime::Runtime,
    exec: &Executor,
    r: &Arc<poimen_executor::Runnable>,
    input: &serde_json::Value,
    reps: usize,
) -> f64 {
    let v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            let out = rt
                .block_on(exec.run(r.clone(), input.clone(), StartOptions::default()))
                .expect("run");
            assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    quartile(&v, 2)
}

/// The `k`-th quartile of `v` (2: the median).
fn quartile(v: &[f64], k: usize) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[k * (v.len() - 1) / 4]
}

fn benches(c: &mut Criterion) {
    let rt = runtime();
    let dir = bench_dir();
    let b = rt.block_on(setup(&dir));

    c.bench_function("tool_call/sandbox", |bench| {
        bench.to_async(&rt).iter(|| async {
            let inv = b
                .wiring
                .sandbox
                .invoke_tool(ToolRequest::new(
                    json_tool(),
                    json!({"value": {"n": 1}, "select": ""}),
                    "bench",
                ))
                .await;
            black_box(inv.outcome.expect("json tool"))
        })
    });

    let mut group = c.benchmark_group("run");
    group.measurement_time(Duration::from_secs(8));
    for durable in [false, true] {
        for n in [1usize, 10] {
            let prepared = b.prepare(&rt, n, durable);
            let label = if durable { "durable" } else { "ephemeral" };
            group.bench_with_input(BenchmarkId::new(label, n), &n, |bench, _| {
                bench.to_async(&rt).iter(|| async {
                    let out = b
                        .exec
                        .run(prepared.clone(), json!({"n": 1}), StartOptions::default())
                        .await
                        .expect("run");
                    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
                    black_box(out)
                })
            });
        }
    }
    group.finish();

    let mut f = fsync_file(dir.join("fsync.bin"));
    c.bench_function("fsync/4KiB", |bench| bench.iter(|| fsync_page(&mut f)));
}

/// The durable step in fsyncs, measured pairwise. The disk's fsync latency
/// drifts (a shared virtual disk moves by a third within minutes), so the
/// ratio of two medians taken minutes apart is noisy. Here every round times
/// the four runs and the raw fsync back to back and takes that round's
/// ratio; the median over the rounds is the figure BENCHMARKS.md reports.
/// Printed as one line; runs only under `cargo bench` (not `--test`) and
/// only when the filter admits `paired`.
fn paired(_: &mut Criterion) {
    if !section_wanted("paired") {
        return;
    }
    let rt = runtime();
    let dir = bench_dir();
    let b = rt.block_on(setup(&dir));
    let (e1, e10) = (b.prepare(&rt, 1, false), b.prepare(&rt, 10, false));
    let (d1, d10) = (b.prepare(&rt, 1, true), b.prepare(&rt, 10, true));
    let model = |n, durable| b.ready(&rt, &model_chain(n, durable));
    let (me1, me10, md1, md10) = (
        model(1, false),
        model(10, false),
        model(1, true),
        model(10, true),
    );
    // Times one run of `prepared`, in µs: the median of `reps`.
    let time_run = |prepared: &Arc<poimen_executor::Runnable>, reps: usize| {
        median_run(&rt, &b.exec, prepared, &json!({"n": 1}), reps)
    };
    let mut f = fsync_file(dir.join("paired-fsync.bin"));
    let mut time_fsync = |reps: usize| {
        let v: Vec<f64> = (0..reps)
            .map(|_| {
                let t = std::time::Instant::now();
                fsync_page(&mut f);
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        quartile(&v, 2)
    };
    // Warm up: compile caches, the store's first pages.
    for a in [&e1, &e10, &d1, &d10, &me1, &me10, &md1, &md10] {
        time_run(a, 5);
    }
    let (rounds, reps) = (40, 5);
    let (mut ratios, mut eph, mut dur, mut fs) = (vec![], vec![], vec![], vec![]);
    let (mut m_ratios, mut m_eph, mut m_dur) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let ds = (time_run(&d10, reps) - time_run(&d1, reps)) / 9.0;
        let es = (time_run(&e10, reps) - time_run(&e1, reps)) / 9.0;
        let mds = (time_run(&md10, reps) - time_run(&md1, reps)) / 9.0;
        let mes = (time_run(&me10, reps) - time_run(&me1, reps)) / 9.0;
        let fsync = time_fsync(4 * reps);
        ratios.push((ds - es) / fsync);
        eph.push(es);
        dur.push(ds);
        m_ratios.push((mds - mes) / fsync);
        m_eph.push(mes);
        m_dur.push(mds);
        fs.push(fsync);
    }
    println!(
        "paired ({rounds} rounds): per step ephemeral {:.0} µs, durable {:.0} µs, fsync {:.0} µs; \
         durable − ephemeral in fsyncs of the same round: median {:.2} (quartiles {:.2}–{:.2})",
        quartile(&eph, 2),
        quartile(&dur, 2),
        quartile(&fs, 2),
        quartile(&ratios, 2),
        quartile(&ratios, 1),
        quartile(&ratios, 3),
    );
    println!(
        "paired model steps ({rounds} rounds): per step ephemeral {:.0} µs, durable {:.0} µs; \
         durable − ephemeral in fsyncs of the same round: median {:.2} (quartiles {:.2}–{:.2})",
        quartile(&m_eph, 2),
        quartile(&m_dur, 2),
        quartile(&m_ratios, 2),
        quartile(&m_ratios, 1),
        quartile(&m_ratios, 3),
    );
}

/// Group commit (issue 16, target 3): durable tool steps per second with
/// 64 runs of a 10-step chain in flight at once, against one run at a time
/// — both on the same SQLite store, in each of `ROUNDS` rounds, medians
/// reported — and the same 64 runs ephemeral (in-memory store), which is
/// what the two cores allow without any store at all. Also prints how many
/// commits each write transaction carried. Printed as one line; runs only
/// under `cargo bench` and only when the filter admits `concurrent`.
fn concurrent(_: &mut Criterion) {
    if !section_wanted("concurrent") {
        return;
    }
    const ROUNDS: usize = 7;
    const RUNS: usize = 64;
    const EACH: usize = 3;
    let rt = runtime();
    let dir = bench_dir();
    let b = rt.block_on(setup(&dir));
    let (d10, e10) = (b.prepare(&rt, 10, true), b.prepare(&rt, 10, false));
    // Steps per second of `tasks` tasks each running `each` runs of `r`.
    let rate = |r: &Arc<poimen_executor::Runnable>, tasks: usize, each: usize| {
        rt.block_on(async {
            let t = std::time::Instant::now();
            let mut handles = Vec::new();
            for _ in 0..tasks {
                let (exec, r) = (b.exec.clone(), r.clone());
                handles.push(tokio::spawn(async move {
                    for _ in 0..each {
                        let out = exec
                            .run(r.clone(), json!({"n": 1}), StartOptions::default())
                            .await
                            .expect("run");
                        assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
                    }
                }));
            }
            for h in handles {
                h.await.expect("task");
            }
            (tasks * each * 10) as f64 / t.elapsed().as_secs_f64()
        })
    };
    rate(&d10, 1, 3);
    rate(&d10, RUNS, 1);
    let (mut seq, mut con, mut eph, mut ratio, mut per_tx) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        let s = rate(&d10, 1, 20);
        let before = b.sqlite.writer_stats();
        let c = rate(&d10, RUNS, EACH);
        let after = b.sqlite.writer_stats();
        eph.push(rate(&e10, RUNS, EACH));
        seq.push(s);
        con.push(c);
        ratio.push(c / s);
        per_tx.push(
            (after.commits - before.commits) as f64
                / (after.transactions - before.transactions).max(1) as f64,
        );
    }
    println!(
        "concurrent ({ROUNDS} rounds): durable tool steps/s, 1 run at a time {:.0}, {RUNS} runs \
         at once {:.0} (ratio {:.1}, quartiles {:.1}–{:.1}), commits per transaction {:.1}; \
         {RUNS} runs at once ephemeral {:.0} steps/s",
        quartile(&seq, 2),
        quartile(&con, 2),
        quartile(&ratio, 2),
        quartile(&ratio, 1),
        quartile(&ratio, 3),
        quartile(&per_tx, 2),
        quartile(&eph, 2),
    );
}

/// Kernel overhead (issue 16, target 1): an ephemeral pure tool step
/// against a bare sandbox call of the same tool, and how the per-step cost
/// moves with run length and state size — in each of `ROUNDS` rounds:
/// - the sandbox call alone (`json`, median of 200);
/// - per step of a 10-step chain: (t10 − t1) / 9;
/// - per step of a 1000-step chain: (t1000 − t1) / 999;
/// - per step of a 1000-step chain after a step that wrote 1 MiB into the
///   declared state: (t(fill+1000) − t(fill+1)) / 999 (over 999 steps, not
///   9 or 99: the `fill` run's own cost — its copies of the 1 MiB faulting
///   pages in or not, as the allocator left them — varies by milliseconds
///   from run to run, which 99 steps do not outweigh).
///
/// Medians over the rounds, ratios taken per round. Printed as one line;
/// runs only under `cargo bench` and only when the filter admits `flat`.
fn flat(_: &mut Criterion) {
    if !section_wanted("flat") {
        return;
    }
    const ROUNDS: usize = 9;
    let rt = runtime();
    let dir = bench_dir();
    let b = rt.block_on(setup(&dir));
    let (c1, c10, c1000) = (
        b.prepare(&rt, 1, false),
        b.prepare(&rt, 10, false),
        b.prepare(&rt, 1000, false),
    );
    let (big1, big1000) = (
        b.ready(&rt, &big_state_chain(1)),
        b.ready(&rt, &big_state_chain(1000)),
    );
    let big = json!({"n": 1, "big": "x".repeat(1 << 20)});
    let small = json!({"n": 1});
    let time_run = |r: &Arc<poimen_executor::Runnable>, input: &serde_json::Value, reps: usize| {
        median_run(&rt, &b.exec, r, input, reps)
    };
    let time_call = |reps: usize| {
        let v: Vec<f64> = (0..reps)
            .map(|_| {
                let t = std::time::Instant::now();
                let inv = rt.block_on(b.wiring.sandbox.invoke_tool(ToolRequest::new(
                    json_tool(),
                    json!({"value": {"n": 1}, "select": ""}),
                    "bench",
                )));
                black_box(inv.outcome.expect("json tool"));
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        quartile(&v, 2)
    };
    for r in [&c1, &c10, &c1000] {
        time_run(r, &small, 2);
    }
    for r in [&big1, &big1000] {
        time_run(r, &big, 2);
    }
    let (mut call, mut s10, mut s1000, mut sbig) = (vec![], vec![], vec![], vec![]);
    let (mut r10, mut r1000, mut rbig) = (vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        let c = time_call(200);
        let t1 = time_run(&c1, &small, 15);
        let p10 = (time_run(&c10, &small, 15) - t1) / 9.0;
        let p1000 = (time_run(&c1000, &small, 1) - t1) / 999.0;
        let pbig = (time_run(&big1000, &big, 3) - time_run(&big1, &big, 3)) / 999.0;
        call.push(c);
        s10.push(p10);
        s1000.push(p1000);
        sbig.push(pbig);
        r10.push(p10 / c);
        r1000.push(p1000 / p10);
        rbig.push(pbig / p10);
    }
    println!(
        "flat ({ROUNDS} rounds): sandbox call {:.1} µs; ephemeral per step: 10-step chain {:.1} µs \
         ({:.2}× the call), 1000-step chain {:.1} µs ({:.2}× the 10-step), 1000 steps over 1 MiB \
         of state {:.1} µs ({:.2}× the 10-step)",
        quartile(&call, 2),
        quartile(&s10, 2),
        quartile(&r10, 2),
        quartile(&s1000, 2),
        quartile(&r1000, 2),
        quartile(&sbig, 2),
        quartile(&rbig, 2),
    );
}

/// `step-* --bench profile-chain`: nothing but the ephemeral 10-step chain
/// of `flat`, 3 000 runs of it, and its per-step figure — for `perf record`
/// to sample ordinary steps only (a profile of `flat` is dominated by its
/// 1 MiB `fill` steps, which cancel out of its slopes). Runs only when
/// named: a plain `cargo bench` skips it.
fn profile_chain(_: &mut Criterion) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "profile-chain") || !section_wanted("profile-chain") {
        return;
    }
    let rt = runtime();
    let dir = bench_dir();
    let b = rt.block_on(setup(&dir));
    let (c1, c10) = (b.prepare(&rt, 1, false), b.prepare(&rt, 10, false));
    let small = json!({"n": 1});
    median_run(&rt, &b.exec, &c10, &small, 20);
    let t1 = median_run(&rt, &b.exec, &c1, &small, 300);
    let t10 = median_run(&rt, &b.exec, &c10, &small, 3000);
    println!(
        "profile-chain: 10-step chain {:.1} µs a step ((t10 − t1) / 9 over 3000 and 300 runs)",
        (t10 - t1) / 9.0
    );
}

criterion_group! {
    name = step;
    config = Criterion::default().sample_size(30);
    targets = benches, paired, concurrent, flat, profile_chain
}
criterion_main!(step);
