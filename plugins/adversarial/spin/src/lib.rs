//! Test-only component `adv-spin`: spins forever in a tight loop.
//!
//! The host must interrupt it (Timeout, or FuelExhausted under a small fuel
//! budget) and stay healthy. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde_json::Value;

/// The component.
#[derive(Debug)]
pub struct Spin;

impl Tool for Spin {
    const NAME: &'static str = "adv-spin";
    const DESCRIPTION: &'static str = "Test only: never returns.";
    type Input = Value;
    type Output = u64;

    fn invoke(_input: Value, _call: &Call) -> Result<u64, ToolError> {
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
}

poimen_guest::export_tool!(Spin);
