//! The web console in a real browser: Debian's chromium, driven over
//! WebDriver (chromedriver) by fantoccini, against a real `poimen serve
//! --http` behind a token. Signs in; opens the README workflow's run and a
//! fan-out's, and checks the timeline has a bar per step and a lane per
//! branch; shows markup a workflow and a tool carry as text; answers a
//! waiting judgment through its form (an invalid answer refused with the
//! schema's error shown, then a valid one that runs the workflow to its
//! end); reconciles a blocked non-idempotent call; opens a version diff;
//! and refuses a form posted without its CSRF token. Screenshots of the run
//! page and the judgment form are saved under
//! `target/console-artifacts/`.
//!
//! chromium and chromedriver must be installed (`.ci/run` installs them):
//! the test fails, naming them, when they are not.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::crash;
use crate::http::{ended, publish, serve_http};
use crate::support::{Env, Served, fixture, repo};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver on a free port; killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromedriver() -> Driver {
    for tool in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} is missing: the console's browser tests need Debian's chromium and chromium-driver \
             (`apt-get install chromium chromium-driver`; .ci/run installs them)"
        );
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn chromedriver");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1000"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromium session")
}

fn artifacts() -> PathBuf {
    let dir = repo().join("target").join("console-artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

async fn screenshot(b: &Client, name: &str) {
    let png = b.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(artifacts().join(name), png).expect("write screenshot");
}

async fn start(http: &reqwest::Client, base: &str, version: &str, input: Value) -> String {
    let started: Value = http
        .post(format!("{base}/runs"))
        .bearer_auth("e2e-token")
        .json(&json!({"workflow": version, "input": input}))
        .send()
        .await
        .expect("start")
        .json()
        .await
        .expect("JSON");
    started["id"].as_str().expect("id").to_owned()
}

async fn status_of(http: &reqwest::Client, base: &str, run: &str) -> String {
    crate::http::get_json(http, base, &format!("/runs/{run}")).await["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn until_status(http: &reqwest::Client, base: &str, run: &str, want: &str, served: &Served) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = status_of(http, base, run).await;
        if status == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {run} is {status}, not {want}\n{}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Does `act` on the element `at` names, once it is there. The console's
/// script replaces live parts of a page in place, so an element found may
/// be gone by the time it is used (a stale reference, and the action did
/// not happen): it is looked up again and the action retried.
async fn on_element<T, F, Fut>(b: &Client, at: Locator<'_>, what: &str, act: F) -> T
where
    F: Fn(fantoccini::elements::Element) -> Fut,
    Fut: std::future::Future<Output = Result<T, fantoccini::error::CmdError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = b
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(at)
            .await
            .unwrap_or_else(|e| panic!("no {what} at {at:?}: {e}"));
        match act(found).await {
            Ok(done) => return done,
            Err(e) if e.is_stale_element_reference() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what} at {at:?}: {e}"),
        }
    }
}

/// The text of the first element `css` names, waiting for it to appear
/// (a click does not wait for the page it loads).
async fn text(b: &Client, css: &str) -> String {
    on_element(
        b,
        Locator::Css(css),
        "text",
        |e| async move { e.text().await },
    )
    .await
}

/// Clicks the element `at` names, once it is there.
async fn click(b: &Client, at: Locator<'_>) {
    on_element(b, at, "click", |e| async move { e.click().await.map(drop) }).await
}

/// Types `keys` into the input `at` names, once it is there.
async fn type_into(b: &Client, at: Locator<'_>, keys: &str) {
    on_element(b, at, "input", |e| async move { e.send_keys(keys).await }).await
}

/// Waits until the browser is at `path`.
async fn at_path(b: &Client, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let url = b.current_url().await.expect("url");
        if url.path() == path {
            return;
        }
        assert!(Instant::now() < deadline, "at {url}, not {path}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn attrs(b: &Client, css: &str, attr: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    'again: loop {
        let mut out = Vec::new();
        for e in b.find_all(Locator::Css(css)).await.expect("find_all") {
            match e.attr(attr).await {
                Ok(Some(v)) => out.push(v),
                Ok(None) => {}
                // Replaced by a live refresh between lookup and read: read
                // the whole set again.
                Err(e) if e.is_stale_element_reference() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue 'again;
                }
                Err(e) => panic!("{attr} of {css}: {e}"),
            }
        }
        return out;
    }
}

#[test]
fn the_console_in_a_browser_shows_runs_and_acts_on_them() {
    let driver = chromedriver();
    let env = Env::new();
    // A run blocked on a non-idempotent call whose outcome is unknown: the
    // process driving it is killed after the call was dispatched.
    let wf = crash::setup(
        &env,
        &crash::effect_workflow("ledger@^0.1", r#"{entry: {n: "{{ inputs.n }}"}}"#),
    );
    let blocked = crash::run_and_kill(&env, &wf, "after_dispatched:2", r#"{"n": 1}"#);
    crash::recover(&env);
    let (served, api) = serve_http(&env, &["--policy", "policy.toml"], &[]);
    let base = api.trim_end_matches("/v1").to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let http = reqwest::Client::new();
        assert_eq!(status_of(&http, &api, &blocked).await, "blocked");
        let readme = std::fs::read_to_string(fixture("examples/text-report.yaml")).expect("readme");
        let readme_v = publish(&http, &api, &readme).await;
        let fanned =
            std::fs::read_to_string(repo().join("fixtures/console/fanned.yaml")).expect("fanned");
        let fanned_v = publish(&http, &api, &fanned).await;
        let judged =
            std::fs::read_to_string(repo().join("fixtures/console/judged.yaml")).expect("judged");
        let judged_v = publish(&http, &api, &judged).await;
        let report = start(
            &http,
            &api,
            &readme_v,
            json!({"text": "Please refund $40 to ana@example.com"}),
        )
        .await;
        let fan = start(&http, &api, &fanned_v, json!({})).await;
        let waiting = start(&http, &api, &judged_v, json!({})).await;
        for run in [&report, &fan] {
            assert_eq!(
                ended(&http, &api, run, &served).await["status"],
                "completed"
            );
        }
        until_status(&http, &api, &waiting, "waiting_judgment", &served).await;

        let b = browser(&driver).await;
        // Behind a token: the console asks to sign in, then goes back.
        b.goto(&format!("{base}/runs")).await.expect("goto");
        assert!(
            b.current_url()
                .await
                .expect("url")
                .path()
                .starts_with("/login")
        );
        type_into(&b, Locator::Css("#login input[name=token]"), "e2e-token").await;
        click(&b, Locator::Css("#login button")).await;
        at_path(&b, "/runs").await;
        let listed = text(&b, "#runs").await;
        for run in [&report, &fan, &waiting, &blocked] {
            assert!(
                listed.contains(run.as_str()),
                "{run} in the list:\n{listed}"
            );
        }

        // The README workflow's run: a bar per step, a lane per branch.
        b.goto(&format!("{base}/runs/{report}"))
            .await
            .expect("goto");
        let steps = attrs(&b, "#timeline .bar", "data-step").await;
        for step in ["scan", "words", "emails", "money", "flag"] {
            assert!(steps.iter().any(|s| s == step), "{step} in {steps:?}");
        }
        let lanes = attrs(&b, "#timeline .lane", "data-lane").await;
        assert_eq!(
            lanes,
            ["main", "scan ▸ words", "scan ▸ emails"],
            "{lanes:?}"
        );
        screenshot(&b, "run-page.png").await;

        // The fan-out: its branches in lanes, and markup shown as text.
        b.goto(&format!("{base}/runs/{fan}")).await.expect("goto");
        let lanes = attrs(&b, "#timeline .lane", "data-lane").await;
        assert_eq!(lanes, ["main", "fork ▸ left", "fork ▸ right"], "{lanes:?}");
        let output = text(&b, "#output").await;
        assert!(
            output.contains("<script>alert('left')</script>"),
            "{output}"
        );
        let scripts = b.find_all(Locator::Css("script")).await.expect("scripts");
        assert_eq!(scripts.len(), 1, "only the console's own script");
        b.goto(&format!("{base}/versions/{fanned_v}"))
            .await
            .expect("goto");
        assert_eq!(
            text(&b, "#description").await,
            "<script>alert('description')</script>"
        );

        // The judgment: a wrong answer is refused with the schema's error.
        b.goto(&format!("{base}/judgments")).await.expect("goto");
        click(&b, Locator::Css("#judgments a")).await;
        type_into(
            &b,
            Locator::Css("textarea[name=result_json]"),
            r#"{"go": "yes"}"#,
        )
        .await;
        click(&b, Locator::Css("#answer input[name=confirmed]")).await;
        click(&b, Locator::Css("#answer button")).await;
        let error = text(&b, "#error").await;
        assert!(
            error.contains("at /go"),
            "the schema error names the field: {error}"
        );
        assert_eq!(status_of(&http, &api, &waiting).await, "waiting_judgment");
        screenshot(&b, "judgment-form.png").await;
        // A valid one, through the generated fields: the run completes.
        on_element(
            &b,
            Locator::Css("textarea[name=result_json]"),
            "result_json",
            |e| async move { e.clear().await },
        )
        .await;
        on_element(
            &b,
            Locator::Css("select[name='field.go']"),
            "the go field",
            |e| async move { e.select_by_value("true").await },
        )
        .await;
        click(&b, Locator::Css("#answer input[name=confirmed]")).await;
        click(&b, Locator::Css("#answer button")).await;
        at_path(&b, &format!("/runs/{waiting}")).await;
        assert!(text(&b, "#notice").await.contains("judgment_received"));
        until_status(&http, &api, &waiting, "completed", &served).await;

        // Reconcile the blocked call: failed (the ledger has no entry), confirmed.
        b.goto(&format!("{base}/runs/{blocked}"))
            .await
            .expect("goto");
        click(&b, Locator::Css("#reconcile input[value=failed]")).await;
        type_into(
            &b,
            Locator::Css("#reconcile input[name=reason]"),
            "the ledger has no entry",
        )
        .await;
        click(&b, Locator::Css("#reconcile button")).await;
        assert!(text(&b, "main").await.contains("cannot be undone"));
        click(&b, Locator::Css("#confirm button")).await;
        until_status(&http, &api, &blocked, "completed", &served).await;
        at_path(&b, &format!("/runs/{blocked}")).await;

        // A live page: a run answered elsewhere (over the API) shows its
        // end in the open page without a reload by hand.
        let elsewhere = start(&http, &api, &judged_v, json!({})).await;
        until_status(&http, &api, &elsewhere, "waiting_judgment", &served).await;
        b.goto(&format!("{base}/runs/{elsewhere}"))
            .await
            .expect("goto");
        assert_eq!(text(&b, "#run-status").await, "waiting_judgment");
        let open: Value = crate::http::get_json(&http, &api, "/judgments").await;
        let j = open
            .as_array()
            .and_then(|a| a.iter().find(|j| j["run"] == elsewhere.as_str()))
            .expect("its request")
            .clone();
        let answered = http
            .post(format!(
                "{api}/judgments/{}/answer",
                j["id"].as_str().expect("id")
            ))
            .bearer_auth("e2e-token")
            .json(
                &json!({"request_hash": j["request_hash"], "result": {"go": true},
                          "provenance": {"judge": "api"}}),
            )
            .send()
            .await
            .expect("answer");
        assert_eq!(answered.status(), 200);
        let deadline = Instant::now() + Duration::from_secs(30);
        // The page reloads under the check: a lookup may miss, and retries.
        loop {
            let now = match b.find(Locator::Css("#run-status")).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if now == "completed" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the open page never showed the end"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // A version diff, from the workflow's page.
        let v2 =
            std::fs::read_to_string(repo().join("fixtures/console/fanned.v2.yaml")).expect("v2");
        let published: Value = http
            .post(format!("{api}/workflows"))
            .bearer_auth("e2e-token")
            .json(&json!({"definition": v2, "parent": fanned_v}))
            .send()
            .await
            .expect("publish v2")
            .json()
            .await
            .expect("JSON");
        assert!(published["version"].is_string(), "{published}");
        b.goto(&format!("{base}/workflows/console.fanned"))
            .await
            .expect("goto");
        click(&b, Locator::LinkText("what changed")).await;
        let changes = text(&b, "#changes").await;
        assert!(
            changes.contains("after"),
            "the changed step is named: {changes}"
        );
        b.close().await.expect("close");

        // A form posted without the CSRF token (as another site would): refused.
        let forged = http
            .post(format!("{base}/runs/{fan}/cancel"))
            .bearer_auth("e2e-token")
            .header("content-type", "application/x-www-form-urlencoded")
            .body("confirmed=yes")
            .send()
            .await
            .expect("post");
        assert_eq!(forged.status(), 403);
    });
    drop(served);
}
