//! Bytes that carry no hash tree of their own (a verity hash device, the ESP, an md
//! superblock): written, read back and compared, with the same bounded rewrites as a layer.

use ingot_verity::is_zero;

use crate::report::{Reporter, Rewrite};
use crate::target::{AlignedBuf, Target, TargetError, ALIGN};

use super::{EngineError, WriteOptions, WriteStats};

/// Writes bytes that carry no hash tree of their own (a verity hash device, the ESP) and checks
/// them by reading back and comparing, with the same bounded rewrites. Chunk N is written while
/// chunk N-1 is read back.
pub fn write_bytes(
    target: &Target,
    what: &str,
    bytes: &[u8],
    offset: u64,
    zeroed: bool,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, EngineError> {
    const CHUNK: usize = 8 << 20;
    let mut stats = WriteStats::default();
    let mut current = AlignedBuf::new(CHUNK);
    let mut previous = AlignedBuf::new(CHUNK);
    let mut back = AlignedBuf::new(CHUNK);
    // (offset, length) of the chunk in `previous`, waiting to be read back.
    let mut pending: Option<(u64, usize)> = None;
    let mut parts = bytes.chunks(CHUNK).enumerate();
    loop {
        opts.check_stop(&format!("writing {what}"))?;
        let next = parts.next().map(|(i, part)| {
            let len = part.len().div_ceil(ALIGN) * ALIGN;
            current[..len].fill(0);
            current[..part.len()].copy_from_slice(part);
            (offset + (i * CHUNK) as u64, len)
        });
        if next.is_none() && pending.is_none() {
            break;
        }
        let (written, checked) = rayon::join(
            || match next {
                Some((at, len)) => write_runs(target, &current[..len], at, zeroed),
                None => Ok((0, 0)),
            },
            || match pending {
                Some((at, len)) => check_bytes(
                    target,
                    what,
                    &previous[..len],
                    &mut back,
                    at,
                    opts,
                    reporter,
                ),
                None => Ok((0, 0)),
            },
        );
        let (w, s) = written?;
        let (rw, n) = checked?;
        stats.written += w + rw;
        stats.skipped += s;
        stats.rewrites += n;
        std::mem::swap(&mut current, &mut previous);
        pending = next;
    }
    reporter.add_written(stats.written);
    Ok(stats)
}

/// Reads `expect.len()` bytes back at `at` and compares; rewrites up to the attempt limit.
/// Returns (bytes rewritten, number of rewrites).
fn check_bytes(
    target: &Target,
    what: &str,
    expect: &[u8],
    back: &mut AlignedBuf,
    at: u64,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<(u64, u32), EngineError> {
    let len = expect.len();
    let (mut rewritten, mut rewrites) = (0u64, 0u32);
    let mut attempt = 1;
    loop {
        target.read_direct(&mut back[..len], at)?;
        if back[..len] == *expect {
            return Ok((rewritten, rewrites));
        }
        if attempt >= opts.max_attempts {
            return Err(EngineError::ReadBack {
                layer: what.to_string(),
                offset: at,
                length: len as u64,
                attempts: attempt,
                reason: "bytes differ from what was written".into(),
            });
        }
        attempt += 1;
        reporter.rewrite(Rewrite {
            layer: what.to_string(),
            offset: at,
            length: len as u64,
            attempt,
        });
        target.write_direct(expect, at)?;
        target.sync()?;
        rewritten += len as u64;
        rewrites += 1;
    }
}

/// Writes `data` (a multiple of ALIGN) at `offset`, skipping all-zero ALIGN blocks when the
/// target already reads zeros there.
pub(super) fn write_runs(
    target: &Target,
    data: &[u8],
    offset: u64,
    zeroed: bool,
) -> Result<(u64, u64), TargetError> {
    if !zeroed {
        target.write_direct(data, offset)?;
        return Ok((data.len() as u64, 0));
    }
    let mut written = 0u64;
    let mut skipped = 0u64;
    let blocks: Vec<&[u8]> = data.chunks(ALIGN).collect();
    let mut i = 0;
    while i < blocks.len() {
        let zero = is_zero(blocks[i]);
        let start = i;
        while i < blocks.len() && is_zero(blocks[i]) == zero {
            i += 1;
        }
        let (a, b) = (start * ALIGN, i * ALIGN);
        if zero {
            skipped += (b - a) as u64;
        } else {
            target.write_direct(&data[a..b], offset + a as u64)?;
            written += (b - a) as u64;
        }
    }
    Ok((written, skipped))
}
