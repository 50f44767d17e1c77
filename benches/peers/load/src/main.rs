//! The one HTTP load client of benches/peers/run.sh, the same for every
//! system: N clients (default 16), each with its own keep-alive HTTP/1.1
//! connection, each sending POST requests in a closed loop (the next
//! request when the previous answer is in) for a warm-up and then for the
//! measured duration. A request is a success only when it answers 2xx and
//! its JSON body says `"status": "completed"` (with `--events`: when the
//! run's event stream then ends with `run_completed`); anything else is an
//! error, counted and shown.
//!
//! ```text
//! peers-load --url http://127.0.0.1:18080/Bench/run --body '{"n":1}' \
//!     [--concurrency 16] [--warmup 5] [--duration 20] [--events] [--label NAME]
//!     [--fresh-connections]   # a new connection per request (diagnostic)
//! peers-load serve-trivial --listen 127.0.0.1:18999   # the client's own ceiling
//! ```
//!
//! Prints one line of `key=value` pairs: runs/s over the measured window
//! (requests that completed in it), latency percentiles of those requests,
//! errors, and `total_ok` (every success, warm-up included, for CPU per
//! run).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

struct Opts {
    url: String,
    body: String,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    events: bool,
    fresh: bool,
    label: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: peers-load --url URL --body JSON [--concurrency N] [--warmup S] [--duration S] [--events] [--fresh-connections] [--label NAME]\n       peers-load serve-trivial --listen ADDR"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if args.first().map(String::as_str) == Some("serve-trivial") {
        let listen = match args.get(1..3) {
            Some([flag, addr]) if flag == "--listen" => addr.clone(),
            _ => usage(),
        };
        rt.block_on(serve_trivial(&listen));
        return;
    }
    let mut o = Opts {
        url: String::new(),
        body: "{}".into(),
        concurrency: 16,
        warmup: Duration::from_secs(5),
        duration: Duration::from_secs(20),
        events: false,
        fresh: false,
        label: "run".into(),
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--url" => o.url = v(),
            "--body" => o.body = v(),
            "--concurrency" => o.concurrency = v().parse().unwrap_or_else(|_| usage()),
            "--warmup" => o.warmup = secs(&v()),
            "--duration" => o.duration = secs(&v()),
            "--events" => o.events = true,
            "--fresh-connections" => o.fresh = true,
            "--label" => o.label = v(),
            _ => usage(),
        }
    }
    if o.url.is_empty() || o.concurrency == 0 {
        usage();
    }
    let code = rt.block_on(load(o));
    std::process::exit(code);
}

fn secs(s: &str) -> Duration {
    Duration::from_secs_f64(s.parse().unwrap_or_else(|_| usage()))
}

/// `http://HOST:PORT/PATH` as (`HOST:PORT`, `/PATH`).
fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap_or_else(|| {
        eprintln!("peers-load: only http:// URLs: {url}");
        std::process::exit(2)
    });
    match rest.find('/') {
        Some(i) => (rest[..i].to_owned(), rest[i..].to_owned()),
        None => (rest.to_owned(), "/".to_owned()),
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(authority: &str) -> Result<Sender, String> {
    let stream = TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connect {authority}: {e}"))?;
    stream.set_nodelay(true).ok();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn request(
    sender: &mut Sender,
    authority: &str,
    method: Method,
    path: &str,
    body: &str,
) -> Result<(StatusCode, Bytes), String> {
    sender.ready().await.map_err(|e| format!("connection: {e}"))?;
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, authority);
    if !body.is_empty() {
        req = req.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, bytes))
}

fn short(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    s.chars().take(200).collect()
}

/// One run: the POST, and with `events` the run's event stream to its end.
async fn one(sender: &mut Sender, authority: &str, path: &str, o: &Opts) -> Result<(), String> {
    let (status, body) = request(sender, authority, Method::POST, path, &o.body).await?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", short(&body)));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("not JSON ({e}): {}", short(&body)))?;
    if !o.events {
        return match v.get("status").and_then(|s| s.as_str()) {
            Some("completed") => Ok(()),
            _ => Err(format!("not completed: {}", short(&body))),
        };
    }
    let id = v
        .get("id")
        .and_then(|s| s.as_str())
        .ok_or_else(|| format!("no run id: {}", short(&body)))?;
    let events = format!("/v1/runs/{id}/events");
    if o.fresh {
        *sender = connect(authority).await?;
    }
    let (status, stream) = request(sender, authority, Method::GET, &events, "").await?;
    if !status.is_success() {
        return Err(format!("events HTTP {status}: {}", short(&stream)));
    }
    let text = String::from_utf8_lossy(&stream);
    match text
        .lines()
        .filter_map(|l| l.strip_prefix("event:"))
        .last()
        .map(str::trim)
    {
        Some("run_completed") => Ok(()),
        other => Err(format!("run ended with {other:?}")),
    }
}

struct ClientResult {
    latencies_us: Vec<u64>,
    ok_total: u64,
    errors_measured: u64,
    errors_total: u64,
    first_errors: Vec<String>,
}

async fn client(
    o: std::sync::Arc<Opts>,
    start: Instant,
    measure_from: Instant,
    end: Instant,
) -> ClientResult {
    let (authority, path) = split_url(&o.url);
    let mut r = ClientResult {
        latencies_us: Vec::new(),
        ok_total: 0,
        errors_measured: 0,
        errors_total: 0,
        first_errors: Vec::new(),
    };
    let _ = start;
    let mut sender: Option<Sender> = None;
    while Instant::now() < end {
        let t0 = Instant::now();
        let res = async {
            if sender.is_none() {
                sender = Some(connect(&authority).await?);
            }
            let s = sender.as_mut().expect("connected");
            one(s, &authority, &path, &o).await
        }
        .await;
        let t1 = Instant::now();
        if o.fresh {
            sender = None;
        }
        let in_window = t1 >= measure_from && t1 <= end;
        match res {
            Ok(()) => {
                r.ok_total += 1;
                if in_window {
                    r.latencies_us.push((t1 - t0).as_micros() as u64);
                }
            }
            Err(e) => {
                r.errors_total += 1;
                if in_window {
                    r.errors_measured += 1;
                }
                if r.first_errors.len() < 3 {
                    r.first_errors.push(e);
                }
                // A broken connection is opened anew; an error answer keeps it.
                if sender.as_ref().is_none_or(|s| s.is_closed()) {
                    sender = None;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    r
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

async fn load(o: Opts) -> i32 {
    let o = std::sync::Arc::new(o);
    let start = Instant::now();
    let measure_from = start + o.warmup;
    let end = measure_from + o.duration;
    let cpu0 = self_cpu_ticks();
    let tasks: Vec<_> = (0..o.concurrency)
        .map(|_| tokio::spawn(client(o.clone(), start, measure_from, end)))
        .collect();
    let mut lat = Vec::new();
    let (mut ok_total, mut err_m, mut err_t) = (0u64, 0u64, 0u64);
    let mut first = Vec::new();
    for t in tasks {
        let r = t.await.expect("client task");
        lat.extend(r.latencies_us);
        ok_total += r.ok_total;
        err_m += r.errors_measured;
        err_t += r.errors_total;
        for e in r.first_errors {
            if first.len() < 3 {
                first.push(e);
            }
        }
    }
    let cpu = self_cpu_ticks().saturating_sub(cpu0);
    lat.sort_unstable();
    let n = lat.len() as f64;
    let secs = o.duration.as_secs_f64();
    let mean = if lat.is_empty() {
        f64::NAN
    } else {
        lat.iter().sum::<u64>() as f64 / n / 1000.0
    };
    println!(
        "label={} concurrency={} duration_s={:.1} runs={} runs_per_s={:.1} p50_ms={:.2} p90_ms={:.2} p99_ms={:.2} mean_ms={:.2} max_ms={:.2} errors={} errors_total={} total_ok={} client_cpu_ticks={}",
        o.label,
        o.concurrency,
        secs,
        lat.len(),
        n / secs,
        pct(&lat, 50.0),
        pct(&lat, 90.0),
        pct(&lat, 99.0),
        mean,
        pct(&lat, 100.0),
        err_m,
        err_t,
        ok_total,
        cpu
    );
    for e in &first {
        eprintln!("peers-load [{}]: error: {e}", o.label);
    }
    if err_t > 0 || lat.is_empty() { 1 } else { 0 }
}

/// utime + stime of this process, in clock ticks.
fn self_cpu_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat; `after` starts at field 3.
    let get = |i: usize| f.get(i - 3).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    get(14) + get(15)
}

/// A trivial endpoint answering `{"status":"completed"}` at once: what the
/// client reaches against it is its own ceiling on this machine.
async fn serve_trivial(listen: &str) {
    let listener = TcpListener::bind(listen).await.expect("bind");
    println!("listening on http://{}", listener.local_addr().expect("addr"));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        stream.set_nodelay(true).ok();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                let _ = req.into_body().collect().await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .header(hyper::header::CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from_static(br#"{"status":"completed"}"#)))
                        .expect("response"),
                )
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
