//! Sequential read speed, as CAPH's `check-disk.sh` measures it with fio: direct reads from the
//! start of the device for 3 seconds, at least 20,000 KiB/s on a rotational disk and 40,000 KiB/s
//! on any other.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::aligned::AlignedBuf;
use crate::gate::{GateDetail, GateFailure, GateReport, Reason, Warning};
use crate::Disk;

/// One request: large enough that per-request overhead does not dominate on NVMe.
const REQUEST: usize = 4 << 20;
/// CAPH's thresholds: 20,000 KiB/s for a rotational disk, 40,000 KiB/s otherwise.
pub fn default_min_kib_s(disk: &Disk) -> u64 {
    if disk.rotational {
        20_000
    } else {
        40_000
    }
}

/// What one measurement read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadSpeed {
    /// Bytes read.
    pub bytes: u64,
    /// Time spent reading, in seconds.
    pub seconds: f64,
    /// The rate, KiB/s.
    pub kib_per_s: u64,
    /// The threshold it was compared with, KiB/s.
    pub min_kib_per_s: u64,
    /// Read with `O_DIRECT` (false: the page cache may have helped).
    pub direct: bool,
    /// Stopped because the device ended before `duration` was up.
    pub reached_end: bool,
}

/// Read `disk` sequentially from its start with `O_DIRECT` for `duration` (CAPH: 3 s) or until
/// it ends; fail with `disk-too-slow` below `min_kib_s` (see [`default_min_kib_s`]).
///
/// Where `O_DIRECT` is refused (some filesystems holding a test image), it reads through the page
/// cache and warns `read-not-direct`. The device is opened read-only.
pub fn gate_read_speed(
    disk: &Disk,
    min_kib_s: u64,
    duration: Duration,
) -> Result<GateReport, GateFailure> {
    let unreadable = |e: std::io::Error| {
        GateFailure::new(
            Reason::DiskUnreadable,
            Some(&disk.name),
            format!("reading {}: {e}", disk.node.display()),
        )
    };
    let (mut file, mut direct) = match open_direct(&disk.node) {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            (File::open(&disk.node).map_err(unreadable)?, false)
        }
        Err(e) => return Err(unreadable(e)),
    };
    let mut buf = AlignedBuf::new(REQUEST);
    let mut bytes = 0u64;
    let mut reached_end = false;
    let start = Instant::now();
    while start.elapsed() < duration {
        let n = match file.read(&mut buf[..]) {
            Ok(n) => n,
            // Some filesystems accept O_DIRECT at open and refuse it at the first read.
            Err(e) if direct && bytes == 0 && e.raw_os_error() == Some(libc::EINVAL) => {
                file = File::open(&disk.node).map_err(unreadable)?;
                direct = false;
                continue;
            }
            Err(e) => return Err(unreadable(e)),
        };
        if n == 0 {
            reached_end = true;
            break;
        }
        bytes += n as u64;
    }
    let seconds = start.elapsed().as_secs_f64().max(1e-6);
    let kib_per_s = ((bytes as f64 / 1024.0) / seconds) as u64;
    let speed = ReadSpeed {
        bytes,
        seconds,
        kib_per_s,
        min_kib_per_s: min_kib_s,
        direct,
        reached_end,
    };
    if kib_per_s < min_kib_s {
        return Err(GateFailure::new(
            Reason::DiskTooSlow,
            Some(&disk.name),
            format!(
                "sequential read {kib_per_s} KiB/s ({bytes} bytes in {seconds:.2} s), \
                 needs {min_kib_s} KiB/s"
            ),
        ));
    }
    let mut warnings = Vec::new();
    if !direct {
        warnings.push(Warning::new(
            Reason::ReadNotDirect,
            Some(&disk.name),
            "O_DIRECT refused; the rate was measured through the page cache",
        ));
    }
    Ok(GateReport {
        disk: Some(disk.name.clone()),
        detail: GateDetail::ReadSpeed(speed),
        warnings,
    })
}

fn open_direct(path: &std::path::Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}
