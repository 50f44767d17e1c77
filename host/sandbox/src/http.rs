//! Outgoing `wasi:http` requests: allowed to the invocation's allowlisted
//! hosts, refused for any other, and recorded either way.
//!
//! This is wasmtime-wasi-http's `send_request` hook, the one place every
//! outgoing request passes, and it sends what it allows itself, so that the
//! connection goes exactly where the check looked:
//!
//! - a URL naming a user (`http://user@host/`) is refused: what is checked
//!   and what is dialled must be one host;
//! - the host must be on the allowlist (with its port);
//! - a host name is resolved once, here, and the connection is made to an
//!   address from that answer — never resolved again by a connector, so a
//!   name cannot pass the check and then point elsewhere;
//! - an address inside the machine or its networks (loopback, private,
//!   link-local, unique-local, carrier-grade NAT, unspecified, multicast,
//!   broadcast, documentation) is refused unless the allowlist names that
//!   very address: granting `localhost` or `intranet.example` does not
//!   grant what they resolve to, granting `127.0.0.1:8080` does;
//! - TLS verifies the certificate against the host name the guest asked for.
//!
//! A refused request never opens a connection and fails the invocation with
//! `CapabilityDenied`. Knows nothing of policy files: the allowlist comes
//! from the invocation's grant.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::policy::HttpAllow;
use crate::record::{Journal, Refusal};

const HANDLER: &str = "wasi:http/outgoing-handler";

/// How long any one stage of a request may take when the guest sets no
/// timeout of its own (the call's own timeout still bounds the whole).
const DEFAULT_STAGE_TIMEOUT: Duration = Duration::from_secs(600);

type Sent = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

/// The hook. An empty allowlist (no `http` grant) refuses everything.
pub(crate) struct HttpGate {
    pub allow: Arc<[HttpAllow]>,
    pub journal: Journal,
}

/// Where a request may go, once its URL passed the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// The host as the guest wrote it (lowercase; IPv6 without brackets).
    host: String,
    port: u16,
    tls: bool,
    /// Whether the allowlist entry that matched names an address.
    granted_by_address: bool,
}

/// Why `uri` may not be requested under `allow`, or where it may go.
fn check(allow: &[HttpAllow], uri: &http::Uri) -> Result<Target, &'static str> {
    if allow.is_empty() {
        return Err("the invocation has no `http` grant");
    }
    let (default_port, tls) = match uri.scheme_str() {
        Some("http") => (80, false),
        Some("https") => (443, true),
        _ => return Err("only http and https are allowed"),
    };
    let Some(authority) = uri.authority() else {
        return Err("the request names no host");
    };
    if authority.as_str().contains('@') {
        return Err("the URL names a user (`user@host`); only a plain host may be requested");
    }
    let port = authority.port_u16().unwrap_or(default_port);
    let Some(entry) = allow
        .iter()
        .find(|a| a.allows(authority.host(), port, default_port))
    else {
        return Err("the host is not on the allowlist");
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    Ok(Target {
        granted_by_address: host.parse::<IpAddr>().is_ok()
            || entry
                .host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok(),
        host,
        port,
        tls,
    })
}

/// Whether `ip` is inside the machine or its networks rather than out on
/// the internet.
fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                // 100.64.0.0/10, carrier-grade NAT; 0.0.0.0/8, "this network".
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || o[0] == 0
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // fc00::/7 unique local, fe80::/10 link local.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

/// The addresses `target` may be dialled at: resolved once, internal ones
/// kept only when the grant names the address.
async fn addresses(target: &Target) -> Result<Vec<SocketAddr>, String> {
    let resolved: Vec<SocketAddr> = match target.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, target.port)],
        Err(_) => tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .map_err(|e| format!("cannot resolve {}: {e}", target.host))?
            .collect(),
    };
    if target.granted_by_address {
        return Ok(resolved);
    }
    let (inside, outside): (Vec<SocketAddr>, Vec<SocketAddr>) =
        resolved.into_iter().partition(|a| internal(a.ip()));
    if outside.is_empty() {
        let shown: Vec<String> = inside.iter().map(|a| a.ip().to_string()).collect();
        return Err(format!(
            "{} resolves to {}, inside this machine or its networks, which only a grant by address allows (write `{}:{}` in the policy's allowlist)",
            target.host,
            if shown.is_empty() {
                "nothing".to_owned()
            } else {
                shown.join(", ")
            },
            inside
                .first()
                .map_or_else(|| "ADDRESS".to_owned(), |a| bracketed(a.ip())),
            target.port
        ));
    }
    Ok(outside)
}

fn bracketed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

impl HttpGate {
    fn refuse(journal: &Journal, index: Option<usize>, attempted: String, why: String) {
        match index {
            Some(i) => journal.set_result(i, format!("refused: {why}")),
            None => {
                journal.call(
                    HANDLER,
                    "handle",
                    attempted.clone(),
                    format!("refused: {why}"),
                );
            }
        }
        journal.refuse(Refusal {
            capability: "http".to_owned(),
            attempted,
            why,
        });
    }
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Sent {
        drop(fut);
        let attempted = format!("{} {}", request.method(), request.uri());
        let target = match check(&self.allow, request.uri()) {
            Ok(t) => t,
            Err(why) => {
                Self::refuse(&self.journal, None, attempted, why.to_owned());
                return Box::new(async { Err(HttpError::HttpRequestDenied) });
            }
        };
        let index = self
            .journal
            .call(HANDLER, "handle", attempted.clone(), "pending".to_owned());
        let journal = self.journal.clone();
        Box::new(async move {
            let addrs = match addresses(&target).await {
                Ok(a) => a,
                Err(why) => {
                    Self::refuse(&journal, Some(index), attempted, why);
                    return Err(HttpError::HttpRequestDenied);
                }
            };
            match send(request, options, &target, &addrs).await {
                Ok((response, io)) => {
                    journal.set_result(index, format!("ok: {}", response.status().as_u16()));
                    Ok((response, io))
                }
                Err(e) => {
                    journal.set_result(index, format!("error: {e}"));
                    Err(e)
                }
            }
        })
    }
}

type Connection = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// Sends `request` over a connection to one of `addrs` (in order), with
/// TLS for `https` verified against the target's host name. Modelled on
/// wasmtime-wasi-http's `default_send_request`, which dials the URL's
/// authority itself.
async fn send(
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    target: &Target,
    addrs: &[SocketAddr],
) -> Result<(http::Response<WasiBody>, Connection), HttpError> {
    let connect_timeout = options
        .and_then(|o| o.connect_timeout)
        .unwrap_or(DEFAULT_STAGE_TIMEOUT);
    let first_byte_timeout = options
        .and_then(|o| o.first_byte_timeout)
        .unwrap_or(DEFAULT_STAGE_TIMEOUT);
    let between_bytes_timeout = options
        .and_then(|o| o.between_bytes_timeout)
        .unwrap_or(DEFAULT_STAGE_TIMEOUT)
        // Tokio panics on a zero interval.
        .max(Duration::from_nanos(1));

    let tcp = tokio::time::timeout(connect_timeout, async {
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no address to connect to")))
    })
    .await
    .map_err(|_| HttpError::ConnectionTimeout)?
    .map_err(HttpError::Connect)?;

    let io: Box<dyn Stream> = if target.tls {
        let roots = tokio_rustls::rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.into(),
        };
        let config = tokio_rustls::rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = match target.host.parse::<IpAddr>() {
            Ok(ip) => tokio_rustls::rustls::pki_types::ServerName::from(ip),
            Err(_) => tokio_rustls::rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| {
                    HttpError::Tls(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                })?,
        };
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(HttpError::Tls)?;
        Box::new(tls)
    } else {
        Box::new(tcp)
    };
    let (mut sender, connection) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::handshake(TokioIo::new(io)),
    )
    .await
    .map_err(|_| HttpError::ConnectionTimeout)??;

    // On the wire only the path goes in the request line (the host is in
    // the `host` header wasmtime-wasi-http set from the guest's URL).
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;

    let mut connection = Some(connection);
    let mut sending = std::pin::pin!(tokio::time::timeout(
        first_byte_timeout,
        sender.send_request(request)
    ));
    // Wait for the response while driving the connection's I/O.
    let response = std::future::poll_fn(|cx| match sending.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(r),
        Poll::Pending => {
            let Some(conn) = connection.as_mut() else {
                return Poll::Pending;
            };
            match ready!(Pin::new(conn).poll(cx)) {
                Ok(()) => {
                    connection = None;
                    sending.as_mut().poll(cx)
                }
                Err(e) => {
                    connection = None;
                    Poll::Ready(Ok(Err(e)))
                }
            }
        }
    })
    .await
    .map_err(|_| HttpError::ConnectionReadTimeout)??;

    let mut timeout = tokio::time::interval(between_bytes_timeout);
    timeout.reset();
    let response = response.map(|incoming| IncomingBody { incoming, timeout }.boxed_unsync());
    let rest: Connection = Box::new(async move {
        let Some(conn) = connection else {
            return Ok(());
        };
        conn.await.map_err(|e| {
            if e.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                e.into()
            }
        })
    });
    Ok((response, rest))
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// A response body that fails when the server pauses longer than the
/// between-bytes timeout.
struct IncomingBody {
    incoming: Incoming,
    timeout: tokio::time::Interval,
}

impl Body for IncomingBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(if e.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                e.into()
            }))),
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> Vec<HttpAllow> {
        entries
            .iter()
            .map(|e| HttpAllow::parse(e).expect("entry"))
            .collect()
    }

    fn uri(s: &str) -> http::Uri {
        s.parse().expect("uri")
    }

    #[test]
    fn only_allowlisted_hosts_and_ports_pass() {
        let a = allow(&["127.0.0.1:8080", "example.com"]);
        assert!(check(&a, &uri("http://127.0.0.1:8080/x")).is_ok());
        assert!(check(&a, &uri("https://EXAMPLE.com/")).is_ok());
        assert!(check(&a, &uri("http://example.com/")).is_ok());
        assert!(check(&a, &uri("http://example.com:8080/")).is_err());
        assert!(check(&a, &uri("http://127.0.0.1:8081/")).is_err());
        assert!(check(&a, &uri("http://localhost:8080/")).is_err());
        assert!(check(&a, &uri("ftp://example.com/")).is_err());
        assert!(check(&[], &uri("http://example.com/")).is_err());
    }

    #[test]
    fn a_url_naming_a_user_is_refused_whatever_the_host() {
        let a = allow(&["127.0.0.1:8080", "example.com"]);
        for u in [
            "http://example.com@127.0.0.1:8080/",
            "http://user@example.com/",
            "http://user:pw@127.0.0.1:8080/",
        ] {
            let why = check(&a, &uri(u)).expect_err(u);
            assert!(why.contains("names a user"), "{u}: {why}");
        }
    }

    #[test]
    fn what_passes_says_where_it_may_go() {
        let a = allow(&["127.0.0.1:8080", "Example.com", "[::1]:9"]);
        assert_eq!(
            check(&a, &uri("https://example.COM/")),
            Ok(Target {
                host: "example.com".into(),
                port: 443,
                tls: true,
                granted_by_address: false
            })
        );
        let t = check(&a, &uri("http://[::1]:9/")).expect("v6");
        assert_eq!((t.host.as_str(), t.granted_by_address), ("::1", true));
        assert!(check(&a, &uri("http://127.0.0.1:8080/")).is_ok_and(|t| t.granted_by_address));
    }

    #[test]
    fn internal_addresses_are_told_from_public_ones() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::",
        ] {
            assert!(internal(ip.parse().expect("ip")), "{ip}");
        }
        for ip in ["93.184.216.34", "8.8.8.8", "2606:4700::1111"] {
            assert!(!internal(ip.parse().expect("ip")), "{ip}");
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_inside_is_refused_unless_granted_by_address() {
        let by_name = Target {
            host: "localhost".into(),
            port: 8080,
            tls: false,
            granted_by_address: false,
        };
        let why = addresses(&by_name).await.expect_err("loopback by name");
        assert!(
            why.contains("127.0.0.1") && why.contains("grant by address"),
            "{why}"
        );
        let by_address = Target {
            host: "127.0.0.1".into(),
            granted_by_address: true,
            ..by_name
        };
        assert_eq!(
            addresses(&by_address).await,
            Ok(vec!["127.0.0.1:8080".parse().expect("addr")])
        );
    }
}
