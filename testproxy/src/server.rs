//! The one small HTTP/1.1 test server: a listener on a loopback port, a thread a connection, the
//! request head read and handed to a behaviour (a closure) that answers it. The proxy
//! ([`crate::Proxy`]), testkit's registry front and the hostile registry of the builder's tests
//! are behaviours of it. One request per connection: every behaviour answers with
//! `Connection: close`, and the server shuts the connection when the behaviour returns.
//!
//! Hand-written over std rather than a crate (hyper, tiny_http): the behaviours misbehave on
//! purpose below HTTP (a connection cut mid-body, one byte a second, a 4 GiB body), which a
//! server library's own framing would not let them do.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A request's head: the request line and the header lines, each with its line end.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request line first, then the headers; the blank line that ends the head is not kept.
    pub lines: Vec<String>,
}

impl Request {
    /// Reads a head from `reader`; None when the client closed before a whole one came.
    pub fn read(reader: &mut impl BufRead) -> std::io::Result<Option<Request>> {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(None);
            }
            if line == "\r\n" || line == "\n" {
                return Ok(Some(Request { lines }));
            }
            lines.push(line);
        }
    }

    /// `GET`, `HEAD`, …
    pub fn method(&self) -> &str {
        self.lines
            .first()
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("")
    }

    /// The request target (`/v2/…`).
    pub fn path(&self) -> &str {
        self.lines
            .first()
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("")
    }

    /// The first header called `name` (any case), its value trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.lines.iter().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// Where a `Range: bytes=START-…` asks the body to start.
    pub fn range_start(&self) -> Option<u64> {
        self.header("range")?
            .strip_prefix("bytes=")?
            .split('-')
            .next()?
            .parse()
            .ok()
    }

    /// The head to send upstream: as it came, but `Connection: close` in place of any
    /// `Connection` header, so the upstream's answer ends when its connection does.
    pub fn forward_head(&self) -> String {
        let mut out = String::new();
        for (i, l) in self.lines.iter().enumerate() {
            let is_connection = i > 0
                && l.split_once(':')
                    .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"));
            if !is_connection {
                out.push_str(l);
            }
        }
        out.push_str("Connection: close\r\n\r\n");
        out
    }
}

/// One connection, its request head read.
pub struct Conn {
    pub request: Request,
    /// What follows the head (a request body), buffered.
    pub body: BufReader<TcpStream>,
    /// Where the response goes.
    pub out: TcpStream,
    stop: Arc<AtomicBool>,
}

impl Conn {
    /// Whether the server was dropped: a behaviour that takes its time stops when this is true.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Writes a whole response: `status` (`200 OK`), `headers` (each `Name: value`), the body
    /// (its head alone when `head_only`, as a `HEAD` request wants), `Content-Length` and
    /// `Connection: close`.
    pub fn respond(
        &mut self,
        status: &str,
        headers: &[String],
        body: &[u8],
        head_only: bool,
    ) -> std::io::Result<()> {
        self.respond_head(status, headers, body.len() as u64)?;
        if !head_only {
            self.out.write_all(body)?;
        }
        self.out.flush()
    }

    /// Writes a response head announcing `len` body bytes, which the caller sends itself.
    pub fn respond_head(
        &mut self,
        status: &str,
        headers: &[String],
        len: u64,
    ) -> std::io::Result<()> {
        let mut head = format!("HTTP/1.1 {status}\r\n");
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str(&format!(
            "Content-Length: {len}\r\nConnection: close\r\n\r\n"
        ));
        self.out.write_all(head.as_bytes())
    }

    /// Connects to `upstream` and sends it this request: the head ([`Request::forward_head`]),
    /// then whatever body the client sends, copied by a thread of its own until either side
    /// closes. Returns the upstream connection, to read the response from.
    pub fn forward(&mut self, upstream: SocketAddr) -> std::io::Result<TcpStream> {
        let mut up = TcpStream::connect(upstream)?;
        up.write_all(self.request.forward_head().as_bytes())?;
        let mut up_in = up.try_clone()?;
        // What the head's reader buffered past the head is the body's start; the rest comes
        // from the connection itself.
        up_in.write_all(self.body.buffer())?;
        let mut body = self.body.get_ref().try_clone()?;
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut body, &mut up_in);
        });
        Ok(up)
    }
}

/// A running server; dropping it stops accepting connections and tells running behaviours to
/// stop ([`Conn::stopping`]).
pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Listens on `listen` (port 0: any free port) and runs `behaviour` for each request on a
    /// thread of its own. What it returns is dropped: an error is a client gone.
    pub fn start(
        listen: SocketAddr,
        behaviour: impl Fn(&mut Conn) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let behaviour = Arc::new(behaviour);
        let stop2 = stop.clone();
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (behaviour, stop) = (behaviour.clone(), stop2.clone());
                        std::thread::spawn(move || {
                            let _ = serve(stream, &*behaviour, stop);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Ok(Server { addr, stop })
    }

    /// On 127.0.0.1, any free port.
    pub fn local(
        behaviour: impl Fn(&mut Conn) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> std::io::Result<Server> {
        Server::start(SocketAddr::from(([127, 0, 0, 1], 0)), behaviour)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `HOST:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `oci://HOST:PORT/{rest}`.
    pub fn url(&self, rest: &str) -> String {
        format!("oci://{}/{rest}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(
    stream: TcpStream,
    behaviour: &(impl Fn(&mut Conn) -> std::io::Result<()> + ?Sized),
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut body = BufReader::new(stream.try_clone()?);
    let Some(request) = Request::read(&mut body)? else {
        return Ok(());
    };
    let mut conn = Conn {
        request,
        body,
        out: stream,
        stop,
    };
    let result = behaviour(&mut conn);
    let _ = conn.out.shutdown(Shutdown::Both);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn exchange(server: &Server, request: &str) -> String {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    /// A behaviour gets the parsed head; a forwarded request reaches the upstream with its
    /// body and `Connection: close` in place of the client's `Connection` header.
    #[test]
    fn behaviours_answer_and_forward() {
        let upstream = Server::local(|conn| {
            let mut seen = conn.request.forward_head();
            let n: usize = conn
                .request
                .header("content-length")
                .unwrap()
                .parse()
                .unwrap();
            let mut body = vec![0; n];
            conn.body.read_exact(&mut body).unwrap();
            seen.push_str(&String::from_utf8(body).unwrap());
            conn.respond("200 OK", &[], seen.as_bytes(), false)
        })
        .unwrap();
        let up = upstream.addr;
        let front = Server::local(move |conn| {
            if conn.request.range_start() == Some(7) {
                return conn.respond("416 Range Not Satisfiable", &[], b"", false);
            }
            let mut from = conn.forward(up)?;
            std::io::copy(&mut from, &mut conn.out).map(drop)
        })
        .unwrap();
        let answer = exchange(
            &front,
            "POST /v2/x HTTP/1.1\r\nHost: h\r\nconnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello",
        );
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(
            answer.ends_with(
                "\r\n\r\nPOST /v2/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\
                 Connection: close\r\n\r\nhello"
            ),
            "{answer}"
        );
        let answer = exchange(&front, "GET /b HTTP/1.1\r\nRange: bytes=7-\r\n\r\n");
        assert_eq!(
            answer,
            "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }
}
