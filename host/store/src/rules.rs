//! The rules every backend enforces, written once.
//!
//! Each function decides one question from values a backend has already
//! read (the stored record, the last intent phase, the next sequence
//! number), so SQLite, memory and PostgreSQL cannot drift apart (the
//! PostgreSQL commit checks run inside the server, in `poimen_commit`; the
//! conformance tests and a unit test of its intent protocol hold them to
//! these). Nothing here reads or writes storage.

use std::path::Path;

use crate::error::{IdempotencyConflict, StoreError};
use crate::ids::{BlobHash, RunId};
use crate::records::{
    Commit, CreateRun, Fence, IntentPhase, IntentRecord, Lease, NewRun, NewVersion, PublishOutcome,
    RunRecord, RunStatus, VersionRecord,
};
use poimen_workflow::{WorkflowId, WorkflowVersion};

/// Most candidates an ambiguous-prefix error lists.
pub(crate) const MAX_PREFIX_CANDIDATES: usize = 20;

/// The claimed version must be the hash of the bytes.
pub(crate) fn check_version_hash(new: &NewVersion) -> Result<(), StoreError> {
    let actual = WorkflowVersion::of_canonical_bytes(&new.canonical);
    if actual != new.version {
        return Err(StoreError::VersionHashMismatch {
            claimed: new.version,
            actual,
        });
    }
    Ok(())
}

/// Publishing `new` when `stored` already holds its version.
pub(crate) fn republish(
    stored: VersionRecord,
    new: &NewVersion,
) -> Result<PublishOutcome, StoreError> {
    if stored.canonical != new.canonical {
        return Err(StoreError::VersionConflict {
            version: new.version,
            detail: format!(
                "the store holds {} bytes that hash to {}, the offered {} bytes hash to the version",
                stored.canonical.len(),
                WorkflowVersion::of_canonical_bytes(&stored.canonical),
                new.canonical.len()
            ),
        });
    }
    if stored.workflow_id != new.workflow_id {
        return Err(StoreError::VersionConflict {
            version: new.version,
            detail: format!(
                "stored as workflow `{}`, offered as workflow `{}`",
                stored.workflow_id, new.workflow_id
            ),
        });
    }
    let ignored_parent = match new.parent {
        Some(p) if stored.parent != Some(p) => Some(p),
        _ => None,
    };
    Ok(PublishOutcome::Existing {
        record: stored,
        ignored_parent,
    })
}

/// The parent of `new`, whose workflow id is `parent_workflow` (`None` if not stored).
///
/// A parent must be a version of the same workflow: the DAG is a workflow's
/// history, `versions_of` shows it, and a cross-workflow parent would point
/// out of it. Copying a workflow under a new id starts a new history.
pub(crate) fn check_parent(
    new: &NewVersion,
    parent_workflow: Option<WorkflowId>,
) -> Result<(), StoreError> {
    let Some(parent) = new.parent else {
        return Ok(());
    };
    match parent_workflow {
        None => Err(StoreError::UnknownParent { parent }),
        Some(w) if w != new.workflow_id => Err(StoreError::ParentOfOtherWorkflow {
            parent,
            parent_workflow: w,
            workflow: new.workflow_id.clone(),
        }),
        Some(_) => Ok(()),
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// A version record read back: its bytes must still hash to its name.
pub(crate) fn verify_version(rec: VersionRecord, path: &Path) -> Result<VersionRecord, StoreError> {
    let actual = WorkflowVersion::of_canonical_bytes(&rec.canonical);
    if actual != rec.version {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!(
                "the canonical bytes of version {} hash to {actual}",
                rec.version
            ),
        });
    }
    Ok(rec)
}

/// A blob read back: its bytes must still hash to its name.
pub(crate) fn verify_blob(
    hash: &BlobHash,
    bytes: Vec<u8>,
    path: &Path,
) -> Result<Vec<u8>, StoreError> {
    let actual = BlobHash::of(&bytes);
    if actual != *hash {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!("blob {hash} holds bytes that hash to {actual}"),
        });
    }
    Ok(bytes)
}

/// Creating `new` when a run with its id already exists.
pub(crate) fn recreate(
    existing: RunRecord,
    new: &NewRun,
    input_hash: BlobHash,
) -> Result<CreateRun, StoreError> {
    let same = existing.version == new.version
        && existing.tenant == new.tenant
        && existing.input_hash == input_hash
        && existing.idempotency_key == new.idempotency_key
        && existing.parent == new.parent;
    if same {
        Ok(CreateRun::Existing(existing))
    } else {
        Err(StoreError::RunIdConflict { id: new.id.clone() })
    }
}

/// Creating `new` when its idempotency key already names `existing`.
///
/// Keys are global to the store, not scoped by tenant; the same request is
/// the same version and input *of the same tenant*. A key naming another
/// tenant's run is a conflict: answering with that run would hand one
/// tenant another's run.
pub(crate) fn reuse_key(
    existing: RunRecord,
    new: &NewRun,
    input_hash: BlobHash,
) -> Result<CreateRun, StoreError> {
    if existing.version == new.version
        && existing.input_hash == input_hash
        && existing.tenant == new.tenant
    {
        return Ok(CreateRun::Existing(existing));
    }
    Err(StoreError::IdempotencyConflict(Box::new(
        IdempotencyConflict {
            key: new.idempotency_key.clone().unwrap_or_default(),
            existing_run: existing.id,
            existing_version: existing.version,
            new_version: new.version,
            existing_input_hash: existing.input_hash,
            new_input_hash: input_hash,
            existing_tenant: existing.tenant,
            new_tenant: new.tenant.clone(),
        },
    )))
}

/// A child run belongs to its parent's tenant: `new`, whose parent run is
/// of `parent_tenant`, must name the same.
pub(crate) fn check_parent_tenant(new: &NewRun, parent_tenant: &str) -> Result<(), StoreError> {
    match &new.parent {
        Some((parent, _)) if new.tenant != parent_tenant => Err(StoreError::TenantMismatch {
            run: new.id.clone(),
            tenant: new.tenant.clone(),
            parent: parent.clone(),
            parent_tenant: parent_tenant.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Whether `next` may follow `previous` for one (run, step, iteration, attempt).
///
/// pending → dispatched (again, after a crash: re-dispatch under the same
/// key) → committed | failed | abandoned; failed may follow pending directly
/// (the call was never made). Abandoned follows dispatched only: the run was
/// cancelled while the call was out, so its outcome is unknown — a call
/// still pending was never made and ends `failed`. Nothing follows
/// committed, failed or abandoned.
pub(crate) fn intent_may_follow(previous: Option<IntentPhase>, next: IntentPhase) -> bool {
    use IntentPhase::*;
    matches!(
        (previous, next),
        (None, Pending)
            | (Some(Pending | Dispatched), Dispatched | Failed)
            | (Some(Dispatched), Committed | Abandoned)
    )
}

pub(crate) fn intent_out_of_order(i: &IntentRecord, previous: Option<IntentPhase>) -> StoreError {
    StoreError::IntentOutOfOrder {
        run: i.run.clone(),
        step: i.step.clone(),
        iteration: i.iteration,
        attempt: i.attempt,
        phase: i.phase,
        previous,
    }
}

/// Checks of a commit that need no stored state.
pub(crate) fn check_commit_shape(c: &Commit) -> Result<(), StoreError> {
    for i in &c.intents {
        if i.run != c.run {
            return Err(StoreError::InvalidCommit {
                run: c.run.clone(),
                detail: format!("it carries an intent record of run {}", i.run),
            });
        }
    }
    for (k, e) in c.events.iter().enumerate() {
        if k > 0 && e.seq != c.events[k - 1].seq.wrapping_add(1) {
            return Err(StoreError::SequenceConflict {
                run: c.run.clone(),
                expected: c.events[k - 1].seq.wrapping_add(1),
                got: e.seq,
            });
        }
    }
    Ok(())
}

/// The commit's first event must be `next`, the run's next sequence number.
pub(crate) fn check_first_seq(c: &Commit, next: u64) -> Result<(), StoreError> {
    match c.events.first() {
        Some(e) if e.seq != next => Err(StoreError::SequenceConflict {
            run: c.run.clone(),
            expected: next,
            got: e.seq,
        }),
        _ => Ok(()),
    }
}

/// A run in `current` status may take `update`.
pub(crate) fn check_run_update(
    c: &Commit,
    current: RunStatus,
    current_output: Option<BlobHash>,
) -> Result<(), StoreError> {
    if let Some(u) = &c.run_update
        && current.is_final()
        && (u.status != current || u.output_hash != current_output)
    {
        return Err(StoreError::RunFinal {
            run: c.run.clone(),
            status: current,
        });
    }
    Ok(())
}

// ------------------------------------------------------------------ leases

/// Whether `owner` may claim, at `now`, a run in `status` whose lease is
/// `current`: the run is not terminal, and no one holds it, its lease
/// expired (`expires_at <= now`), or `owner` already holds it.
pub(crate) fn may_claim(status: RunStatus, current: Option<&Lease>, owner: &str, now: i64) -> bool {
    !status.is_terminal() && current.is_none_or(|l| l.owner == owner || l.expires_at <= now)
}

/// Whether a run needs a driver: `claim_runnable` takes it. Queued or
/// running (a run waiting for a judgment, or blocked, waits for an
/// operator), and no one holds it or its lease expired. A live lease of
/// the caller itself does not count: that run is already driven.
pub(crate) fn is_runnable(
    status: RunStatus,
    current: Option<&Lease>,
    wake_at: Option<i64>,
    now: i64,
) -> bool {
    let due = match status {
        RunStatus::Queued | RunStatus::Running => true,
        // Waiting for an operator — unless its timer has come.
        RunStatus::WaitingJudgment | RunStatus::Blocked => wake_at.is_some_and(|w| w <= now),
        _ => false,
    };
    due && current.is_none_or(|l| l.expires_at <= now)
}

/// The refusal of an answer (or expiry) of a request that expired.
pub(crate) fn expired(id: &crate::ids::JudgmentId) -> StoreError {
    StoreError::JudgmentConflict {
        id: id.clone(),
        detail: "the request expired unanswered (its timeout passed)".into(),
    }
}

/// The refusal of a new run whose admission group is full; `active` are
/// the runs that fill it, oldest first.
pub(crate) fn admission_full(
    a: &crate::records::AdmissionRequest,
    active: Vec<RunId>,
) -> StoreError {
    StoreError::AdmissionFull {
        group: a.group.clone(),
        max_runs: a.max_runs,
        active,
    }
}

/// Whether a commit may have made a run claimable: it ends a run (an
/// admission slot may free), or an operator's (unfenced) write makes a run
/// queued or running with no host driving it.
pub(crate) fn may_make_work(c: &Commit) -> bool {
    c.run_update.as_ref().is_some_and(|u| {
        u.status.is_terminal()
            || (c.fence.is_none() && matches!(u.status, RunStatus::Queued | RunStatus::Running))
    })
}

/// Whether `current` is still the tenure `fence` names.
pub(crate) fn holds(current: Option<&Lease>, fence: &Fence) -> bool {
    current.is_some_and(|l| l.owner == fence.owner && l.epoch == fence.epoch)
}

/// A fenced commit must come from the run's current tenure; an unfenced one
/// (an operator's write) is accepted whoever holds the run. Expiry alone
/// does not refuse a commit: only a takeover, which starts a new epoch, or
/// a release does.
pub(crate) fn check_fence(c: &Commit, current: Option<&Lease>) -> Result<(), StoreError> {
    match &c.fence {
        Some(fence) if !holds(current, fence) => Err(StoreError::LeaseLost {
            run: c.run.clone(),
            fence: fence.clone(),
            holder: current.cloned(),
        }),
        _ => Ok(()),
    }
}

/// Renewing `lease` when the run's lease is `current`.
pub(crate) fn check_renewal(lease: &Lease, current: Option<&Lease>) -> Result<(), StoreError> {
    let fence = lease.fence();
    if holds(current, &fence) {
        Ok(())
    } else {
        Err(StoreError::LeaseLost {
            run: lease.run.clone(),
            fence,
            holder: current.cloned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole protocol table: every (previous, next) pair, allowed or not.
    #[test]
    fn intent_protocol_table() {
        use IntentPhase::*;
        let allowed = [
            (None, Pending),
            (Some(Pending), Dispatched),
            (Some(Pending), Failed),
            (Some(Dispatched), Dispatched),
            (Some(Dispatched), Committed),
            (Some(Dispatched), Failed),
            (Some(Dispatched), Abandoned),
        ];
        let previous = std::iter::once(None).chain(IntentPhase::ALL.map(Some));
        for prev in previous {
            for next in IntentPhase::ALL {
                assert_eq!(
                    intent_may_follow(prev, next),
                    allowed.contains(&(prev, next)),
                    "{prev:?} → {next:?}"
                );
            }
            if let Some(p) = prev {
                // A terminal phase is exactly one nothing may follow.
                let followed = IntentPhase::ALL
                    .into_iter()
                    .any(|n| intent_may_follow(Some(p), n));
                assert_eq!(p.is_terminal(), !followed, "{p:?}");
            }
        }
    }

    fn lease(owner: &str, epoch: u64, expires_at: i64) -> Lease {
        Lease {
            run: "WFR-01HF7YAT000000000000000001".parse().expect("run id"),
            owner: owner.into(),
            epoch,
            expires_at,
        }
    }

    #[test]
    fn who_may_claim_and_what_is_runnable() {
        use RunStatus::*;
        let live = lease("a", 3, 100);
        for status in RunStatus::ALL {
            let open = !status.is_terminal();
            assert_eq!(may_claim(status, None, "a", 50), open, "{status}");
            assert_eq!(may_claim(status, Some(&live), "a", 50), open, "{status}");
            assert!(!may_claim(status, Some(&live), "b", 50), "{status}");
            assert_eq!(may_claim(status, Some(&live), "b", 100), open, "{status}");
            let runnable = matches!(status, Queued | Running);
            assert_eq!(is_runnable(status, None, None, 50), runnable, "{status}");
            assert!(!is_runnable(status, Some(&live), None, 50), "{status}");
            assert_eq!(
                is_runnable(status, Some(&live), None, 100),
                runnable,
                "{status}"
            );
            // A timer makes a waiting or blocked run runnable once it is due.
            let woken = runnable || matches!(status, WaitingJudgment | Blocked);
            assert_eq!(is_runnable(status, None, Some(50), 50), woken, "{status}");
            assert_eq!(
                is_runnable(status, None, Some(51), 50),
                runnable,
                "{status}"
            );
            assert!(!is_runnable(status, Some(&live), Some(10), 50), "{status}");
        }
        assert!(holds(Some(&live), &live.fence()));
        assert!(!holds(Some(&live), &lease("a", 2, 100).fence()));
        assert!(!holds(Some(&live), &lease("b", 3, 100).fence()));
        assert!(!holds(None, &live.fence()));
    }

    #[test]
    fn phases_round_trip_through_their_names_and_serde() {
        for p in IntentPhase::ALL {
            assert_eq!(IntentPhase::parse(p.as_str()), Some(p));
            assert_eq!(
                serde_json::to_value(p).ok(),
                Some(serde_json::Value::String(p.as_str().to_owned()))
            );
        }
        assert_eq!(
            IntentPhase::parse("abandoned"),
            Some(IntentPhase::Abandoned)
        );
        assert_eq!(IntentPhase::parse("Abandoned"), None);
    }
}
