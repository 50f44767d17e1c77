//! Fuzz target: an episode refolded from an arbitrary event log.
//!
//! Input: a JSON array of recorded events (`{"seq", "at", "event": kind,
//! ...fields}`, as `Recorded::to_json` writes them), turned into the store's
//! `StoredEvent`s and decoded with `Episode::from_stored` — the path every
//! stored episode takes — then folded with `refold`.
//!
//! Asserts: decoding, refolding, `canonical_order`, `normalize` and
//! `structure` never panic (an undecodable event or a gap in the sequence
//! is a typed error); every decoded event's body (`EpisodeEvent::body`,
//! what the store keeps) decodes back to the same event; `canonical_order`
//! is a permutation of the events; a refold is reproducible
//! (`assert_refold_identical` of a refold against its own episode holds)
//! and the state it gives encodes as JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poimen_executor::{
    Episode, EpisodeEvent, assert_refold_identical, canonical_order, normalize, refold, structure,
};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Some(stored) = poimen_fuzz::stored_events(&doc) else {
        return;
    };
    let Ok(episode) = Episode::from_stored("fuzz", &stored) else {
        return;
    };
    for r in &episode.events {
        let body = r.event.body();
        let again: EpisodeEvent = serde_json::from_value(body.clone())
            .unwrap_or_else(|e| panic!("a stored body does not decode: {e}\n{body}"));
        assert_eq!(again, r.event, "the body decodes to another event\n{body}");
        let _ = r.to_new_event();
    }

    let order = canonical_order(&episode);
    let mut seen = vec![false; episode.events.len()];
    for &(k, _) in &order {
        assert!(!seen[k], "event {k} twice in canonical order");
        seen[k] = true;
    }
    assert!(
        seen.iter().all(|&s| s),
        "an event missing from canonical order"
    );
    let _ = normalize(&episode);
    let _ = structure(&episode);

    if let Ok(state) = refold(&episode) {
        assert_refold_identical(&state, &episode).expect("a refold reproduces itself");
        serde_json::to_value(&state).expect("run state encodes as JSON");
    }
});
