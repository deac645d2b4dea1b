//! Hostile registries and layouts (issue 15): what a server or a file can make `ingot pull` and
//! `ingot verify` spend. The server here (a behaviour of `ingot_testkit::http::Server`) serves a
//! real built layout on 127.0.0.1, misbehaving on purpose: a 4 GiB manifest (declared and
//! chunked), blobs at one byte a second, a descriptor signed by the trusted key but breaking the
//! manifest's rules, blob responses held after their headers until the test lets them go.
//! Every server thread stops by itself: when the client goes, when its byte budget is spent, or
//! when the test drops the server.
//!
//! Memory is measured as the child's peak RSS (`wait4`'s `ru_maxrss`, through
//! `ingot_testkit::measure`), not guessed.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ingot_artifact::oci_layout::{sha256_digest, ImageIndex, ImageManifest, MANIFEST_MEDIA_TYPE};
use ingot_artifact::sign::SecretKey;
use ingot_testkit::http::{self, Conn};
use ingot_testkit::measure::{self, Limits, Run};
use serde_json::Value;

/// How the server misbehaves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// A well-behaved registry.
    Honest,
    /// Every manifest is 4 GiB of spaces with a `Content-Length`.
    HugeManifest,
    /// Every manifest is 4 GiB of spaces, chunked (no length given).
    HugeChunkedManifest,
    /// Manifests are fine; every blob comes at one byte a second.
    OneBytePerSecond,
    /// Manifests are fine; a GET of a blob not in [`Hold::pass`] sends its headers, then waits
    /// until [`Server::release`].
    HoldBlobs,
    /// Every blob GET is answered with this error status and a body that never ends.
    EndlessErrorBlobs(u16),
    /// `/v2/` asks for a bearer token from `/token`, whose answer never ends.
    EndlessToken,
    /// Every blob response sends 100 bytes of the blob (announcing all of them), then closes.
    HundredBytesPerConnection,
    /// Every manifest GET is answered with this status and a body echoing the request's
    /// `Authorization` header.
    EchoAuthorization(u16),
    /// Every manifest GET is redirected to itself.
    RedirectLoop,
    /// `/v2/` asks for a bearer token from an `ftp://` realm.
    FtpRealm,
    /// A whole-blob GET sends half the blob and closes; a `Range` request is answered 206 with
    /// the blob's first bytes, the wrong ones. `header_lies`: the `Content-Range` claims the
    /// asked-for start (else it says `bytes 0-…`, the truth about the wrong bytes).
    WrongRange { header_lies: bool },
}

/// The blob responses [`Mode::HoldBlobs`] holds.
#[derive(Default)]
struct Hold {
    /// Digests served at once.
    pass: Mutex<Vec<String>>,
    /// Responses held so far.
    held: AtomicUsize,
    released: AtomicBool,
}

const FOUR_GIB: u64 = 4 << 30;

/// A registry on 127.0.0.1 serving the layout at `root` under any repository name.
struct Server {
    hold: Arc<Hold>,
    http: http::Server,
}

impl Server {
    fn start(root: &Path, mode: Mode) -> Server {
        let hold = Arc::new(Hold::default());
        let (hold2, root) = (hold.clone(), root.to_owned());
        let server = http::Server::local(move |conn| serve(conn, &root, mode, &hold2)).unwrap();
        Server { hold, http: server }
    }

    /// [`Mode::HoldBlobs`]: serve this blob at once.
    fn pass(&self, digest: &str) {
        self.hold.pass.lock().unwrap().push(digest.to_owned());
    }

    /// Waits until a blob response is being held (at most a minute).
    fn wait_held(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.hold.held.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "no blob request came");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets every held response (and every later one) go.
    fn release(&self) {
        self.hold.released.store(true, Ordering::Relaxed);
    }

    fn url(&self, rest: &str) -> String {
        self.http.url(rest)
    }
}

fn serve(conn: &mut Conn, root: &Path, mode: Mode, hold: &Hold) -> std::io::Result<()> {
    conn.out.set_write_timeout(Some(Duration::from_secs(30)))?;
    let (method, path) = (
        conn.request.method().to_owned(),
        conn.request.path().to_owned(),
    );
    let method = method.as_str();
    let range_start = conn.request.range_start().unwrap_or(0);
    let body_of_head = method == "HEAD";
    let json = ["Content-Type: application/json".to_owned()];
    if let Some(done) = hostile_answer(conn, mode, method, &path) {
        return done;
    }
    if path == "/v2/" {
        return conn.respond("200 OK", &json, b"{}", body_of_head);
    }
    if path.contains("/manifests/") {
        if matches!(mode, Mode::HugeManifest | Mode::HugeChunkedManifest) {
            return huge_manifest(conn, mode == Mode::HugeChunkedManifest);
        }
        // Every tag and digest names the layout's one manifest.
        let index: ImageIndex =
            serde_json::from_slice(&fs::read(root.join("index.json"))?).unwrap();
        let digest = index.manifests[0].digest.clone();
        let bytes = fs::read(blob_path(root, &digest))?;
        let headers = [
            format!("Content-Type: {MANIFEST_MEDIA_TYPE}"),
            format!("Docker-Content-Digest: {digest}"),
        ];
        return conn.respond("200 OK", &headers, &bytes, body_of_head);
    }
    if let Some((_, digest)) = path.rsplit_once("/blobs/") {
        let Ok(bytes) = fs::read(blob_path(root, digest)) else {
            return conn.respond("404 Not Found", &json, b"{}", false);
        };
        let rest = &bytes[(range_start as usize).min(bytes.len())..];
        let status = if range_start > 0 {
            "206 Partial Content"
        } else {
            "200 OK"
        };
        let octets = ["Content-Type: application/octet-stream".to_owned()];
        if mode == Mode::HoldBlobs
            && !body_of_head
            && !hold.pass.lock().unwrap().iter().any(|d| d == digest)
        {
            return held(conn, status, rest, hold);
        }
        if let (Mode::WrongRange { header_lies }, false) = (mode, body_of_head) {
            return wrong_range(conn, &bytes, range_start, header_lies);
        }
        if mode == Mode::HundredBytesPerConnection && !body_of_head {
            conn.respond_head(status, &octets, rest.len() as u64)?;
            conn.out.write_all(&rest[..rest.len().min(100)])?;
            return conn.out.flush();
        }
        if mode != Mode::OneBytePerSecond || body_of_head {
            let headers = [
                octets[0].clone(),
                format!("Docker-Content-Digest: {digest}"),
            ];
            return conn.respond(status, &headers, rest, body_of_head);
        }
        conn.respond_head(status, &octets, rest.len() as u64)?;
        for b in rest {
            if conn.stopping() {
                return Ok(());
            }
            conn.out.write_all(&[*b])?;
            conn.out.flush()?;
            std::thread::sleep(Duration::from_secs(1));
        }
        return Ok(());
    }
    conn.respond("404 Not Found", &json, b"{}", false)
}

/// A blob response whose body waits until the test releases it (or drops the server).
fn held(conn: &mut Conn, status: &str, body: &[u8], hold: &Hold) -> std::io::Result<()> {
    let octets = ["Content-Type: application/octet-stream".to_owned()];
    conn.respond_head(status, &octets, body.len() as u64)?;
    conn.out.flush()?;
    hold.held.fetch_add(1, Ordering::Relaxed);
    while !hold.released.load(Ordering::Relaxed) {
        if conn.stopping() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    conn.out.write_all(body)?;
    conn.out.flush()
}

/// 4 GiB of spaces (valid JSON whitespace) as a manifest; stops when the client hangs up.
fn huge_manifest(conn: &mut Conn, chunked: bool) -> std::io::Result<()> {
    let length = if chunked {
        "Transfer-Encoding: chunked\r\n".to_owned()
    } else {
        format!("Content-Length: {FOUR_GIB}\r\n")
    };
    let out = &mut conn.out;
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: {MANIFEST_MEDIA_TYPE}\r\n{length}Connection: close\r\n\r\n"
    )?;
    let piece = vec![b' '; 1 << 20];
    let mut sent = 0u64;
    while sent < FOUR_GIB && !conn.stopping() {
        let out = &mut conn.out;
        if chunked {
            write!(out, "{:x}\r\n", piece.len())?;
        }
        out.write_all(&piece)?;
        if chunked {
            out.write_all(b"\r\n")?;
        }
        sent += piece.len() as u64;
    }
    if chunked {
        conn.out.write_all(b"0\r\n\r\n")?;
    }
    Ok(())
}

/// The answers of the modes that misbehave before (or instead of) serving the layout; `None`
/// for a request the mode answers honestly.
fn hostile_answer(
    conn: &mut Conn,
    mode: Mode,
    method: &str,
    path: &str,
) -> Option<std::io::Result<()>> {
    let host = conn.request.header("host").unwrap_or_default().to_owned();
    let is_blob = path.contains("/blobs/") && method == "GET";
    let is_manifest = path.contains("/manifests/") && method == "GET";
    let challenge = |out: &mut std::net::TcpStream, realm: String| {
        write!(
            out,
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"{realm}\",\
             service=\"hostile\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .and_then(|()| out.flush())
    };
    Some(match mode {
        Mode::EndlessErrorBlobs(status) if is_blob => endless(conn, status),
        Mode::EndlessToken if path == "/v2/" => {
            challenge(&mut conn.out, format!("http://{host}/token"))
        }
        Mode::EndlessToken if path.starts_with("/token") => endless(conn, 200),
        Mode::FtpRealm if path == "/v2/" => challenge(&mut conn.out, format!("ftp://{host}/token")),
        Mode::RedirectLoop if is_manifest => write!(
            conn.out,
            "HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n"
        )
        .and_then(|()| conn.out.flush()),
        Mode::EchoAuthorization(status) if is_manifest => {
            let echo = format!(
                "{{\"error\":\"you sent Authorization: {}\"}}",
                conn.request.header("authorization").unwrap_or_default()
            );
            let line = match status {
                400 => "400 Bad Request",
                _ => "500 Internal Server Error",
            };
            let json = ["Content-Type: application/json".to_owned()];
            conn.respond(line, &json, echo.as_bytes(), false)
        }
        _ => return None,
    })
}

/// `HTTP status` and a chunked body of spaces that never ends (until the client hangs up).
fn endless(conn: &mut Conn, status: u16) -> std::io::Result<()> {
    write!(
        conn.out,
        "HTTP/1.1 {status} Hostile\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )?;
    let piece = vec![b' '; 64 << 10];
    while !conn.stopping() {
        write!(conn.out, "{:x}\r\n", piece.len())?;
        conn.out.write_all(&piece)?;
        conn.out.write_all(b"\r\n")?;
    }
    Ok(())
}

/// [`Mode::WrongRange`]'s blob answers.
fn wrong_range(
    conn: &mut Conn,
    blob: &[u8],
    range_start: u64,
    header_lies: bool,
) -> std::io::Result<()> {
    if range_start == 0 {
        let octets = ["Content-Type: application/octet-stream".to_owned()];
        conn.respond_head("200 OK", &octets, blob.len() as u64)?;
        conn.out.write_all(&blob[..blob.len() / 2])?;
        return conn.out.flush();
    }
    let len = blob.len() - range_start as usize;
    let first = if header_lies { range_start } else { 0 };
    write!(
        conn.out,
        "HTTP/1.1 206 Partial Content\r\nContent-Type: application/octet-stream\r\n\
         Content-Range: bytes {first}-{}/{}\r\nContent-Length: {len}\r\n\
         Connection: close\r\n\r\n",
        first + len as u64 - 1,
        blob.len()
    )?;
    conn.out.write_all(&blob[..len])?;
    conn.out.flush()
}

/// Runs `ingot` with `args`, measured (exit status, stderr, peak RSS, wall time).
fn ingot_measured(args: &[&str]) -> Run {
    common::ingot_measured(args, Duration::from_secs(600))
}

/// The demo stack, built (signed with a fresh key) into `dir/layout`. Returns (layout, secret
/// key, public key).
fn demo(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (sk, pk) = keypair(dir, "k");
    let layout = dir.join("layout");
    build(&demo_manifest(), &layout, Some(&sk));
    (layout, sk, pk)
}

/// The most a refused manifest may cost: the bound.
const RSS_LIMIT_KIB: i64 = 64 << 10;

/// Issue 15, item 1: a manifest answered with `Content-Length: 4294967296` (or chunked, without
/// a length) was read whole: 4.2 GB RSS (5.4 GB chunked), the rescue system's RAM gone. Now
/// `pull` and `verify oci://` refuse it at the 4 MiB cap, naming it, with a peak RSS under
/// 64 MiB.
#[test]
fn a_four_gib_manifest_is_refused_with_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, pk) = demo(tmp.path());
    for mode in [Mode::HugeManifest, Mode::HugeChunkedManifest] {
        let server = Server::start(&layout, mode);
        let url = server.url("demo:1.0.0");
        let out = tmp.path().join(format!("pulled-{mode:?}"));
        let pk = pk.to_str().unwrap();
        let runs = [
            (
                "pull",
                ingot_measured(&[
                    "pull",
                    &url,
                    out.to_str().unwrap(),
                    "--quiet",
                    "--retries",
                    "2",
                ]),
            ),
            (
                "verify",
                ingot_measured(&["verify", &url, "--trust-key", pk]),
            ),
        ];
        for (what, run) in runs {
            eprintln!(
                "{mode:?} {what}: exit {:?}, peak RSS {} KiB, {:.2?}",
                run.status.code(),
                run.max_rss_kib,
                run.elapsed
            );
            assert!(!run.status.success(), "{mode:?} {what}: {}", run.stderr);
            assert!(
                run.stderr.contains("4194304") && run.stderr.contains("manifest"),
                "{mode:?} {what}: the error does not name the cap: {}",
                run.stderr
            );
            assert!(
                run.max_rss_kib < RSS_LIMIT_KIB,
                "{mode:?} {what}: peak RSS {} KiB",
                run.max_rss_kib
            );
        }
        assert!(!out.join("index.json").exists());
    }
}

/// Issue 15, item 4: a registry sending one byte a second never tripped the 60 s read timeout;
/// `pull` and `verify oci://` downloaded for ever. Now a download that averages less than
/// --speed-limit over --speed-time is dropped and resumed, slow attempts use up --retries, and
/// the command ends with exit 8 and an error saying why, after about
/// retries × (speed-time + backoff): here 2 × (2 s + 0.5 s).
#[test]
fn a_one_byte_a_second_registry_is_given_up_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, pk) = demo(tmp.path());
    let server = Server::start(&layout, Mode::OneBytePerSecond);
    let url = server.url("demo:1.0.0");
    let out = tmp.path().join("pulled");
    let limits = [
        "--speed-limit",
        "100",
        "--speed-time",
        "2",
        "--retries",
        "2",
    ];
    let mut pull = vec!["pull", &url, out.to_str().unwrap(), "--quiet"];
    pull.extend(limits);
    let mut verify = vec!["verify", &url, "--trust-key", pk.to_str().unwrap()];
    verify.extend(limits);
    for (what, args) in [("pull", pull), ("verify", verify)] {
        let run = ingot_measured(&args);
        eprintln!(
            "{what}: exit {:?} after {:.2?}, peak RSS {} KiB",
            run.status.code(),
            run.elapsed,
            run.max_rss_kib
        );
        assert!(!run.status.success(), "{what}: {}", run.stderr);
        assert!(
            run.stderr.contains("below the minimum of 100 bytes/s"),
            "{what}: {}",
            run.stderr
        );
        if what == "pull" {
            assert_eq!(run.status.code(), Some(8), "{}", run.stderr);
        }
    }
}

/// The demo layout with its descriptor edited by `edit` and signed again by `sk`: what a
/// compromised build or a careless release script could publish under the trusted key.
fn resigned(layout: &Path, sk: &Path, dir: &Path, edit: impl Fn(&mut Value)) -> PathBuf {
    let out = dir.join("resigned");
    copy_tree(layout, &out);
    let built = read_layout(&out);
    let mut descriptor = built.descriptor.clone();
    edit(&mut descriptor);
    let bytes = serde_json::to_vec(&descriptor).unwrap();
    let digest = sha256_digest(&bytes);
    fs::write(blob_path(&out, &digest), &bytes).unwrap();
    let key = SecretKey::from_minisign(&fs::read_to_string(sk).unwrap()).unwrap();
    let mut manifest: ImageManifest = serde_json::from_value(built.manifest.clone()).unwrap();
    manifest.config.digest = digest;
    manifest.config.size = bytes.len() as u64;
    manifest
        .annotations
        .as_mut()
        .unwrap()
        .insert("dev.ingot.signature".into(), key.sign(&bytes, "resigned"));
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
    let manifest_digest = sha256_digest(&manifest_bytes);
    fs::write(blob_path(&out, &manifest_digest), &manifest_bytes).unwrap();
    let mut index: Value =
        serde_json::from_slice(&fs::read(out.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"] = manifest_digest.into();
    index["manifests"][0]["size"] = manifest_bytes.len().into();
    fs::write(out.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    out
}

/// Issue 15, item 5, from a registry and from a layout: a descriptor the trusted key signed,
/// with a layer name that would add kernel options (`cp init=/bin/sh rd.break`), a version with
/// a space, or a hash offset of 2^63, passed `ingot verify`. Now each is refused, naming it.
#[test]
fn a_signed_descriptor_breaking_the_manifest_rules_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, sk, pk) = demo(tmp.path());
    let pk = pk.to_str().unwrap();
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 4] = [
        ("cp init=/bin/sh rd.break", |d| {
            d["layers"][1]["name"] = "cp init=/bin/sh rd.break".into()
        }),
        ("cp\\noptions", |d| {
            d["layers"][1]["name"] = "cp\noptions init=/bin/sh".into()
        }),
        ("1.0 ingot.x=1", |d| d["version"] = "1.0 ingot.x=1".into()),
        ("hashOffset 9223372036854775808", |d| {
            d["layers"][0]["verity"]["hashOffset"] = (1u64 << 63).into()
        }),
    ];
    for (want, edit) in cases {
        let dir = tempfile::tempdir_in(tmp.path()).unwrap();
        let bad = resigned(&layout, Path::new(&sk), dir.path(), edit);
        let server = Server::start(&bad, Mode::Honest);
        for stack in [bad.to_str().unwrap().to_owned(), server.url("demo:1.0.0")] {
            let out = ingot(["verify", &stack, "--trust-key", pk]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{want} via {stack}: accepted");
            assert!(
                stderr.contains("stack descriptor is not valid") && stderr.contains(want),
                "{want} via {stack}: {stderr}"
            );
        }
    }
    // The same edit-and-resign path with no edit verifies, so the refusals are about the edits.
    let dir = tempfile::tempdir_in(tmp.path()).unwrap();
    let same = resigned(&layout, Path::new(&sk), dir.path(), |_| {});
    let server = Server::start(&same, Mode::Honest);
    ingot_ok(["verify", &server.url("demo:1.0.0"), "--trust-key", pk]);
}

/// Issue 15, item 6: a local layout's `index.json`, manifest and descriptor were read whole: a
/// 2 GiB sparse manifest named in `index.json` cost 2.1 GB RSS before the digest error. Each is
/// now refused unread when larger than 4 MiB.
#[test]
fn a_local_layout_with_a_huge_manifest_or_index_is_refused_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, pk) = demo(tmp.path());
    let pk = pk.to_str().unwrap();
    let two_gib = 2u64 << 30;
    let digest = format!("sha256:{}", "ab".repeat(32));
    let sparse = |path: &Path| {
        let f = fs::File::create(path).unwrap();
        f.set_len(two_gib).unwrap();
    };

    // index.json naming a 2 GiB manifest blob (the size in index.json is the blob's).
    let named = tmp.path().join("named");
    copy_tree(&layout, &named);
    sparse(&blob_path(&named, &digest));
    let mut index: Value =
        serde_json::from_slice(&fs::read(named.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"] = digest.clone().into();
    index["manifests"][0]["size"] = two_gib.into();
    fs::write(
        named.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();

    // index.json itself 2 GiB of holes.
    let big_index = tmp.path().join("big-index");
    copy_tree(&layout, &big_index);
    sparse(&big_index.join("index.json"));

    for dir in [&named, &big_index] {
        let run = ingot_measured(&["verify", dir.to_str().unwrap(), "--trust-key", pk]);
        eprintln!(
            "{}: exit {:?} after {:.2?}, peak RSS {} KiB",
            dir.display(),
            run.status.code(),
            run.elapsed,
            run.max_rss_kib
        );
        assert!(!run.status.success(), "{}", run.stderr);
        assert!(run.stderr.contains("4194304"), "{}", run.stderr);
        assert!(
            run.max_rss_kib < RSS_LIMIT_KIB,
            "peak RSS {} KiB",
            run.max_rss_kib
        );
    }
}

/// The `ingot-registry-*` directories in `dir`.
fn registry_temp_dirs(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ingot-registry-"))
        .collect()
}

/// Issue 15, item 11: `verify oci://` (and `ingot-writer oci://`, through the same source) made
/// its `ingot-registry-*` temporary directory as soon as the tag resolved, so a run killed
/// before any blob was downloaded left an empty one in $TMPDIR. It is now made for the first
/// blob that needs a file, and removed at the end.
#[test]
fn the_registry_temp_dir_is_made_only_for_a_downloaded_blob() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, pk) = demo(tmp.path());
    let pk = pk.to_str().unwrap();
    let descriptor = read_layout(&layout).manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let verify = |tmpdir: &Path, url: &str| {
        fs::create_dir(tmpdir).unwrap();
        Command::new(env!("CARGO_BIN_EXE_ingot"))
            .args(["verify", url, "--trust-key", pk])
            .env("TMPDIR", tmpdir)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    // Killed while the descriptor (read into memory, no file) is on its way.
    let server = Server::start(&layout, Mode::HoldBlobs);
    let killed = tmp.path().join("tmp-killed");
    let mut child = verify(&killed, &server.url("demo:1.0.0"));
    server.wait_held();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(registry_temp_dirs(&killed), Vec::<String>::new());

    // A whole verify: the directory is there while the first layer blob downloads into it,
    // and gone at the end.
    let server = Server::start(&layout, Mode::HoldBlobs);
    server.pass(&descriptor);
    let whole = tmp.path().join("tmp-whole");
    let child = verify(&whole, &server.url("demo:1.0.0"));
    server.wait_held();
    assert_eq!(registry_temp_dirs(&whole).len(), 1);
    server.release();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(registry_temp_dirs(&whole), Vec::<String>::new());
}

/// Runs `ingot` like [`ingot_measured`], with `env` and `stdin`, but stops it (SIGKILL) when it
/// runs longer than `limit` or its RSS passes 1 GiB: a run the fix should end by itself must
/// not take the machine's memory or the test's time when the fix is missing. `Run::killed` says
/// whether the test stopped it.
fn ingot_within(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>, limit: Duration) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("OCI_REGISTRY_AUTH_TOKEN")
        .env("DOCKER_CONFIG", "/nonexistent");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let limits = Limits {
        deadline: limit,
        rss_cap_kib: Some(1 << 20),
        stdin: stdin.map(|s| s.as_bytes().to_vec()),
    };
    measure::measured(cmd, limits, |_| {})
}

/// Hostile input, second pass, item 1: an error answer (500, 404, 403) with a body that never
/// ends, and a token service whose answer never ends, were read whole (`ingot pull` reached
/// 7.9 GB). Now an error body is read to 64 KiB and a token answer to 1 MiB; a body past its cap
/// is a failed attempt, and the pull gives up with exit 8, naming the cap. Prints peak RSS and
/// wall time.
#[test]
fn endless_error_bodies_and_token_answers_are_capped() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, _) = demo(tmp.path());
    for (mode, cap) in [
        (Mode::EndlessErrorBlobs(500), "65536"),
        (Mode::EndlessErrorBlobs(404), "65536"),
        (Mode::EndlessErrorBlobs(403), "65536"),
        (Mode::EndlessToken, "1048576"),
    ] {
        let server = Server::start(&layout, mode);
        let url = server.url("demo:1.0.0");
        let out = tmp.path().join(format!("pulled-{mode:?}"));
        let args = [
            "pull",
            &url,
            out.to_str().unwrap(),
            "--quiet",
            "--retries",
            "2",
        ];
        let run = ingot_within(&args, &[], None, Duration::from_secs(120));
        eprintln!(
            "{mode:?}: exit {:?} after {:.2?}, peak RSS {} KiB",
            run.status.code(),
            run.elapsed,
            run.max_rss_kib
        );
        assert_eq!(run.killed, None, "{mode:?}: stopped by the test");
        assert_eq!(run.status.code(), Some(8), "{mode:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(cap) && run.stderr.contains("stopped reading"),
            "{mode:?}: {}",
            run.stderr
        );
        assert!(
            run.max_rss_kib < RSS_LIMIT_KIB,
            "{mode:?}: peak RSS {} KiB",
            run.max_rss_kib
        );
    }
}

/// Hostile input, second pass, item 2: a registry that sends 100 bytes per connection and
/// closes renewed the retry count with every response, and each response was measured on its
/// own, so the minimum-speed rule never fired (an 8 MB blob would take about 12 hours). The rule
/// now holds per blob, across its resumed responses: the pull gives up with exit 8. Prints wall
/// time.
#[test]
fn a_registry_sending_100_bytes_per_connection_is_given_up_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, _) = demo(tmp.path());
    let server = Server::start(&layout, Mode::HundredBytesPerConnection);
    let url = server.url("demo:1.0.0");
    let out = tmp.path().join("pulled");
    let args = [
        "pull",
        &url,
        out.to_str().unwrap(),
        "--quiet",
        "--retries",
        "4",
    ];
    let run = ingot_within(&args, &[], None, Duration::from_secs(300));
    eprintln!(
        "exit {:?} after {:.2?}, peak RSS {} KiB",
        run.status.code(),
        run.elapsed,
        run.max_rss_kib
    );
    assert_eq!(run.killed, None, "stopped by the test: {}", run.stderr);
    assert_eq!(run.status.code(), Some(8), "{}", run.stderr);
    assert!(
        run.stderr.contains("gave up after 4 attempts"),
        "{}",
        run.stderr
    );
    assert!(!out.join("index.json").exists());
}

/// Hostile input, second pass, item 3: a registry error body echoing the request's
/// `Authorization` header was printed as is: the base64 of `user:password` reached the output
/// (and, under CAPH, a Kubernetes event). Every form of a credential is now scrubbed: the basic
/// base64, `user:password`, the password, the bearer token as sent and as given.
#[test]
fn credentials_echoed_by_the_registry_never_reach_the_output() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, _) = demo(tmp.path());
    let (user, password, token) = ("alice", "s3cretPassw0rd", "ghp_rawToken0123456789");
    let pair = format!("{user}:{password}");
    let forms = [
        password.to_owned(),
        pair.clone(),
        b64(&pair),
        token.to_owned(),
        b64(token),
    ];
    for status in [400, 500] {
        let server = Server::start(&layout, Mode::EchoAuthorization(status));
        let url = server.url("demo:1.0.0");
        let out = tmp.path().join(format!("pulled-{status}"));
        let pull = [
            "pull",
            &url,
            out.to_str().unwrap(),
            "--quiet",
            "--retries",
            "1",
        ];
        let mut login = pull.to_vec();
        login.extend(["--username", user, "--password-stdin"]);
        let password_line = format!("{password}\n");
        let runs = [
            (
                "login",
                ingot_within(&login, &[], Some(&password_line), Duration::from_secs(60)),
            ),
            (
                "token",
                ingot_within(
                    &pull,
                    &[("OCI_REGISTRY_AUTH_TOKEN", token)],
                    None,
                    Duration::from_secs(60),
                ),
            ),
        ];
        for (how, run) in runs {
            assert_eq!(run.killed, None, "{status} {how}");
            assert!(!run.status.success(), "{status} {how}: {}", run.stderr);
            assert!(
                run.stderr.contains("you sent Authorization:") && run.stderr.contains("<redacted>"),
                "{status} {how}: the echo is not in the message: {}",
                run.stderr
            );
            for secret in &forms {
                assert!(
                    !run.stderr.contains(secret.as_str()),
                    "{status} {how}: `{secret}` reached the output: {}",
                    run.stderr
                );
            }
        }
    }
}

/// Hostile input, second pass, item 4: a redirect loop and a token realm with a non-HTTP
/// scheme were retried as transient (exit 8 after every attempt). No retry can change either:
/// each now fails at once, exit 1, saying what is wrong.
#[test]
fn redirect_loops_and_a_non_http_token_realm_are_permanent() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, _) = demo(tmp.path());
    for (mode, says) in [
        (Mode::RedirectLoop, "redirects"),
        (Mode::FtpRealm, "not an http(s) URL"),
    ] {
        let server = Server::start(&layout, mode);
        let url = server.url("demo:1.0.0");
        let out = tmp.path().join(format!("pulled-{mode:?}"));
        let args = [
            "pull",
            &url,
            out.to_str().unwrap(),
            "--quiet",
            "--retries",
            "8",
        ];
        let run = ingot_within(&args, &[], None, Duration::from_secs(120));
        eprintln!(
            "{mode:?}: exit {:?} after {:.2?}",
            run.status.code(),
            run.elapsed
        );
        assert_eq!(run.killed, None, "{mode:?}");
        assert_eq!(run.status.code(), Some(1), "{mode:?}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{mode:?}: {}", run.stderr);
        assert!(
            !run.stderr.contains("gave up after"),
            "{mode:?}: {}",
            run.stderr
        );
    }
}

/// Hostile input, second pass, item 4: a 206 answer with the wrong bytes failed as "the
/// registry's copy is corrupt or was replaced". It now says the range answer was wrong: at once
/// when the `Content-Range` names other bytes than were asked for, and at the digest check when
/// it lies about them.
#[test]
fn a_wrong_range_answer_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, _) = demo(tmp.path());
    for header_lies in [false, true] {
        let server = Server::start(&layout, Mode::WrongRange { header_lies });
        let url = server.url("demo:1.0.0");
        let out = tmp.path().join(format!("pulled-{header_lies}"));
        let args = [
            "pull",
            &url,
            out.to_str().unwrap(),
            "--quiet",
            "--retries",
            "3",
        ];
        let run = ingot_within(&args, &[], None, Duration::from_secs(120));
        assert_eq!(run.killed, None);
        assert_eq!(
            run.status.code(),
            Some(4),
            "lies {header_lies}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("range answer was wrong"),
            "lies {header_lies}: {}",
            run.stderr
        );
        assert!(!out.join("index.json").exists());
    }
}

/// Hostile input, second pass, item 10: `ingot pull` followed a symlink planted as a blob's
/// `.partial-<hex>` and overwrote the file it pointed at, outside the layout. A partial file
/// that is not a regular file is now removed (saying so) and the blob fetched into a new one;
/// the file outside is untouched and the pull completes.
#[test]
fn a_symlinked_partial_file_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, _) = demo(tmp.path());
    let server = Server::start(&layout, Mode::Honest);
    let url = server.url("demo:1.0.0");
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let out = tmp.path().join("pulled");
    fs::create_dir_all(out.join("blobs/sha256")).unwrap();
    fs::copy(layout.join("oci-layout"), out.join("oci-layout")).unwrap();
    let config = read_layout(&layout).manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let partial = out.join(format!(
        "blobs/sha256/.partial-{}",
        &config["sha256:".len()..]
    ));
    std::os::unix::fs::symlink(&victim, &partial).unwrap();
    let args = ["pull", &url, out.to_str().unwrap(), "--quiet"];
    let run = ingot_within(
        &args,
        &[("RUST_LOG", "warn")],
        None,
        Duration::from_secs(120),
    );
    assert_eq!(run.killed, None);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(
        fs::read(&victim).unwrap(),
        b"precious",
        "the file outside was written"
    );
    assert!(run.stderr.contains("not a regular file"), "{}", run.stderr);
    let blob = out.join(format!("blobs/sha256/{}", &config["sha256:".len()..]));
    assert!(fs::symlink_metadata(&blob).unwrap().file_type().is_file());
    assert_eq!(sha256_digest(&fs::read(&blob).unwrap()), config);
}
