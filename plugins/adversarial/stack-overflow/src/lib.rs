//! Test-only component `adv-stack-overflow`: recurses until the WebAssembly
//! stack overflows.
//!
//! The recursion keeps its state in WebAssembly locals (no address-taken
//! locals, so nothing on the shadow stack in linear memory): the engine's
//! stack limit is what stops it (StackOverflow). Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde::Deserialize;

/// The arguments: how deep to go (default: deeper than any stack).
#[derive(Debug, Deserialize)]
pub struct Input {
    #[serde(default = "deep")]
    depth: u64,
}

fn deep() -> u64 {
    u64::MAX
}

/// Not a tail call and not an accumulator the optimizer can turn into a
/// loop: the result of the inner call is mixed with `n` after it returns.
#[inline(never)]
fn recurse(n: u64, depth: u64) -> u64 {
    if n == 0 {
        return depth;
    }
    let inner = recurse(n - 1, depth.wrapping_add(1));
    inner.rotate_left((n % 63) as u32) ^ n
}

/// The component.
#[derive(Debug)]
pub struct StackOverflow;

impl Tool for StackOverflow {
    const NAME: &'static str = "adv-stack-overflow";
    const DESCRIPTION: &'static str = "Test only: unbounded recursion.";
    type Input = Input;
    type Output = u64;

    fn invoke(input: Input, _call: &Call) -> Result<u64, ToolError> {
        Ok(recurse(input.depth, 0))
    }
}

poimen_guest::export_tool!(StackOverflow);
