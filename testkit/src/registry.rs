//! Fixtures for the registry tests: a real Debian `docker-registry` (distribution 2.8) on
//! 127.0.0.1 with filesystem storage in a temporary directory and its access log on, and a small
//! HTTP front (a behaviour of [`crate::http::Server`]) that can demand a bearer token and slow
//! responses down, forwarding every request to that real registry.

#![allow(dead_code)] // not every test uses every helper

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http::{Conn, Server};

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An htpasswd line with a bcrypt hash (the only scheme distribution accepts).
pub fn htpasswd_line(user: &str, password: &str) -> String {
    let hash = bcrypt::hash_with_result(password, 5)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoA);
    format!("{user}:{hash}\n")
}

/// A running `docker-registry serve`. Killed on drop.
pub struct Registry {
    pub dir: PathBuf,
    pub port: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Registry {
    /// Start a pull-through cache: a `docker-registry` storing into `dir/data` whose
    /// `proxy.remoteurl` is `upstream` (`http://127.0.0.1:PORT`). distribution 2.8 fetches a
    /// blob it lacks from the upstream while it serves it, and stores it for the next client.
    pub fn start_cache(dir: &Path, upstream: &str) -> Registry {
        Registry::start_with(dir, None, &format!("proxy:\n  remoteurl: {upstream}\n"))
    }

    /// Start a registry storing into `dir/data`; with `htpasswd`, basic auth is required.
    pub fn start(dir: &Path, htpasswd: Option<&str>) -> Registry {
        Registry::start_with(dir, htpasswd, "")
    }

    fn start_with(dir: &Path, htpasswd: Option<&str>, extra: &str) -> Registry {
        fs::create_dir_all(dir.join("data")).unwrap();
        let port = free_port();
        let mut config = format!(
            "version: 0.1\n\
             log:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            data = dir.join("data").display()
        );
        config.push_str(extra);
        if let Some(lines) = htpasswd {
            let path = dir.join("htpasswd");
            fs::write(&path, lines).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: ingot-test\n    path: {}\n",
                path.display()
            ));
        }
        let config_path = dir.join("config.yml");
        fs::write(&config_path, config).unwrap();
        let mut r = Registry {
            dir: dir.to_owned(),
            port,
            config: config_path,
            log: dir.join("registry.log"),
            child: None,
        };
        r.restart();
        r
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `oci://127.0.0.1:PORT/{rest}`.
    pub fn url(&self, rest: &str) -> String {
        format!("oci://{}/{rest}", self.host())
    }

    /// Stop the registry process (SIGKILL: connections drop mid-transfer).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// (Re)start on the same port and storage; waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting docker-registry");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = http_status(self.port, "/v2/") {
                assert!(status == 200 || status == 401, "GET /v2/ gave {status}");
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("docker-registry exited ({st}):\n{}", self.log_text());
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not come up:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything the registry printed (its access log is on stdout).
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where the registry stores a blob's bytes.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// GET `path` on 127.0.0.1:port; the status code, or None if nothing answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What the front does.
#[derive(Clone, Default)]
pub struct FrontOptions {
    /// Demand `Authorization: Bearer <this>` on every request (401 otherwise).
    pub bearer: Option<String>,
    /// Cap response bytes per second (per connection).
    pub rate: Option<u64>,
}

/// An HTTP front on 127.0.0.1 forwarding to a registry port, one request per connection.
pub struct Front {
    pub port: u16,
    /// Every `Authorization` header value seen.
    pub auth_seen: Arc<Mutex<Vec<String>>>,
    /// Requests refused for a missing or wrong token.
    pub refused: Arc<AtomicUsize>,
    /// What went through: response bytes, and requests that carried a `Range` header.
    pub traffic: Arc<Traffic>,
    /// The tokens handed out by a front with token realms ([`Front::start_with_realms`]), as
    /// `REALM SCOPE` (`b repository:stacks/demo:pull,push`).
    pub tokens: Arc<Mutex<Vec<String>>>,
    _server: Server,
}

/// Counts of what a [`Front`] forwarded.
#[derive(Default)]
pub struct Traffic {
    /// Response bytes (heads and bodies) sent to clients.
    pub bytes: AtomicU64,
    /// Requests with a `Range` header.
    pub ranged: AtomicUsize,
}

impl Front {
    pub fn start(upstream: u16, options: FrontOptions) -> Front {
        Front::run(upstream, move |conn, upstream, counters| {
            serve(conn, upstream, &options, counters)
        })
    }

    /// A front that is its own token service, in two realms: `/v2/` names realm `a`
    /// (`http://HOST/token/a`), whose tokens open `/v2/` alone; every repository request without
    /// realm `b`'s token is answered `401` naming realm `b`: the new realm a registry names when
    /// a token expired or a repository is served by another token service. A client passes only
    /// by answering a `401` with a token from the realm it names.
    pub fn start_with_realms(upstream: u16) -> Front {
        Front::run(upstream, serve_realms)
    }

    /// A front on 127.0.0.1 running `behaviour` for each request, with the counters it shares.
    fn run(
        upstream: u16,
        behaviour: impl Fn(&mut Conn, SocketAddr, &Counters) -> std::io::Result<()>
            + Send
            + Sync
            + 'static,
    ) -> Front {
        let counters = Counters::default();
        let (auth_seen, refused, traffic, tokens) = (
            counters.seen.clone(),
            counters.refused.clone(),
            counters.traffic.clone(),
            counters.tokens.clone(),
        );
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream));
        let server = Server::local(move |conn| behaviour(conn, upstream, &counters))
            .expect("starting the registry front");
        Front {
            port: server.port(),
            auth_seen,
            refused,
            traffic,
            tokens,
            _server: server,
        }
    }

    pub fn url(&self, rest: &str) -> String {
        format!("oci://127.0.0.1:{}/{rest}", self.port)
    }
}

/// What the front's connections record.
#[derive(Default)]
struct Counters {
    seen: Arc<Mutex<Vec<String>>>,
    refused: Arc<AtomicUsize>,
    traffic: Arc<Traffic>,
    tokens: Arc<Mutex<Vec<String>>>,
}

/// [`Front::start_with_realms`]'s behaviour.
fn serve_realms(conn: &mut Conn, upstream: SocketAddr, counters: &Counters) -> std::io::Result<()> {
    let request = &conn.request;
    let path = request.path().to_owned();
    let host = request.header("host").unwrap_or("127.0.0.1").to_owned();
    if let Some(rest) = path.strip_prefix("/token/") {
        let (realm, query) = rest.split_once('?').unwrap_or((rest, ""));
        let scope = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("scope="))
            .map(|s| {
                s.replace("%3A", ":")
                    .replace("%2F", "/")
                    .replace("%2C", ",")
            })
            .unwrap_or_default();
        counters
            .tokens
            .lock()
            .unwrap()
            .push(format!("{realm} {scope}"));
        let body = format!(r#"{{"token":"tok-{realm}"}}"#);
        let json = ["Content-Type: application/json".to_owned()];
        return conn.respond("200 OK", &json, body.as_bytes(), false);
    }
    let authorization = request.header("authorization").unwrap_or("").to_owned();
    if !authorization.is_empty() {
        counters.seen.lock().unwrap().push(authorization.clone());
    }
    let (wanted, realm) = if path == "/v2/" {
        (&["Bearer tok-a", "Bearer tok-b"][..], "a")
    } else {
        (&["Bearer tok-b"][..], "b")
    };
    if !wanted.contains(&authorization.as_str()) {
        counters.refused.fetch_add(1, Ordering::Relaxed);
        let challenge = format!(
            "WWW-Authenticate: Bearer realm=\"http://{host}/token/{realm}\",service=\"front\""
        );
        let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
        let headers = [challenge, "Content-Type: application/json".to_owned()];
        let head_only = request.method() == "HEAD";
        return conn.respond("401 Unauthorized", &headers, body.as_bytes(), head_only);
    }
    forward(conn, upstream, &FrontOptions::default(), counters)
}

fn serve(
    conn: &mut Conn,
    upstream: SocketAddr,
    options: &FrontOptions,
    counters: &Counters,
) -> std::io::Result<()> {
    let request = &conn.request;
    if request.header("range").is_some() {
        counters.traffic.ranged.fetch_add(1, Ordering::Relaxed);
    }
    let authorization = request.header("authorization").map(str::to_owned);
    if let Some(a) = &authorization {
        counters.seen.lock().unwrap().push(a.clone());
    }
    if let Some(token) = &options.bearer {
        if authorization.as_deref() != Some(&format!("Bearer {token}")) {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"a valid bearer token is required"}]}"#;
            let json = ["Content-Type: application/json".to_owned()];
            return conn.respond("401 Unauthorized", &json, body.as_bytes(), false);
        }
    }
    forward(conn, upstream, options, counters)
}

/// Sends the request on to the registry and its answer back, throttled if asked.
fn forward(
    conn: &mut Conn,
    upstream: SocketAddr,
    options: &FrontOptions,
    counters: &Counters,
) -> std::io::Result<()> {
    let Ok(mut up) = conn.forward(upstream) else {
        return conn.respond("502 Bad Gateway", &[], b"", false);
    };
    // The response, as it comes, throttled if asked.
    let mut buf = vec![0u8; 64 << 10];
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        let n = up.read(&mut buf)?;
        if n == 0 {
            break;
        }
        conn.out.write_all(&buf[..n])?;
        counters
            .traffic
            .bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        sent += n as u64;
        if let Some(rate) = options.rate {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    Ok(())
}

/// Write a docker config.json with an `auths` entry for `host` into `dir`.
pub fn docker_config(dir: &Path, host: &str, user: &str, password: &str) {
    use base64::Engine;
    fs::create_dir_all(dir).unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    fs::write(
        dir.join("config.json"),
        format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
}

/// A manifest like the demo's (absolute fixture paths), plus a `bulk` layer holding one file of
/// `bulk_bytes` random (incompressible) bytes: a stack with one large blob.
pub fn bulk_manifest(repo: &Path, dir: &Path, bulk_bytes: usize) -> PathBuf {
    let demo = fs::read_to_string(repo.join("manifests/demo.toml")).unwrap();
    let fixtures = repo.join("tests/fixtures");
    let mut text = demo.replace("../tests/fixtures", &fixtures.display().to_string());
    let bulk = dir.join("bulk-tree");
    fs::create_dir_all(bulk.join("opt")).unwrap();
    let mut f = fs::File::create(bulk.join("opt/bulk.bin")).unwrap();
    // A MiB at a time: the bulk may be larger than a test wants to hold in memory.
    for (i, at) in (0..bulk_bytes).step_by(1 << 20).enumerate() {
        let n = (bulk_bytes - at).min(1 << 20);
        f.write_all(&crate::noise::noise(i as u64, n)).unwrap();
    }
    text.push_str(&format!(
        "\n[[layer]]\nname = \"bulk\"\nkind = \"bulk\"\nwhen = \"virt\"\nsource = {{ dir = \"{}\" }}\n",
        bulk.display()
    ));
    let path = dir.join("bulk.toml");
    fs::write(&path, text).unwrap();
    path
}

/// Every regular file under `dir`, relative path → bytes' sha256 (hex), sorted.
pub fn tree_digests(dir: &Path) -> Vec<(String, String)> {
    use sha2::Digest;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                let mut h = sha2::Sha256::new();
                std::io::copy(&mut fs::File::open(&p).unwrap(), &mut h).unwrap();
                out.push((
                    p.strip_prefix(dir).unwrap().display().to_string(),
                    hex::encode(h.finalize()),
                ));
            }
        }
    }
    out.sort();
    out
}
