//! An HTTP/1.1 proxy in front of one upstream (a docker-registry), for tests and benchmarks:
//!
//! - a bandwidth limit shared by every connection, as one network link would be;
//! - a connection cut after a given number of body bytes of the first whole (not `Range`)
//!   response whose request path contains a pattern (a registry transfer dropped mid-blob; the
//!   ranged reads of a few frames that come before it, and the resumed request after it, pass);
//! - a byte flipped at a given offset of the blob a matching response carries, whether the
//!   response is whole or a `Range` part of it (a registry or cache serving a corrupt copy);
//! - every request whose path contains a pattern answered by closing the connection (a registry
//!   that died, or a link that drops, from that request on).
//!
//! Every request gets its own upstream connection (`Connection: close` is forced), so the proxy
//! knows which request each response answers without parsing message bodies.
//!
//! The proxy is a behaviour of [`server::Server`], the one HTTP test server, which testkit's
//! registry front and the builder's hostile registry use too.

pub mod server;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use server::{Conn, Server};

/// Where a fault applies: the first whole (cut) or every (flip) response to a request whose
/// path contains `path_contains`, at blob byte `offset`.
#[derive(Debug, Clone)]
pub struct Rule {
    pub path_contains: String,
    pub offset: u64,
}

impl std::str::FromStr for Rule {
    type Err = String;
    /// `PATTERN:OFFSET`, e.g. `sha256:ab12:1048576` (the offset follows the last colon).
    fn from_str(s: &str) -> Result<Self, String> {
        let (pattern, offset) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("`{s}`: expected PATTERN:OFFSET"))?;
        Ok(Rule {
            path_contains: pattern.to_string(),
            offset: parse_size(offset)?,
        })
    }
}

/// `123`, `40M` (10^6), `4Mi` (2^20), `1G`, `1Gi`, `16K`, `16Ki`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("`{s}` is not a size"))?;
    let mult = match unit {
        "" => 1,
        "K" => 1_000,
        "Ki" => 1 << 10,
        "M" => 1_000_000,
        "Mi" => 1 << 20,
        "G" => 1_000_000_000,
        "Gi" => 1 << 30,
        _ => return Err(format!("`{s}`: unknown unit `{unit}`")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Response bytes per second, shared by all connections.
    pub rate: Option<u64>,
    /// Cut the first matching response after this many body bytes (once).
    pub cut: Option<Rule>,
    /// Flip (XOR 0xff) this blob byte in every matching response that carries it.
    pub flip: Option<Rule>,
    /// Answer every matching request with this error status and a body that never ends.
    pub endless_error: Option<EndlessError>,
    /// Close the connection, no answer sent, of every request whose path contains this.
    pub dead: Option<String>,
}

/// An error answer whose body never ends (until the client hangs up).
#[derive(Debug, Clone)]
pub struct EndlessError {
    /// Requests whose path contains this.
    pub path_contains: String,
    /// The HTTP status, e.g. 500.
    pub status: u16,
}

/// Writes an `HTTP status` head and then chunks of `x` until the client goes away.
fn endless_error(mut client: &TcpStream, status: u16) -> std::io::Result<()> {
    write!(
        client,
        "HTTP/1.1 {status} Error\r\nContent-Type: text/plain\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )?;
    let chunk = vec![b'x'; 64 << 10];
    loop {
        write!(client, "{:x}\r\n", chunk.len())?;
        client.write_all(&chunk)?;
        client.write_all(b"\r\n")?;
    }
}

/// What the proxy saw and did.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicU64,
    /// Requests that carried a `Range` header.
    pub ranged: AtomicU64,
    pub cuts: AtomicU64,
    pub flips: AtomicU64,
    /// Requests answered by closing the connection (`Faults::dead`).
    pub dropped: AtomicU64,
    /// Response bytes forwarded.
    pub bytes: AtomicU64,
    /// Every `Authorization` header value a request carried (to show which credentials reach
    /// which host).
    pub authorization: Mutex<Vec<String>>,
}

struct Shared {
    upstream: SocketAddr,
    faults: Faults,
    stats: Arc<Stats>,
    /// When the shared link is next free (the bandwidth limit).
    link: Mutex<Instant>,
    cut_done: AtomicBool,
}

/// A running proxy; dropping it stops accepting connections.
pub struct Proxy {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    _server: Server,
}

impl Proxy {
    /// Listens on `listen` (port 0: any free port) and forwards to `upstream`.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        faults: Faults,
    ) -> std::io::Result<Proxy> {
        let stats = Arc::new(Stats::default());
        let shared = Shared {
            upstream,
            faults,
            stats: stats.clone(),
            link: Mutex::new(Instant::now()),
            cut_done: AtomicBool::new(false),
        };
        let server = Server::start(listen, move |conn| serve(conn, &shared))?;
        Ok(Proxy {
            addr: server.addr,
            stats,
            _server: server,
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

fn serve(conn: &mut Conn, shared: &Shared) -> std::io::Result<()> {
    shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    let path = conn.request.path().to_string();
    if conn.request.header("range").is_some() {
        shared.stats.ranged.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(a) = conn.request.header("authorization") {
        let mut seen = shared.stats.authorization.lock().expect("not poisoned");
        seen.push(a.to_string());
    }
    if let Some(e) = shared
        .faults
        .endless_error
        .as_ref()
        .filter(|e| path.contains(&e.path_contains))
    {
        return endless_error(&conn.out, e.status);
    }
    if shared
        .faults
        .dead
        .as_ref()
        .is_some_and(|d| path.contains(d.as_str()))
    {
        shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
        return conn.out.shutdown(Shutdown::Both);
    }
    // `Range: bytes=START-`: the body starts at this blob offset.
    let range_start = conn.request.range_start();
    let mut up = conn.forward(shared.upstream)?;
    let result = respond(&mut up, &conn.out, shared, &path, range_start);
    let _ = up.shutdown(Shutdown::Both);
    result
}

/// Forwards the response: the head as it is, the body through the faults and the rate limit.
fn respond(
    up: &mut TcpStream,
    mut client: &TcpStream,
    shared: &Shared,
    path: &str,
    range_start: Option<u64>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    let mut pending = Vec::new();
    // The response head, up to the blank line.
    let body_start = loop {
        let n = up.read(&mut buf)?;
        if n == 0 {
            return client.write_all(&pending);
        }
        pending.extend_from_slice(&buf[..n]);
        if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let status = String::from_utf8_lossy(&pending[..body_start])
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let is_body = status == "200" || status == "206";
    let base = if status == "206" {
        range_start.unwrap_or(0)
    } else {
        0
    };
    let matches = |rule: &Option<Rule>| -> Option<u64> {
        rule.as_ref()
            .filter(|r| is_body && path.contains(&r.path_contains))
            .map(|r| r.offset)
    };
    let flip = matches(&shared.faults.flip);
    let cut = matches(&shared.faults.cut)
        .filter(|_| status == "200")
        .filter(|_| !shared.cut_done.swap(true, Ordering::SeqCst));
    send(client, &pending[..body_start], shared)?;
    let mut body = pending[body_start..].to_vec();
    // `at`: the blob offset of body[0].
    let mut at = base;
    let step = if shared.faults.rate.is_some() {
        16 << 10
    } else {
        64 << 10
    };
    loop {
        if body.is_empty() {
            let n = up.read(&mut buf[..step])?;
            if n == 0 {
                return Ok(());
            }
            body.extend_from_slice(&buf[..n]);
        }
        if let Some(f) = flip {
            if (at..at + body.len() as u64).contains(&f) {
                body[(f - at) as usize] ^= 0xff;
                shared.stats.flips.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(c) = cut {
            // The cut counts from the start of this response's body.
            let sent = at - base;
            if sent + body.len() as u64 >= c {
                send(client, &body[..(c - sent) as usize], shared)?;
                shared.stats.cuts.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        send(client, &body, shared)?;
        at += body.len() as u64;
        body.clear();
    }
}

/// Bytes the rate-limited link may send at once after falling behind its schedule.
const LINK_BURST: u64 = 256 << 10;

/// Writes `bytes` to the client once the shared link has room for them.
fn send(mut client: &TcpStream, bytes: &[u8], shared: &Shared) -> std::io::Result<()> {
    if let Some(rate) = shared.faults.rate {
        let done = {
            let mut next = shared.link.lock().expect("link");
            // A token bucket of LINK_BURST bytes: time this thread lost between two sends
            // (waking late, the upstream read, the write) is made up, as a shaped link's queue
            // makes it up. Pacing from `now` alone would deliver a fifth less than `rate`.
            let burst = Duration::from_secs_f64(LINK_BURST as f64 / rate as f64);
            let now = Instant::now();
            let start = (*next).max(now.checked_sub(burst).unwrap_or(now));
            *next = start + Duration::from_secs_f64(bytes.len() as f64 / rate as f64);
            *next
        };
        if let Some(wait) = done.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    client.write_all(bytes)?;
    shared
        .stats
        .bytes
        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rules_parse() {
        assert_eq!(parse_size("40M"), Ok(40_000_000));
        assert_eq!(parse_size("4Mi"), Ok(4 << 20));
        assert_eq!(parse_size("117"), Ok(117));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
        let r: Rule = "sha256:abcd:1Mi".parse().unwrap();
        assert_eq!(r.path_contains, "sha256:abcd");
        assert_eq!(r.offset, 1 << 20);
        assert!("nooffset".parse::<Rule>().is_err());
    }
}
