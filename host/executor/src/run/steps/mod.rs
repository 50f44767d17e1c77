//! One file per step kind: what an attempt of that kind does. Each returns
//! what the attempt consumed (for its verifiers) and how it ended; the
//! attempt loop (`attempt.rs`) records the rest.

mod conditional;
mod judgment;
mod model;
mod parallel;
mod subworkflow;
mod tool;

pub use judgment::judgment_id;

use crate::effects::{Failure, FailureClass};
use crate::render::RenderError;

/// A template or predicate that could not be evaluated: the attempt's
/// input is invalid, retrying it cannot help.
fn render_failure(e: RenderError) -> Failure {
    Failure::new(FailureClass::InvalidInput, e.to_string())
}
