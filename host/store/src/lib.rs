//! The storage of poimen: the [`Store`] trait and its implementations —
//! [`SqliteStore`] (the embedded default: one file, WAL mode),
//! [`PostgresStore`] (one PostgreSQL database shared by many hosts) and
//! [`MemoryStore`] (ephemeral, for `durable: false` workflows, tests and
//! benchmarks; the same semantics). [`open_store`] opens one by URL.
//!
//! What is kept: the immutable version DAG, content-addressed blobs, runs
//! (with their tenants, idempotency keys and leases), each run's append-only episode,
//! write-ahead intent records and judgment requests. A run's progress is
//! written through one atomic [`Commit`], with a per-commit [`Durability`].
//!
//! This crate knows the workflow crate's *types* only (versions, ids, effect
//! classes). It does not know how a workflow runs, what an event means, or
//! how a judgment is validated: it stores what it is given, checks what a
//! store can check (hashes, sequence, protocol order, immutability), and
//! never reads the clock or a random source. The schema is documented in
//! `docs/store.md`.
#![forbid(unsafe_code)]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod codec;
mod error;
mod ids;
mod location;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod records;
mod redact;
mod rules;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;
mod url;
mod wake;

pub use error::{IdempotencyConflict, StoreError};
pub use ids::{BlobHash, HASH_PREFIX, IdParseError, JudgmentId, RunId};
pub use location::{LOCAL_DIR, LocationSource, STORE_FILE, StoreLocation};
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PG_SCHEMA_VERSION, PostgresOptions, PostgresStore};
pub use records::{
    Admission, AdmissionRequest, ArmedRecord, Commit, CreateRun, DEFAULT_TENANT, Durability,
    EventBody, Fence, GcReport, IntentPhase, IntentRecord, JudgmentRecord, JudgmentStatus,
    JudgmentWrite, Lease, LeaseRequest, NewEvent, NewRun, NewVersion, PublishOutcome, RunFilter,
    RunRecord, RunStatus, RunUpdate, StoredEvent, VersionRecord, WorkflowSummary,
};
pub use redact::redact_url;
#[cfg(feature = "sqlite")]
pub use sqlite::{
    APPLICATION_ID, OpenCheck, SCHEMA_VERSION, SqliteOptions, SqliteStore, WriterStats,
};
pub use store::{Store, StoreResult};
pub use ulid::Ulid;
pub use url::{StoreUrl, open_store};
