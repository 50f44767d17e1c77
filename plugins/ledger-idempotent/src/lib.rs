//! The `ledger-idempotent` tool: the `ledger`, appending at most once per
//! idempotency key.
//!
//! The ledger itself is the record of which keys were applied: a call whose
//! key already has a line appends nothing and says so. Declares
//! `fs-write:/ledger`; effect class idempotent. Not safe against two
//! concurrent calls with the same key (the executor never makes those: a
//! run is serial and keys are per run, step and iteration).

#[path = "../../ledger/src/ledger.rs"]
mod ledger;

use poimen_guest::{Call, Effect, Tool, ToolError};
use serde_json::Value;

/// The tool.
#[derive(Debug)]
pub struct IdempotentLedger;

impl Tool for IdempotentLedger {
    const NAME: &'static str = "ledger-idempotent";
    const DESCRIPTION: &'static str =
        "Append an entry to a JSON-lines ledger under /ledger, at most once per idempotency key.";
    const INPUT_SCHEMA: &'static str = ledger::INPUT_SCHEMA;
    const OUTPUT_SCHEMA: &'static str = ledger::OUTPUT_SCHEMA;
    const CAPABILITIES: &'static [&'static str] = &["fs-write:/ledger"];
    const EFFECT: Effect = Effect::Idempotent;
    type Input = ledger::Input;
    type Output = Value;

    fn invoke(input: ledger::Input, call: &Call) -> Result<Value, ToolError> {
        ledger::append(input, &call.idempotency_key, true)
    }
}

poimen_guest::export_tool!(IdempotentLedger);
