//! The console's pure parts: the timeline fold, the judgment form, and the
//! request checks.

use axum::http::HeaderMap;
use poimen::{EpisodeEvent, Recorded, StepId, StepStatus};
use serde_json::json;

use super::{cross_site, form, parse_when, safe_next, timeline};

fn at(seq: u64, at: i64, event: EpisodeEvent) -> Recorded {
    Recorded { seq, at, event }
}

fn started(step: &str, owner: Option<&str>) -> EpisodeEvent {
    EpisodeEvent::StepStarted {
        step: StepId::from(step),
        iteration: 0,
        kind: "tool".into(),
        owner: owner.map(StepId::from),
    }
}

fn attempt(step: &str, n: u32) -> EpisodeEvent {
    EpisodeEvent::AttemptStarted {
        step: StepId::from(step),
        iteration: 0,
        attempt: n,
    }
}

fn finished(step: &str, status: StepStatus) -> EpisodeEvent {
    serde_json::from_value(json!({
        "event": "step_finished", "step": step, "iteration": 0,
        "status": serde_json::to_value(status).expect("status"),
    }))
    .expect("step_finished")
}

#[test]
fn branches_get_lanes_retries_show_and_losers_are_marked() {
    let fork = EpisodeEvent::BranchesForked {
        step: StepId::from("fork"),
        iteration: 0,
        branches: vec![StepId::from("a"), StepId::from("b")],
        join: serde_json::from_value(json!("any")).expect("join"),
    };
    let joined = EpisodeEvent::BranchesJoined {
        step: StepId::from("fork"),
        iteration: 0,
        winners: vec![StepId::from("a")],
        losers: vec![StepId::from("b")],
        failed: vec![],
        failure: None,
    };
    let events = vec![
        at(0, 1000, started("fork", None)),
        at(1, 1000, fork),
        at(2, 1000, started("a", Some("fork"))),
        at(3, 1000, attempt("a", 1)),
        at(4, 1000, started("b", Some("fork"))),
        at(5, 1010, attempt("a", 2)),
        at(6, 1050, finished("a", StepStatus::Completed)),
        at(7, 1050, finished("b", StepStatus::Lost)),
        at(8, 1050, joined),
        at(9, 1100, finished("fork", StepStatus::Completed)),
    ];
    let t = timeline::of(&events, 5000);
    let names: Vec<&str> = t.lanes.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["main", "fork ▸ a", "fork ▸ b"]);
    // Not ended: the span runs to now.
    assert_eq!(t.span_ms, 4000);
    let a = &t.lanes[1].bars[0];
    assert_eq!(a.attempts.len(), 2);
    assert!(a.label.contains("×2"), "{}", a.label);
    let b = &t.lanes[2].bars[0];
    assert_eq!(b.class, "lost");
    assert!(b.label.contains("lost"));
}

#[test]
fn a_sub_workflow_step_links_its_child_run() {
    let child = poimen::RunId::parse("WFR-01ARZ3NDEKTSV4RRFFQ69G5FAV").expect("id");
    let linked: EpisodeEvent = serde_json::from_value(json!({
        "event": "child_run_linked", "step": "sub", "iteration": 0,
        "child_run": child.as_str(),
        "child_version": format!("b3:{}", "0".repeat(64)),
    }))
    .expect("child_run_linked");
    let events = vec![
        at(0, 10, started("sub", None)),
        at(1, 11, linked),
        at(2, 20, finished("sub", StepStatus::Completed)),
    ];
    let t = timeline::of(&events, 100);
    assert_eq!(t.lanes[0].bars[0].child.as_deref(), Some(child.as_str()));
    assert_eq!(t.span_ms, 90, "not ended: up to now");
}

#[test]
fn an_empty_episode_has_no_lanes() {
    assert!(timeline::of(&[], 0).lanes.is_empty());
}

#[test]
fn the_form_follows_the_schema_and_reads_back_by_type() {
    let schema = json!({
        "type": "object",
        "properties": {
            "go": {"type": "boolean"},
            "score": {"type": "number", "description": "how good"},
            "label": {"enum": ["a", "b"]},
            "note": {"type": "string"},
            "extra": {"type": "object"},
        },
        "required": ["go"],
    });
    let mut fields = form::fields(&schema);
    let kinds: Vec<(&str, &str)> = fields.iter().map(|f| (f.name.as_str(), f.kind)).collect();
    assert!(kinds.contains(&("go", "boolean")) && kinds.contains(&("label", "enum")));
    assert!(fields.iter().any(|f| f.name == "go" && f.required));
    let posted: Vec<(String, String)> = [
        ("field.go", "true"),
        ("field.score", "0.5"),
        ("field.label", "\"b\""),
        ("field.note", "<b>hi</b>"),
        ("field.extra", ""),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let result = form::result(&mut fields, &posted, "").expect("result");
    assert_eq!(
        result,
        json!({"go": true, "score": 0.5, "label": "b", "note": "<b>hi</b>"})
    );
    let bad: Vec<(String, String)> = vec![("field.score".into(), "many".into())];
    let err = form::result(&mut fields, &bad, "").expect_err("not a number");
    assert!(err.contains("score"), "{err}");
    assert_eq!(
        form::result(&mut fields, &[], "{\"go\": false}").expect("json"),
        json!({"go": false})
    );
    assert!(form::result(&mut fields, &[], "{nope").is_err());
    assert!(
        form::fields(&json!(true)).is_empty(),
        "not an object schema"
    );
}

#[test]
fn cross_site_posts_are_told_apart() {
    let h = |pairs: &[(&'static str, &'static str)]| {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().expect("header"));
        }
        m
    };
    assert!(!cross_site(&h(&[])), "a client that sends neither");
    assert!(!cross_site(&h(&[
        ("origin", "http://a:1"),
        ("host", "a:1")
    ])));
    assert!(cross_site(&h(&[("origin", "http://b"), ("host", "a:1")])));
    assert!(cross_site(&h(&[("origin", "null"), ("host", "a")])));
    assert!(cross_site(&h(&[("sec-fetch-site", "cross-site")])));
    assert!(!cross_site(&h(&[("sec-fetch-site", "same-origin")])));
}

#[test]
fn sign_in_only_goes_back_into_the_console_and_times_parse() {
    assert_eq!(safe_next(Some("/runs?x=1")), "/runs?x=1");
    for evil in ["//evil.example", "https://evil.example", "/\\evil", "runs"] {
        assert_eq!(safe_next(Some(evil)), "/runs", "{evil}");
    }
    assert_eq!(parse_when("1000"), Ok(1000));
    assert_eq!(parse_when("1970-01-01"), Ok(0));
    assert_eq!(parse_when("1970-01-01T00:01"), Ok(60_000));
    assert_eq!(parse_when("1970-01-01 00:00:01"), Ok(1000));
    assert!(parse_when("yesterday").is_err());
}

#[test]
fn a_long_episode_is_shown_a_page_at_a_time() {
    use super::window;
    assert_eq!(window(1200, 500, 0), 0..500);
    assert_eq!(window(1200, 500, 2), 1000..1200);
    assert_eq!(window(1200, 500, 9), 1200..1200);
    assert_eq!(window(0, 500, 0), 0..0);
}
