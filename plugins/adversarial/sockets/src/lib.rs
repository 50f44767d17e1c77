//! Test-only component `adv-sockets`: imports `wasi:sockets`, which no
//! capability grants, and tries to open a TCP socket.
//!
//! The host links `wasi:sockets` denied: the component loads, and its
//! attempt is refused (access denied), recorded, and fails the call with
//! `CapabilityDenied` pointing at `wasi:http`. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde_json::Value;
use wasip2::sockets::network::IpAddressFamily;
use wasip2::sockets::tcp_create_socket::create_tcp_socket;

/// The component.
#[derive(Debug)]
pub struct Sockets;

impl Tool for Sockets {
    const NAME: &'static str = "adv-sockets";
    const DESCRIPTION: &'static str = "Test only: imports wasi:sockets.";
    type Input = Value;
    type Output = String;

    fn invoke(_input: Value, _call: &Call) -> Result<String, ToolError> {
        match create_tcp_socket(IpAddressFamily::Ipv4) {
            Ok(_) => Ok("socket created".into()),
            Err(e) => Err(ToolError::Failed(format!("{e:?}"))),
        }
    }
}

poimen_guest::export_tool!(Sockets);
