//! Test-only component `adv-grow-memory`: allocates until memory runs out.
//!
//! The host must stop it at its memory limit (MemoryExhausted) and stay
//! healthy. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde_json::Value;

/// The component.
#[derive(Debug)]
pub struct GrowMemory;

impl Tool for GrowMemory {
    const NAME: &'static str = "adv-grow-memory";
    const DESCRIPTION: &'static str = "Test only: allocates without bound.";
    type Input = Value;
    type Output = usize;

    fn invoke(_input: Value, _call: &Call) -> Result<usize, ToolError> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            // Touch every page so nothing is optimized away.
            hoard.push(std::hint::black_box(vec![0xA5; 1 << 20]));
            if hoard.len() == usize::MAX {
                return Ok(hoard.len());
            }
        }
    }
}

poimen_guest::export_tool!(GrowMemory);
