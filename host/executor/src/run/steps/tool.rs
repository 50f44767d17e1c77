//! A tool step: render the arguments from recorded state, then call the
//! tool through the intent wrapper.

use std::sync::Arc;

use poimen_workflow::{StepDef, ToolStep};
use serde_json::Value;

use super::render_failure;
use crate::render::{render_args, template_context};
use crate::run::attempt::{AfterCall, AttemptId};
use crate::run::{Halt, RunCtx, StepEnd};
use crate::scope::RunScope;

impl RunCtx {
    pub(in crate::run) async fn tool_attempt(
        self: Arc<Self>,
        def: &StepDef,
        t: &ToolStep,
        at: AttemptId,
        after: AfterCall,
        scope: &RunScope,
    ) -> Result<(Value, StepEnd), Halt> {
        let rendered = render_args(&t.args.0, &template_context(&self.snapshot().await));
        let args = match rendered {
            Ok(a) => a,
            Err(e) => return Ok((Value::Null, StepEnd::Failed(render_failure(e)))),
        };
        let end = self
            .call_tool(def, &t.tool, args.clone(), at, after, scope)
            .await?;
        Ok((args, end))
    }
}
