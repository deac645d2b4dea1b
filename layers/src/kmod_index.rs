//! kmod's binary index files (`modules.dep.bin`, `modules.alias.bin`, `modules.symbols.bin`,
//! `modules.builtin.bin`, `modules.builtin.alias.bin`), as `depmod` writes them and libkmod
//! reads them (`libkmod-index.c`): a big-endian header (magic `0xB007F457`, version 2.x, the
//! root node's offset), then a trie. A node offset carries flags in its top bits: a prefix
//! string follows, a child table follows (first and last byte, one offset per byte between),
//! values follow (a count, then per value a priority and a NUL-terminated string). A key is the
//! bytes along the path from the root; kmod returns the values of the key it looks up.

use std::collections::BTreeSet;

const MAGIC: u32 = 0xB007_F457;
const VERSION_MAJOR: u32 = 0x0002;
const PREFIX: u32 = 0x8000_0000;
const VALUES: u32 = 0x4000_0000;
const CHILDS: u32 = 0x2000_0000;
const MASK: u32 = 0x0FFF_FFFF;

/// The longest key read: kmod's keys are module names, aliases and symbol names.
pub const MAX_KEY_LEN: usize = 4096;

/// The most key and value bytes a walk may hold or return: real indexes expand to a few MiB.
pub const MAX_EXPANDED: usize = 64 << 20;

/// Every (key, value) pair of an index, in key order (a key with two values gives two pairs).
pub fn entries(data: &[u8]) -> Result<BTreeSet<(String, String)>, String> {
    if data.is_empty() {
        // depmod leaves an index it has nothing for empty (modules.builtin.alias.bin without
        // modules.builtin.modinfo); kmod reads it as no index.
        return Ok(BTreeSet::new());
    }
    let mut r = Reader { data, at: 0 };
    if r.u32()? != MAGIC {
        return Err("is not a kmod index (bad magic)".into());
    }
    let version = r.u32()?;
    if version >> 16 != VERSION_MAJOR {
        return Err(format!("kmod index version {version:#x}, not 2.x"));
    }
    let root = r.u32()?;
    let mut out = BTreeSet::new();
    // Each node is read once: a cycle or a shared node is refused, so the walk ends and its
    // output stays within the file's size times the key bound.
    let mut seen = BTreeSet::new();
    let mut stack: Vec<(u32, Vec<u8>)> = vec![(root, Vec::new())];
    let mut spent = 0usize;
    let mut spend = |n: usize| {
        spent += n;
        if spent > MAX_EXPANDED {
            return Err(format!(
                "expands to more than {MAX_EXPANDED} bytes of keys and values"
            ));
        }
        Ok(())
    };
    while let Some((offset, mut key)) = stack.pop() {
        if offset & MASK == 0 {
            continue;
        }
        if !seen.insert(offset & MASK) {
            return Err(format!("node {:#x} is reached twice", offset & MASK));
        }
        r.at = (offset & MASK) as usize;
        if offset & PREFIX != 0 {
            key.extend_from_slice(r.cstr()?);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(format!("a key is longer than {MAX_KEY_LEN} bytes"));
        }
        if offset & CHILDS != 0 {
            let (first, last) = (r.u8()?, r.u8()?);
            if last < first {
                return Err(format!("node {:#x}: bad child range", offset & MASK));
            }
            for c in first..=last {
                let child = r.u32()?;
                spend(key.len() + 1)?;
                let mut k = key.clone();
                k.push(c);
                stack.push((child, k));
            }
        }
        if offset & VALUES != 0 {
            let count = r.u32()?;
            let name = text(&key)?;
            for _ in 0..count {
                let _priority = r.u32()?;
                let value = text(r.cstr()?)?;
                spend(name.len() + value.len())?;
                out.insert((name.clone(), value));
            }
        }
    }
    Ok(out)
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "holds a key or value that is not UTF-8".into())
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(format!("truncated at offset {:#x}", self.at));
        };
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn cstr(&mut self) -> Result<&[u8], String> {
        let rest = self.data.get(self.at..).unwrap_or_default();
        let Some(n) = rest.iter().position(|&b| b == 0) else {
            return Err(format!("unterminated string at offset {:#x}", self.at));
        };
        let s = &self.data[self.at..self.at + n];
        self.at += n + 1;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_indexes_are_refused_not_looped() {
        assert!(entries(b"").unwrap().is_empty());
        assert!(entries(b"\xb0\x07").is_err());
        assert!(entries(&[0xb0, 0x07, 0xf4, 0x57, 0, 1, 0, 0, 0, 0, 0, 0]).is_err());
        // A root whose only child is itself.
        let mut cyc = vec![0xb0, 0x07, 0xf4, 0x57, 0, 2, 0, 1, 0x20, 0, 0, 12];
        cyc.extend_from_slice(&[b'a', b'a', 0x20, 0, 0, 12]);
        let e = entries(&cyc).unwrap_err();
        assert!(e.contains("reached twice"), "{e}");
    }
}
