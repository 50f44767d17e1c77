//! `wasi:sockets`, linked and denied.
//!
//! No capability grants sockets: a tool reaches the network only through
//! `wasi:http`, to allowlisted hosts. Language runtimes (componentize-py's
//! CPython, for one) import `wasi:sockets` whether or not the tool uses
//! them, so refusing the import would refuse every such component. Instead
//! every way to get a socket — `create-tcp-socket`, `create-udp-socket`,
//! `resolve-addresses` — answers `access-denied` and is recorded as a
//! refusal of the call (which then fails with `CapabilityDenied`, as a
//! refused HTTP request does). Without a socket the rest of the interfaces
//! (wasmtime-wasi's, over a context that allows nothing) have nothing to
//! act on. Knows nothing of policy.

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup::{self, ResolveAddressStream};
use wasmtime_wasi::p2::bindings::sockets::network::{
    ErrorCode, IpAddress, IpAddressFamily, Network,
};
use wasmtime_wasi::p2::bindings::sockets::{tcp_create_socket, udp_create_socket};
use wasmtime_wasi::p2::{DynPollable, SocketError, SocketResult, TcpSocket, UdpSocket};
use wasmtime_wasi::sockets::WasiSocketsCtxView;

use crate::record::{Journal, Refusal};

/// The `HasData` of the denying interfaces.
pub(crate) struct DeniedSockets;

impl HasData for DeniedSockets {
    type Data<'a> = Denying<'a>;
}

/// What the denying interfaces work on: the journal the refusals go to,
/// and wasmtime-wasi's view (for the address stream's resource methods,
/// which no guest can reach without a stream).
pub(crate) struct Denying<'a> {
    pub journal: &'a Journal,
    pub inner: WasiSocketsCtxView<'a>,
}

impl Denying<'_> {
    fn deny(&self, interface: &str, function: &str, attempted: String) -> SocketError {
        let why = "sockets are never granted: a tool reaches the network through `wasi:http`, with the `http` capability";
        self.journal.call(
            interface,
            function,
            attempted.clone(),
            format!("refused: {why}"),
        );
        self.journal.refuse(Refusal {
            capability: "sockets".to_owned(),
            attempted: format!("{interface}.{function}({attempted})"),
            why: why.to_owned(),
        });
        ErrorCode::AccessDenied.into()
    }
}

fn family(f: IpAddressFamily) -> String {
    match f {
        IpAddressFamily::Ipv4 => "ipv4".to_owned(),
        IpAddressFamily::Ipv6 => "ipv6".to_owned(),
    }
}

impl tcp_create_socket::Host for Denying<'_> {
    fn create_tcp_socket(
        &mut self,
        address_family: IpAddressFamily,
    ) -> SocketResult<Resource<TcpSocket>> {
        Err(self.deny(
            "wasi:sockets/tcp-create-socket",
            "create-tcp-socket",
            family(address_family),
        ))
    }
}

impl udp_create_socket::Host for Denying<'_> {
    async fn create_udp_socket(
        &mut self,
        address_family: IpAddressFamily,
    ) -> SocketResult<Resource<UdpSocket>> {
        Err(self.deny(
            "wasi:sockets/udp-create-socket",
            "create-udp-socket",
            family(address_family),
        ))
    }
}

impl ip_name_lookup::Host for Denying<'_> {
    fn resolve_addresses(
        &mut self,
        _network: Resource<Network>,
        name: String,
    ) -> Result<Resource<ResolveAddressStream>, SocketError> {
        Err(self.deny("wasi:sockets/ip-name-lookup", "resolve-addresses", name))
    }
}

impl ip_name_lookup::HostResolveAddressStream for Denying<'_> {
    fn resolve_next_address(
        &mut self,
        resource: Resource<ResolveAddressStream>,
    ) -> Result<Option<IpAddress>, SocketError> {
        ip_name_lookup::HostResolveAddressStream::resolve_next_address(&mut self.inner, resource)
    }

    fn subscribe(
        &mut self,
        resource: Resource<ResolveAddressStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        ip_name_lookup::HostResolveAddressStream::subscribe(&mut self.inner, resource)
    }

    fn drop(&mut self, resource: Resource<ResolveAddressStream>) -> wasmtime::Result<()> {
        ip_name_lookup::HostResolveAddressStream::drop(&mut self.inner, resource)
    }
}

// The `network` interface the creators' signatures name: delegated.
impl wasmtime_wasi::p2::bindings::sockets::network::Host for Denying<'_> {
    fn convert_error_code(&mut self, error: SocketError) -> wasmtime::Result<ErrorCode> {
        wasmtime_wasi::p2::bindings::sockets::network::Host::convert_error_code(
            &mut self.inner,
            error,
        )
    }

    fn network_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        wasmtime_wasi::p2::bindings::sockets::network::Host::network_error_code(
            &mut self.inner,
            err,
        )
    }
}

impl wasmtime_wasi::p2::bindings::sockets::network::HostNetwork for Denying<'_> {
    fn drop(&mut self, this: Resource<Network>) -> wasmtime::Result<()> {
        wasmtime_wasi::p2::bindings::sockets::network::HostNetwork::drop(&mut self.inner, this)
    }
}
