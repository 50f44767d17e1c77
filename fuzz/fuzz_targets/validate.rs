//! Fuzz target: the load-time validator, from bytes through a front end to
//! `validate` against fixed registries (the repository's registry fixture
//! and a few published sub-workflows, see `src/lib.rs`), and on to the
//! executor's `Runnable` (schemas compiled once per version).
//!
//! Asserts (on a thread with a tokio worker's 2 MiB stack): validation
//! never panics and ends; a refusal lists at least one
//! error, each with a message and a JSON form; validity does not change
//! under canonicalization (the canonical IR validates exactly when the
//! original does, with the same version); a validated workflow's shape has
//! every top-level step exactly once in its ready order, each after its
//! forward predecessors, and its version is the definition's version; a
//! validated workflow becomes a `Runnable` without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poimen_workflow::{canonicalize, parse, validate, version_of};

fuzz_target!(|data: &[u8]| {
    let format = poimen_fuzz::format_of(data);
    let Ok(def) = parse(data, format, poimen_fuzz::source_name(format)) else {
        return;
    };
    poimen_fuzz::on_worker_stack(|| check(&def));
});

fn check(def: &poimen_workflow::WorkflowDef) {
    let fixed = poimen_fuzz::fixed();
    let registries = fixed.registries();
    let result = validate(def, &registries);
    let canonical = validate(&canonicalize(def), &registries);
    match (&result, &canonical) {
        (Ok(a), Ok(b)) => assert_eq!(a.version(), b.version()),
        (Err(_), Err(_)) => {}
        (a, b) => panic!(
            "validity changed under canonicalization: original {:?}, canonical {:?}",
            a.as_ref().err(),
            b.as_ref().err()
        ),
    }
    match result {
        Err(errors) => {
            assert!(!errors.is_empty(), "refused with no error");
            for e in &errors {
                assert!(!e.to_string().is_empty(), "an empty message: {e:?}");
                let _ = e.code().as_str();
            }
            serde_json::to_value(&errors).expect("validation errors encode as JSON");
        }
        Ok(v) => {
            assert_eq!(v.version(), version_of(def));
            let shape = v.shape();
            let mut seen = vec![false; shape.len()];
            for (pos, &i) in shape.order().iter().enumerate() {
                assert!(shape.is_top(i), "an owned step in the ready order");
                assert!(!seen[i], "a step twice in the ready order");
                seen[i] = true;
                assert_eq!(shape.position(i), Some(pos));
                for &p in shape.predecessors(i) {
                    let before = shape.position(p).is_some_and(|q| q < pos);
                    assert!(before, "a step ordered before its predecessor");
                }
            }
            let tops = (0..shape.len()).filter(|&i| shape.is_top(i)).count();
            assert_eq!(tops, shape.order().len(), "top-level steps left unordered");
            let _ = poimen_workflow::eligibility_report(&v);
            let runnable = poimen_executor::Runnable::new(v);
            for s in &runnable.def.steps {
                assert!(runnable.step(&s.id).is_some());
            }
        }
    }
}
