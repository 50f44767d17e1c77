//! Test-only component `adv-panic`: panics with a message naming its input.
//!
//! The host must report GuestPanicked with the panic message taken from the
//! captured stderr, and stay healthy. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde_json::Value;

/// The component.
#[derive(Debug)]
pub struct Panic;

impl Tool for Panic {
    const NAME: &'static str = "adv-panic";
    const DESCRIPTION: &'static str = "Test only: panics.";
    type Input = Value;
    type Output = Value;

    fn invoke(input: Value, _call: &Call) -> Result<Value, ToolError> {
        panic!("adversarial panic on {input}");
    }
}

poimen_guest::export_tool!(Panic);
