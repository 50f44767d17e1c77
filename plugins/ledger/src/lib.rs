//! The `ledger` tool: appends a line to a ledger file under the granted
//! `/ledger` directory, on every call.
//!
//! Non-idempotent on purpose: it is the external side effect that crash
//! tests count. `ledger-idempotent` is the same ledger keyed by the
//! idempotency key. Declares `fs-write:/ledger`.

mod ledger;

use poimen_guest::{Call, Effect, Tool, ToolError};
use serde_json::Value;

/// The tool.
#[derive(Debug)]
pub struct Ledger;

impl Tool for Ledger {
    const NAME: &'static str = "ledger";
    const DESCRIPTION: &'static str =
        "Append an entry to a JSON-lines ledger under /ledger, on every call.";
    const INPUT_SCHEMA: &'static str = ledger::INPUT_SCHEMA;
    const OUTPUT_SCHEMA: &'static str = ledger::OUTPUT_SCHEMA;
    const CAPABILITIES: &'static [&'static str] = &["fs-write:/ledger"];
    const EFFECT: Effect = Effect::NonIdempotent;
    type Input = ledger::Input;
    type Output = Value;

    fn invoke(input: ledger::Input, call: &Call) -> Result<Value, ToolError> {
        ledger::append(input, &call.idempotency_key, false)
    }
}

poimen_guest::export_tool!(Ledger);
