//! Test-only component `adv-undeclared-http`: declares no capability but
//! imports `wasi:http` and calls it.
//!
//! The host reads imports from the component's type, not from its word: the
//! undeclared import is linked with nothing granted, so the request is
//! refused (and recorded) before any connection, whatever the policy would
//! grant a component that declared `http`. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde_json::Value;
use wasip2::http::outgoing_handler::handle;
use wasip2::http::types::{Fields, OutgoingRequest, Scheme};

/// The component.
#[derive(Debug)]
pub struct UndeclaredHttp;

impl Tool for UndeclaredHttp {
    const NAME: &'static str = "adv-undeclared-http";
    const DESCRIPTION: &'static str = "Test only: calls the network without declaring it.";
    type Input = Value;
    type Output = String;

    fn invoke(_input: Value, _call: &Call) -> Result<String, ToolError> {
        let request = OutgoingRequest::new(Fields::new());
        let _ = request.set_scheme(Some(&Scheme::Http));
        let _ = request.set_authority(Some("example.com"));
        let _ = request.set_path_with_query(Some("/"));
        match handle(request, None) {
            Ok(_) => Ok("request sent".into()),
            Err(e) => Err(ToolError::Failed(format!("{e:?}"))),
        }
    }
}

poimen_guest::export_tool!(UndeclaredHttp);
