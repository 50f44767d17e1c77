//! Test-only component `adv-http-hog`: with an `http` grant, tries to make
//! the host hold header fields outside its memory limit, and to reach what
//! its allowlist does not name.
//!
//! - `{"attack": "fields", "n": N, "kib": K}`: builds `N` header-field
//!   resources (default 16 000) of one `K` KiB value each (default 120)
//!   and holds them all;
//! - `{"attack": "get", "authority": A, "https": false}`: a GET with
//!   exactly that authority (a user, a name that resolves inside the
//!   machine, …), unchecked on the guest's side.
//!
//! Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingRequest, Scheme};

/// The arguments.
#[derive(Debug, Deserialize)]
pub struct Input {
    attack: String,
    #[serde(default)]
    n: Option<usize>,
    #[serde(default)]
    kib: Option<usize>,
    #[serde(default)]
    authority: Option<String>,
    #[serde(default)]
    https: bool,
}

/// The component.
#[derive(Debug)]
pub struct HttpHog;

fn attack(input: &Input) -> Result<Value, ToolError> {
    match input.attack.as_str() {
        "fields" => {
            let value = vec![b'v'; input.kib.unwrap_or(120) << 10];
            let mut held = Vec::new();
            for _ in 0..input.n.unwrap_or(16_000) {
                held.push(
                    Fields::from_list(&[("x-hog".to_owned(), value.clone())])
                        .map_err(|e| ToolError::Failed(format!("fields: {e:?}")))?,
                );
            }
            Ok(json!({"held": held.len()}))
        }
        "get" => {
            let authority = input.authority.as_deref().unwrap_or("127.0.0.1");
            let request = OutgoingRequest::new(Fields::new());
            let scheme = if input.https {
                Scheme::Https
            } else {
                Scheme::Http
            };
            let set = |ok: Result<(), ()>, what: &str| {
                ok.map_err(|()| ToolError::Failed(format!("the host rejected the {what}")))
            };
            set(request.set_method(&Method::Get), "method")?;
            set(request.set_scheme(Some(&scheme)), "scheme")?;
            set(request.set_authority(Some(authority)), "authority")?;
            set(request.set_path_with_query(Some("/")), "path")?;
            let pending = outgoing_handler::handle(request, None)
                .map_err(|e| ToolError::Failed(format!("handle: {e:?}")))?;
            pending.subscribe().block();
            match pending.get() {
                Some(Ok(Ok(response))) => Ok(json!({"status": response.status()})),
                Some(Ok(Err(e))) => Err(ToolError::Failed(format!("response: {e:?}"))),
                Some(Err(())) | None => Err(ToolError::Failed("no response".into())),
            }
        }
        other => Err(ToolError::InvalidInput(format!("no attack `{other}`"))),
    }
}

impl Tool for HttpHog {
    const NAME: &'static str = "adv-http-hog";
    const DESCRIPTION: &'static str =
        "Test only: holds header fields and dials what its allowlist does not name.";
    const CAPABILITIES: &'static [&'static str] = &["http"];
    type Input = Input;
    type Output = Value;

    fn invoke(input: Input, _call: &Call) -> Result<Value, ToolError> {
        attack(&input)
    }
}

poimen_guest::export_tool!(HttpHog);
