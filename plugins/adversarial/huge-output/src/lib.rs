//! Test-only component `adv-huge-output`: returns a JSON result of about
//! 100 MiB (an array of 64 KiB strings).
//!
//! The result is serialized from one shared chunk, so the guest needs about
//! twice the output in memory, not more: the host must refuse it for its
//! size (OutputTooLarge), not for memory. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde::{Deserialize, Serialize, Serializer, ser::SerializeSeq};

/// The arguments: the size of the result in MiB (default 100).
#[derive(Debug, Deserialize)]
pub struct Input {
    #[serde(default = "hundred")]
    mib: usize,
}

fn hundred() -> usize {
    100
}

const CHUNK: usize = 64 * 1024;

/// `times` copies of `chunk`, serialized as a JSON array of strings.
#[derive(Debug)]
pub struct Repeat {
    chunk: String,
    times: usize,
}

impl Serialize for Repeat {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.times))?;
        for _ in 0..self.times {
            seq.serialize_element(&self.chunk)?;
        }
        seq.end()
    }
}

/// The component.
#[derive(Debug)]
pub struct HugeOutput;

impl Tool for HugeOutput {
    const NAME: &'static str = "adv-huge-output";
    const DESCRIPTION: &'static str = "Test only: returns about 100 MiB.";
    type Input = Input;
    type Output = Repeat;

    fn invoke(input: Input, _call: &Call) -> Result<Repeat, ToolError> {
        Ok(Repeat {
            chunk: "x".repeat(CHUNK),
            times: input.mib * (1 << 20) / CHUNK,
        })
    }
}

poimen_guest::export_tool!(HugeOutput);
