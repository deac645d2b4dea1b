//! `ingot-testproxy`: the test proxy as a process, for benchmarks (`ci/bench provision`).
//! Prints `listening on HOST:PORT` on stdout once it accepts connections, then runs until killed.

use std::io::Write;
use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use ingot_testproxy::{parse_size, Faults, Proxy, Rule};

/// An HTTP proxy in front of a registry: a bandwidth limit, a connection cut mid-blob, a flipped
/// byte, a dead path.
#[derive(Parser)]
struct Args {
    /// The registry to forward to (HOST:PORT).
    #[arg(long)]
    upstream: SocketAddr,
    /// Where to listen (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Response bytes per second over all connections: 40M, 117M, 1Gi.
    #[arg(long, value_parser = parse_size)]
    rate: Option<u64>,
    /// Cut the first response for a path containing PATTERN after OFFSET body bytes.
    #[arg(long, value_name = "PATTERN:OFFSET")]
    cut: Option<Rule>,
    /// Flip the byte at blob offset OFFSET in every response for a path containing PATTERN.
    #[arg(long, value_name = "PATTERN:OFFSET")]
    flip: Option<Rule>,
    /// Close the connection, no answer sent, of every request for a path containing PATTERN.
    #[arg(long, value_name = "PATTERN")]
    dead: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let proxy = Proxy::start(
        args.listen,
        args.upstream,
        Faults {
            rate: args.rate,
            cut: args.cut,
            flip: args.flip,
            dead: args.dead,
            ..Default::default()
        },
    )
    .with_context(|| format!("listening on {}", args.listen))?;
    let mut out = std::io::stdout();
    writeln!(out, "listening on {}", proxy.host())?;
    out.flush()?;
    loop {
        std::thread::park();
    }
}
