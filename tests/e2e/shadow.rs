//! Shadow evaluation end to end: a real host over a real SQLite store runs
//! the README's workflow; candidates are evaluated against those recorded
//! runs through the library API and through `poimen shadow`.

use std::collections::BTreeMap;
use std::path::Path;

use poimen::shadow::{ModelMode, Ranking, Selection, ShadowError, ShadowOptions, StepDiff};
use poimen::{Host, Target};
use serde_json::{Value, json};

use crate::support::{Env, fixture, shared_cache};

const POLICY: &str = r#"
[plugins.ledger]
fs-write = { "/ledger" = "./ledger" }
"#;

const INPUTS: &[&str] = &[
    "Please refund $40 to ana@example.com, cc bo@example.org",
    "Hello there, nothing to see",
    "A refund for carl@example.net please",
    "Two words",
];

async fn host(env: &Env) -> Host {
    std::fs::create_dir_all(env.path().join("ledger")).expect("ledger dir");
    let policy = env.write("policy.toml", POLICY);
    Host::builder()
        .store_path(env.path().join(".poimen/poimen.db"))
        .cache_dir(shared_cache())
        .policy_file(policy)
        .build()
        .await
        .expect("host")
}

/// Runs the README workflow on every input; returns its version.
async fn record_baseline(host: &Host) -> String {
    let target = Target::File(fixture("examples/text-report.yaml"));
    let mut version = None;
    for text in INPUTS {
        let out = host
            .run(&target, json!({ "text": text }), Default::default())
            .await
            .expect("baseline run");
        assert_eq!(
            out.status,
            poimen::store::RunStatus::Completed,
            "{:?}",
            out.reason
        );
        let (rec, _) = host.status(&out.run).await.expect("status");
        version = Some(rec.version.to_string());
    }
    version.expect("a version")
}

fn opts() -> ShadowOptions {
    ShadowOptions {
        selection: Selection::Latest(100),
        models: ModelMode::Replay,
        tools: Default::default(),
        workers: 2,
        progress: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_a_reformatted_candidate_is_the_baseline_and_ties_everywhere() {
    let env = Env::new();
    let host = host(&env).await;
    let baseline = record_baseline(&host).await;
    let report = host
        .shadow(
            &Target::File(fixture("shadow/text-report.reformatted.json")),
            &baseline,
            &opts(),
        )
        .await
        .expect("shadow");
    assert!(report.same_version, "formatting is not meaning");
    assert_eq!(report.candidate.to_string(), baseline);
    assert!(report.version_diff.is_empty(), "{:?}", report.version_diff);
    let a = &report.aggregate;
    assert_eq!(
        (a.runs, a.ties, a.wins, a.losses),
        (INPUTS.len(), INPUTS.len(), 0, 0)
    );
    assert_eq!(a.outputs_equal, INPUTS.len());
    for r in &report.runs {
        assert!(r.output_equal && r.episode_diff.is_empty(), "{r:#?}");
        assert_eq!(r.output_diff, json!([]));
        assert_eq!(r.verdict, Ranking::Tie);
    }
}

/// The report as JSON without its volatile fields and without what says
/// how tool calls were answered.
fn outcomes_only(report: &poimen::shadow::ShadowReport) -> Value {
    let mut v = without_volatile(report);
    v["tools"] = Value::Null;
    for run in v["runs"].as_array_mut().expect("runs") {
        run["tools"] = Value::Null;
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_takes_repeatable_calls_from_the_record_and_changes_no_outcome() {
    let env = Env::new();
    let host = host(&env).await;
    let baseline = record_baseline(&host).await;
    let reformatted = Target::File(fixture("shadow/text-report.reformatted.json"));
    // The README's tools (`text`, `json`) and its verifier (`json-schema`)
    // are pure and granted nothing: every call the candidate makes, the
    // baseline made identically — four tool calls (words, emails, flag or
    // pass, report) and two verdicts a run, none run again.
    let replayed = host
        .shadow(&reformatted, &baseline, &opts())
        .await
        .expect("shadow");
    for r in &replayed.runs {
        assert_eq!(
            (
                r.tools.reused,
                r.tools.verdicts_reused,
                r.tools.replayed,
                r.tools.live
            ),
            (4, 2, 0, 0),
            "{r:#?}"
        );
    }
    assert!(
        render_text_of(&replayed)
            .contains("16 tool call(s) and 8 verdict(s) taken from its record"),
        "{}",
        render_text_of(&replayed)
    );
    // `--tools live` runs them all again: the same report in every outcome.
    let mut live = opts();
    live.tools = poimen::shadow::ToolMode::Live;
    let again = host
        .shadow(&reformatted, &baseline, &live)
        .await
        .expect("shadow");
    for r in &again.runs {
        assert_eq!((r.tools.reused, r.tools.verdicts_reused), (0, 0), "{r:#?}");
    }
    assert_eq!(outcomes_only(&replayed), outcomes_only(&again));
    // A changed argument is a call the baseline never made: it runs, and so
    // does every call downstream whose arguments it changed. The runs that
    // took `flag` reuse `words` and `emails` and their one verdict; `flag`
    // and `report` (and report's verdict) ran.
    let changed = host
        .shadow(
            &Target::File(fixture("shadow/text-report.changed-arg.yaml")),
            &baseline,
            &opts(),
        )
        .await
        .expect("shadow");
    for r in &changed.runs {
        let expected = if r.output_equal { (4, 2) } else { (2, 1) };
        assert_eq!(
            (r.tools.reused, r.tools.verdicts_reused),
            expected,
            "{r:#?}"
        );
    }
    let mut live = opts();
    live.tools = poimen::shadow::ToolMode::Live;
    let changed_live = host
        .shadow(
            &Target::File(fixture("shadow/text-report.changed-arg.yaml")),
            &baseline,
            &live,
        )
        .await
        .expect("shadow");
    assert_eq!(outcomes_only(&changed), outcomes_only(&changed_live));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_a_changed_tool_argument_shows_in_the_output_and_episode_diffs() {
    let env = Env::new();
    let host = host(&env).await;
    let baseline = record_baseline(&host).await;
    let report = host
        .shadow(
            &Target::File(fixture("shadow/text-report.changed-arg.yaml")),
            &baseline,
            &opts(),
        )
        .await
        .expect("shadow");
    assert!(!report.same_version);
    assert!(
        report.version_diff.iter().any(|c| c.contains("flag")),
        "{:?}",
        report.version_diff
    );
    // Runs whose text has an email address and asks for money took `flag`:
    // their output changed, and so did that step's input and output.
    let flagged: Vec<_> = report.runs.iter().filter(|r| !r.output_equal).collect();
    assert_eq!(flagged.len(), 2, "{:#?}", report.runs);
    for r in &flagged {
        let ops = r.output_diff.as_array().expect("patch");
        assert!(
            ops.iter().any(|op| op["path"] == json!("/text")
                && op["value"]
                    .as_str()
                    .is_some_and(|t| t.contains("[redacted]"))),
            "{ops:?}"
        );
        assert!(
            r.episode_diff.iter().any(|d| matches!(d,
                StepDiff::Changed { step, fields, .. }
                    if step == "flag" && fields.contains(&"input".to_owned()) && fields.contains(&"output".to_owned()))),
            "{:#?}",
            r.episode_diff
        );
    }
    // The others did not change at all.
    for r in report.runs.iter().filter(|r| r.output_equal) {
        assert!(r.episode_diff.is_empty(), "{:#?}", r.episode_diff);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_a_changed_verifier_shows_as_losses_with_the_verdicts() {
    let env = Env::new();
    let host = host(&env).await;
    let baseline = record_baseline(&host).await;
    let report = host
        .shadow(
            &Target::File(fixture("shadow/text-report.changed-verifier.yaml")),
            &baseline,
            &opts(),
        )
        .await
        .expect("shadow");
    let a = &report.aggregate;
    assert_eq!(a.losses, INPUTS.len(), "{a:?}");
    assert!(a.mean_delta < 0.0 && a.ci95.1 <= 0.0, "{a:?}");
    for r in &report.runs {
        assert_eq!(r.verdict, Ranking::Loss);
        assert_eq!(r.candidate_status, poimen::store::RunStatus::Failed);
        assert!(
            r.episode_diff.iter().any(|d| matches!(d,
                StepDiff::Changed { step, fields, candidate, .. }
                    if step == "words" && fields.contains(&"verdicts".to_owned())
                        && candidate.verdicts.iter().any(|v| v.ends_with("fail")))),
            "{:#?}",
            r.episode_diff
        );
    }
    // Regressions first, then by run id: all are losses of equal delta.
    let ids: Vec<&str> = report.runs.iter().map(|r| r.run.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
}

/// Every table of the SQLite store: row count and a hash of its rows.
fn table_digests(db: &Path) -> BTreeMap<String, (i64, String)> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open live store");
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .expect("tables")
        .query_map([], |r| r.get(0))
        .expect("tables")
        .collect::<Result<_, _>>()
        .expect("tables");
    let mut out = BTreeMap::new();
    for t in tables {
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM \"{t}\" ORDER BY rowid"))
            .or_else(|_| conn.prepare(&format!("SELECT * FROM \"{t}\"")))
            .expect("select");
        let cols = stmt.column_count();
        let mut hasher = blake3::Hasher::new();
        let mut n = 0i64;
        let mut rows = stmt.query([]).expect("rows");
        while let Some(row) = rows.next().expect("row") {
            n += 1;
            for i in 0..cols {
                let v: rusqlite::types::Value = row.get(i).expect("value");
                hasher.update(format!("{v:?}").as_bytes());
            }
        }
        out.insert(t, (n, hasher.finalize().to_hex().to_string()));
    }
    out
}

fn ledger_digest(env: &Env) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir(env.path().join("ledger")) {
        for e in dir.flatten() {
            let bytes = std::fs::read(e.path()).expect("ledger file");
            out.push((
                e.file_name().to_string_lossy().into_owned(),
                blake3::hash(&bytes).to_hex().to_string(),
            ));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_leaves_the_live_tables_and_the_ledger_byte_identical() {
    let env = Env::new();
    let host = host(&env).await;
    let baseline = record_baseline(&host).await;
    // A live effect, so the ledger file exists.
    let ledger_wf = env.write(
        "ledger.yaml",
        "id: t.ledger\nsteps:\n  - id: append\n    tool: {name: \"ledger@^0.1\", args: {entry: {n: 1}}}\n",
    );
    let out = host
        .run(&Target::File(ledger_wf), json!({}), Default::default())
        .await
        .expect("ledger run");
    assert_eq!(
        out.status,
        poimen::store::RunStatus::Completed,
        "{:?}",
        out.reason
    );
    let db = env.path().join(".poimen/poimen.db");
    let tables_before = table_digests(&db);
    let ledger_before = ledger_digest(&env);
    assert!(!ledger_before.is_empty(), "the ledger file exists");
    assert!(tables_before.get("runs").is_some_and(|(n, _)| *n >= 5));

    for candidate in [
        "shadow/text-report.reformatted.json",
        "shadow/text-report.changed-arg.yaml",
        "shadow/text-report.changed-verifier.yaml",
    ] {
        host.shadow(&Target::File(fixture(candidate)), &baseline, &opts())
            .await
            .expect("shadow");
    }
    // The ineligible candidate is refused before anything runs.
    match host
        .shadow(
            &Target::File(fixture("shadow/ineligible.yaml")),
            &baseline,
            &opts(),
        )
        .await
    {
        Err(poimen::Error::Shadow(ShadowError::Ineligible(report))) => {
            let text = report.to_string();
            assert!(text.contains("record") && text.contains("ledger"), "{text}");
        }
        other => panic!("expected Ineligible, got {other:?}"),
    }
    assert_eq!(table_digests(&db), tables_before, "live tables unchanged");
    assert_eq!(ledger_digest(&env), ledger_before, "ledger unchanged");
}

/// The report as JSON with the fields it lists as volatile blanked.
fn without_volatile(report: &poimen::shadow::ShadowReport) -> Value {
    let mut v = serde_json::to_value(report).expect("json");
    for field in &report.volatile_fields {
        let key = field.strip_prefix("runs[].").expect("a per-run field");
        for run in v["runs"].as_array_mut().expect("runs") {
            run[key] = Value::Null;
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_two_evaluations_of_the_same_runs_report_identically() {
    let env = Env::new();
    let host = host(&env).await;
    let baseline = record_baseline(&host).await;
    let candidate = Target::File(fixture("shadow/text-report.changed-arg.yaml"));
    let mut one = opts();
    one.workers = 1;
    let a = host
        .shadow(&candidate, &baseline, &one)
        .await
        .expect("first");
    let b = host
        .shadow(&candidate, &baseline, &opts())
        .await
        .expect("second");
    assert_eq!(
        a.volatile_fields,
        vec!["runs[].baseline_latency_ms", "runs[].candidate_latency_ms"]
    );
    assert_eq!(without_volatile(&a), without_volatile(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_replays_recorded_model_answers_by_prompt_hash() {
    let env = Env::new();
    let wf = env.write(
        "summarize.yaml",
        "id: t.summarize\nsteps:\n  - id: sum\n    model:\n      prompt: \"Summarize: {{ inputs.text }}\"\n",
    );
    let live = Host::builder()
        .store_path(env.path().join(".poimen/poimen.db"))
        .cache_dir(shared_cache())
        .model(poimen::ModelChoice::Scripted(vec![
            poimen::executor::model::Rule::contains("Summarize", "A summary."),
        ]))
        .build()
        .await
        .expect("host");
    let out = live
        .run(
            &Target::File(wf.clone()),
            json!({"text": "abc"}),
            Default::default(),
        )
        .await
        .expect("run");
    assert_eq!(
        out.status,
        poimen::store::RunStatus::Completed,
        "{:?}",
        out.reason
    );
    let (rec, _) = live.status(&out.run).await.expect("status");
    drop(live);
    // A host with no model at all: replay needs none.
    let host = Host::builder()
        .store_path(env.path().join(".poimen/poimen.db"))
        .cache_dir(shared_cache())
        .build()
        .await
        .expect("host");
    let report = host
        .shadow(&Target::File(wf), &rec.version.to_string(), &opts())
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_eq!(r.models.replayed, 1, "{r:#?}");
    assert_eq!(r.models.missing, 0);
    assert!(r.output_equal && r.verdict == Ranking::Tie, "{r:#?}");
    // A changed prompt has no recorded answer: replay-only fails that step,
    // naming the prompt hash — never a made-up answer.
    let changed = env.write(
        "summarize2.yaml",
        "id: t.summarize\nsteps:\n  - id: sum\n    model:\n      prompt: \"Summarize briefly: {{ inputs.text }}\"\n",
    );
    let report = host
        .shadow(&Target::File(changed), &rec.version.to_string(), &opts())
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_eq!(r.models.missing, 1);
    assert_eq!(r.candidate_status, poimen::store::RunStatus::Failed);
    assert!(
        r.candidate_reason.as_deref().is_some_and(
            |m| m.contains("not replayable: the baseline recorded no answer for request b3:")
        ),
        "{:?}",
        r.candidate_reason
    );
    assert_eq!(r.not_replayable, vec!["sum".to_owned()]);
    assert_eq!(r.verdict, Ranking::Incomparable);
    assert_eq!(report.aggregate.incomparable, 1);
}

/// A model workflow recorded by a scripted host; returns a model-less host
/// over the same store and the baseline's version.
async fn recorded_model_run(env: &Env, wf: &Path) -> (Host, String) {
    let live = Host::builder()
        .store_path(env.path().join(".poimen/poimen.db"))
        .cache_dir(shared_cache())
        .model(poimen::ModelChoice::Scripted(vec![
            poimen::executor::model::Rule::contains("Summarize", "A summary."),
        ]))
        .build()
        .await
        .expect("host");
    let out = live
        .run(
            &Target::File(wf.to_owned()),
            json!({"text": "abc"}),
            Default::default(),
        )
        .await
        .expect("run");
    assert_eq!(
        out.status,
        poimen::store::RunStatus::Completed,
        "{:?}",
        out.reason
    );
    let (rec, _) = live.status(&out.run).await.expect("status");
    drop(live);
    let host = Host::builder()
        .store_path(env.path().join(".poimen/poimen.db"))
        .cache_dir(shared_cache())
        .build()
        .await
        .expect("host");
    (host, rec.version.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_a_changed_system_prompt_is_not_replayable_never_a_tie() {
    let env = Env::new();
    let model = |system: &str| {
        format!(
            "id: t.sys\nsteps:\n  - id: sum\n    model:\n      prompt: \"Summarize: {{{{ inputs.text }}}}\"\n      system: \"{system}\"\n"
        )
    };
    let wf = env.write("sys.yaml", &model("You are terse."));
    let (host, baseline) = recorded_model_run(&env, &wf).await;
    // The same request replays: a tie.
    let report = host
        .shadow(&Target::File(wf), &baseline, &opts())
        .await
        .expect("shadow");
    assert_eq!(
        report.runs[0].verdict,
        Ranking::Tie,
        "{:#?}",
        report.runs[0]
    );
    // The prompt is the same, the system prompt is not: the recorded answer
    // is not the candidate's, and the row says so instead of "tie".
    let changed = env.write("sys2.yaml", &model("You are verbose."));
    let report = host
        .shadow(&Target::File(changed), &baseline, &opts())
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_eq!(r.not_replayable, vec!["sum".to_owned()], "{r:#?}");
    assert_eq!(r.models.replayed, 0);
    assert_ne!(r.verdict, Ranking::Tie);
    assert_eq!(r.verdict, Ranking::Incomparable);
    assert_eq!(
        (report.aggregate.ties, report.aggregate.incomparable),
        (0, 1)
    );
    assert!(render_text_of(&report).contains("not replayable: sum"));
}

fn render_text_of(r: &poimen::shadow::ShadowReport) -> String {
    poimen::shadow::render_text(r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_a_world_reading_tool_replays_the_baseline_unless_tools_live() {
    let env = Env::new();
    // fs-read reads `data/` through the policy; the rubric wants the
    // content the baseline saw.
    std::fs::create_dir_all(env.path().join("data")).expect("data dir");
    std::fs::write(env.path().join("data/note.txt"), "the original note").expect("note");
    let policy = env.write(
        "fs.toml",
        "[plugins.fs-read]\nfs-read = { \"/data\" = \"data\" }\n",
    );
    let wf = env.write(
        "read.yaml",
        "id: t.read\nsteps:\n  - id: read\n    tool: {name: \"fs-read@^0.1\", args: {path: note.txt}}\nrubric:\n  criteria:\n    - name: original\n      verifier: matches@^0.1\n      config: {pointer: /content, regex: original}\n",
    );
    let host = Host::builder()
        .store_path(env.path().join(".poimen/poimen.db"))
        .cache_dir(shared_cache())
        .policy_file(policy)
        .build()
        .await
        .expect("host");
    let out = host
        .run(&Target::File(wf.clone()), json!({}), Default::default())
        .await
        .expect("run");
    assert_eq!(
        out.status,
        poimen::store::RunStatus::Completed,
        "{:?}",
        out.reason
    );
    let (rec, _) = host.status(&out.run).await.expect("status");
    let baseline = rec.version.to_string();
    // The world changes after the baseline ran.
    std::fs::write(env.path().join("data/note.txt"), "a rewritten note").expect("note");
    // By default the identical call answers as the baseline's did: a tie,
    // whatever the file says now.
    let report = host
        .shadow(&Target::File(wf.clone()), &baseline, &opts())
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_eq!(r.verdict, Ranking::Tie, "{r:#?}");
    assert!(r.output_equal);
    assert_eq!((r.tools.replayed, r.tools.live), (1, 0));
    // `--tools live` reads today's file: the rubric fails, a loss — and the
    // report says the calls ran live.
    let mut live = opts();
    live.tools = poimen::shadow::ToolMode::Live;
    let report = host
        .shadow(&Target::File(wf), &baseline, &live)
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_eq!(r.verdict, Ranking::Loss, "{r:#?}");
    assert_eq!((r.tools.replayed, r.tools.live), (0, 1));
    assert_eq!(report.tools, poimen::shadow::ToolMode::Live);
}

#[test]
fn shadow_cli_prints_json_and_writes_a_self_contained_html_report() {
    let env = Env::new();
    let input = r#"{"text": "Please refund $40 to ana@example.com"}"#;
    let (code, out) = env.json(&[
        "run",
        fixture("examples/text-report.yaml").to_str().expect("utf8"),
        "--input",
        input,
    ]);
    assert_eq!(code, 0, "{out}");
    let run = out["run"].as_str().expect("run id").to_owned();
    let (_, st) = env.json(&["status", &run]);
    let version = st["run"]["version"].as_str().expect("version").to_owned();
    let html = env.path().join("report.html");
    let (code, report) = env.json(&[
        "shadow",
        "--candidate",
        fixture("shadow/text-report.changed-arg.yaml")
            .to_str()
            .expect("utf8"),
        "--baseline",
        "examples.text_report@latest",
        "--runs",
        "10",
        "--html",
        html.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["aggregate"]["runs"], json!(1));
    assert_eq!(report["baseline"], json!(version));
    assert_eq!(report["runs"][0]["output_equal"], json!(false));
    let page = std::fs::read_to_string(&html).expect("html report");
    assert!(page.starts_with("<!doctype html>"));
    assert!(page.contains("<svg") && page.contains("Worst regressions"));
    assert!(
        !page.contains("<script") && !page.contains("src=") && !page.contains("href="),
        "self-contained: no scripts, no fetched resources"
    );
    // Refusals are specific and exit 3.
    env.cmd()
        .args([
            "shadow",
            "--candidate",
            fixture("shadow/ineligible.yaml").to_str().expect("utf8"),
            "--baseline",
            &version,
        ])
        .assert()
        .code(3);
    env.cmd()
        .args([
            "shadow",
            "--candidate",
            fixture("examples/text-report.yaml").to_str().expect("utf8"),
            "--baseline",
            &version,
            "--models",
            "sometimes",
        ])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("replay, live or replay-or-live"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_replays_a_recorded_judgment_when_the_request_hash_matches() {
    let env = Env::new();
    let host = host(&env).await;
    let judged = |question: &str| {
        format!(
            "id: t.judged\nsteps:\n  - id: approve\n    judgment:\n      question: \"{question} {{{{ inputs.account }}}}?\"\n      result_schema: {{type: object, properties: {{ok: {{type: boolean}}}}, required: [ok]}}\n  - id: after\n    tool: {{name: \"json@^0.1\", args: {{value: \"{{{{ steps.approve.output }}}}\", select: \"\"}}}}\ntransitions:\n  - {{from: approve, to: after}}\n"
        )
    };
    let wf = env.write("judged.yaml", &judged("Approve"));
    let out = host
        .run(
            &Target::File(wf.clone()),
            json!({"account": "acme"}),
            Default::default(),
        )
        .await
        .expect("run");
    assert_eq!(out.status, poimen::store::RunStatus::WaitingJudgment);
    let j = host.judgments().await.expect("judgments").remove(0);
    let done = host
        .submit_judgment(
            &j.id,
            poimen::JudgmentSubmission {
                request_hash: j.request_hash.clone(),
                result: json!({"ok": true}),
                executor: None,
                profile: None,
                provenance: json!({"judge": "ana"}),
            },
        )
        .await
        .expect("submit");
    assert_eq!(
        done.status,
        poimen::store::RunStatus::Completed,
        "{:?}",
        done.reason
    );
    let (rec, _) = host.status(&done.run).await.expect("status");
    let baseline = rec.version.to_string();

    // The same request: the recorded answer is replayed.
    let report = host
        .shadow(&Target::File(wf), &baseline, &opts())
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_eq!(
        r.candidate_status,
        poimen::store::RunStatus::Completed,
        "{r:#?}"
    );
    assert!(r.unreplayed_judgments.is_empty());
    assert!(r.output_equal && r.verdict == Ranking::Tie);

    // A candidate that changes another step but asks the judge the same
    // thing replays the judgment: the request is keyed by its content, not
    // by the workflow's version.
    let before = env.write(
        "judged-before.yaml",
        &judged("Approve").replace(
            "steps:\n",
            "steps:\n  - id: prep\n    tool: {name: \"json@^0.1\", args: {value: {n: 1}, select: \"\"}}\n",
        ).replace("transitions:\n", "transitions:\n  - {from: prep, to: approve}\n"),
    );
    let report = host
        .shadow(&Target::File(before), &baseline, &opts())
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_ne!(report.candidate, report.baseline, "another version");
    assert!(r.unreplayed_judgments.is_empty(), "{r:#?}");
    assert_eq!(
        r.candidate_status,
        poimen::store::RunStatus::Completed,
        "{r:#?}"
    );

    // Another question is another request: the shadow run waits, and says so.
    let changed = env.write("judged2.yaml", &judged("Really approve"));
    let report = host
        .shadow(&Target::File(changed), &baseline, &opts())
        .await
        .expect("shadow");
    let r = &report.runs[0];
    assert_eq!(
        r.candidate_status,
        poimen::store::RunStatus::WaitingJudgment
    );
    assert_eq!(r.unreplayed_judgments, vec!["approve".to_owned()]);
    assert_eq!(report.aggregate.waiting_judgment, 1);
    // And the live store still has exactly the one judgment, answered.
    assert!(host.judgments().await.expect("judgments").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_scores_both_outputs_by_the_rubric() {
    let env = Env::new();
    let host = host(&env).await;
    // The threshold lets a result missing the redaction (1/3) complete
    // live: the rubric decides runs too, and this test is about scores.
    let rubric = r#"
rubric:
  threshold: 0.3
  criteria:
    - name: redacted
      verifier: matches@^0.1
      config: {pointer: /text, regex: "\\[redacted\\]"}
      weight: 2
    - name: shape
      verifier: json-schema@^0.1
      config:
        schema: {type: object, required: [words]}
"#;
    let base = std::fs::read_to_string(fixture("examples/text-report.yaml")).expect("fixture");
    let changed =
        std::fs::read_to_string(fixture("shadow/text-report.changed-arg.yaml")).expect("fixture");
    let base = env.write("base.yaml", &format!("{base}{rubric}"));
    let cand = env.write("cand.yaml", &format!("{changed}{rubric}"));
    let mut version = String::new();
    for text in INPUTS {
        let out = host
            .run(
                &Target::File(base.clone()),
                json!({ "text": text }),
                Default::default(),
            )
            .await
            .expect("baseline run");
        let (rec, _) = host.status(&out.run).await.expect("status");
        version = rec.version.to_string();
    }
    let report = host
        .shadow(&Target::File(cand), &version, &opts())
        .await
        .expect("shadow");
    assert_eq!(report.scoring, "rubric");
    let a = &report.aggregate;
    assert_eq!((a.wins, a.ties, a.losses), (2, 2, 0), "{a:?}");
    assert!(a.mean_delta > 0.0);
    let names: Vec<&str> = a.criteria.iter().map(|c| c.criterion.as_str()).collect();
    assert_eq!(names, vec!["redacted", "shape"]);
    for r in report.runs.iter().filter(|r| r.verdict == Ranking::Win) {
        let red = r
            .scores
            .iter()
            .find(|s| s.criterion == "redacted")
            .expect("redacted scored");
        assert_eq!((red.baseline, red.candidate), (0.0, 1.0), "{r:#?}");
        // (2·0 + 1·1) / 3 against (2·1 + 1·1) / 3.
        assert!((r.baseline_score - 1.0 / 3.0).abs() < 1e-9, "{r:#?}");
        assert!((r.candidate_score - 1.0).abs() < 1e-9, "{r:#?}");
    }
}
