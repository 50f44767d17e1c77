//! `RunScope`: the serial spine of a run and the cancellation that reaches
//! every branch and every in-flight guest call.
//!
//! A scope is identified by (tenant, run). Cancelling it cancels every child
//! scope — parallel branches and child runs — and every future awaiting
//! under it, which drops in-flight tool calls (the sandbox interrupts the
//! guest when its future is dropped). A branch that loses its join is
//! cancelled on its own, without touching its siblings.

use std::future::Future;

use tokio_util::sync::CancellationToken;

/// Tenant of a run: stored with the run (a child run has its parent's),
/// carried by every scope of it, and a filter when listing runs.
/// Single-tenant hosts use [`TenantId::default`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub String);

impl Default for TenantId {
    fn default() -> Self {
        TenantId(poimen_store::DEFAULT_TENANT.to_owned())
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a scope stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The run was cancelled (or interrupted: see [`RunScope::interruption`]).
    RunCancelled,
    /// This branch lost its join (the run goes on).
    Lost,
}

/// Why a run was stopped from within, rather than cancelled by request: a
/// limit of the workflow, or its version retired. The walk records it as
/// the run's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interruption {
    /// `limits.deadline` passed.
    Deadline { elapsed_ms: u64, limit_ms: u64 },
    /// `budget.wall_time` was spent (waiting excluded).
    WallTime { active_ms: u64, budget_ms: u64 },
    /// The run's version was unloaded with a drain timeout, which passed.
    Unloaded { deadline_ms: i64 },
}

/// Cancellation scope of a run or of one branch inside it.
#[derive(Debug, Clone)]
pub struct RunScope {
    pub tenant: TenantId,
    pub run: String,
    run_token: CancellationToken,
    own: CancellationToken,
    /// Why the run was interrupted, if it was: shared by every scope of the
    /// run (not by its child runs, which end with their parent's cancel).
    why: std::sync::Arc<std::sync::OnceLock<Interruption>>,
}

impl RunScope {
    /// The root scope of a run.
    pub fn root(tenant: TenantId, run: impl Into<String>) -> Self {
        let run_token = CancellationToken::new();
        RunScope {
            tenant,
            run: run.into(),
            own: run_token.clone(),
            run_token,
            why: Default::default(),
        }
    }

    /// A scope for one parallel branch: cancelled with the run, or alone
    /// when the branch loses its join.
    pub fn branch(&self) -> RunScope {
        RunScope {
            tenant: self.tenant.clone(),
            run: self.run.clone(),
            run_token: self.run_token.clone(),
            own: self.own.child_token(),
            why: self.why.clone(),
        }
    }

    /// The root scope of a child run: cancelled when the parent is.
    pub fn child_run(&self, run: impl Into<String>) -> RunScope {
        let token = self.own.child_token();
        RunScope {
            tenant: self.tenant.clone(),
            run: run.into(),
            own: token.clone(),
            run_token: token,
            why: Default::default(),
        }
    }

    /// Whether `other` belongs to the same drive of the same run (a root
    /// scope and its branches do; the scope of a later load of the run
    /// does not).
    pub fn same_drive(&self, other: &RunScope) -> bool {
        std::sync::Arc::ptr_eq(&self.why, &other.why)
    }

    /// Cancels the whole run.
    pub fn cancel_run(&self) {
        self.run_token.cancel();
    }

    /// Stops the whole run because of `why` (the first reason given wins).
    pub fn interrupt(&self, why: Interruption) {
        let _ = self.why.set(why);
        self.run_token.cancel();
    }

    /// Why the run was interrupted, if it was (rather than cancelled).
    pub fn interruption(&self) -> Option<&Interruption> {
        self.why.get()
    }

    /// Cancels only this scope (a branch that lost).
    pub fn cancel(&self) {
        self.own.cancel();
    }

    /// Whether this scope stopped, and why.
    pub fn stopped(&self) -> Option<Stop> {
        if self.run_token.is_cancelled() {
            Some(Stop::RunCancelled)
        } else if self.own.is_cancelled() {
            Some(Stop::Lost)
        } else {
            None
        }
    }

    /// Runs `fut` unless the scope stops first; a stop drops `fut`.
    pub async fn guard<F: Future>(&self, fut: F) -> Result<F::Output, Stop> {
        tokio::select! {
            biased;
            () = self.own.cancelled() => Err(self.stopped().unwrap_or(Stop::Lost)),
            out = fut => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn branch_cancel_is_local_run_cancel_is_global() {
        let run = RunScope::root(TenantId::default(), "WFR-1");
        let a = run.branch();
        let b = run.branch();
        a.cancel();
        assert_eq!(a.stopped(), Some(Stop::Lost));
        assert_eq!(b.stopped(), None);
        run.cancel_run();
        assert_eq!(b.stopped(), Some(Stop::RunCancelled));
        assert_eq!(
            b.guard(std::future::pending::<()>()).await,
            Err(Stop::RunCancelled)
        );
        assert_eq!(run.interruption(), None, "cancelled, not interrupted");
    }

    #[test]
    fn a_drive_is_told_from_a_later_drive_of_the_same_run() {
        let first = RunScope::root(TenantId::default(), "WFR-1");
        let again = RunScope::root(TenantId::default(), "WFR-1");
        assert!(first.same_drive(&first.branch()));
        assert!(first.same_drive(&first.clone()));
        assert!(
            !first.same_drive(&again),
            "a later load of the run is another drive"
        );
        assert!(!first.same_drive(&first.child_run("WFR-2")));
    }

    #[tokio::test]
    async fn an_interruption_stops_every_branch_and_says_why_the_first_time() {
        let run = RunScope::root(TenantId::default(), "WFR-1");
        let branch = run.branch();
        let child = run.child_run("WFR-2");
        branch.interrupt(Interruption::Deadline {
            elapsed_ms: 11,
            limit_ms: 10,
        });
        run.interrupt(Interruption::Unloaded { deadline_ms: 5 });
        assert_eq!(branch.stopped(), Some(Stop::RunCancelled));
        assert_eq!(
            child.stopped(),
            Some(Stop::RunCancelled),
            "children end with it"
        );
        assert_eq!(
            run.interruption(),
            Some(&Interruption::Deadline {
                elapsed_ms: 11,
                limit_ms: 10
            })
        );
        assert_eq!(
            child.interruption(),
            None,
            "a child run is cancelled, not interrupted"
        );
    }
}
