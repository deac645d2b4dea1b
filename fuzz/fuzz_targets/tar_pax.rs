//! The tar reader's PAX records: the input is the body of a PAX extended header (`x`) that
//! precedes one member, whose type is the input's first byte (a file, symlink, directory, hard
//! link, character device 0/0 or 1/3, block device or FIFO). Loading never panics, and a tree
//! it accepts has no NUL byte in any name, link target or attribute name, no overlayfs metadata
//! (no 0/0 character device, no `trusted.overlay.*` / `user.overlay.*` attribute from a
//! `SCHILY.xattr.*` record), and builds into an ext4 image.
#![no_main]

use ingot_layers::stack_rules::OVERLAY_XATTR_PREFIXES;
use ingot_layers::tree::{NodeKind, Tree};
use ingot_layers::{build_image, Ext4Options, Source};
use libfuzzer_sys::fuzz_target;

/// One 512-byte ustar header.
fn header(name: &[u8], kind: u8, size: usize, (major, minor): (u32, u32)) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[157..163].copy_from_slice(b"target");
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[329..336].copy_from_slice(format!("{major:07o}").as_bytes());
    h[337..344].copy_from_slice(format!("{minor:07o}").as_bytes());
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

fn padded(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

fn check(tree: &Tree) {
    for node in &tree.nodes {
        assert!(node.meta.xattrs.keys().all(|k| !k.contains(&0)));
        assert!(node
            .meta
            .xattrs
            .keys()
            .all(|k| OVERLAY_XATTR_PREFIXES.iter().all(|p| !k.starts_with(p))));
        match &node.kind {
            NodeKind::CharDev { major: 0, minor: 0 } => panic!("a whiteout was accepted"),
            NodeKind::Dir(children) => assert!(children.keys().all(|k| !k.contains(&0))),
            NodeKind::Symlink(t) => assert!(!t.contains(&0)),
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, records)) = data.split_first() else {
        return;
    };
    let (kind, dev) = match kind % 8 {
        0 => (b'0', (0, 0)),
        1 => (b'2', (0, 0)),
        2 => (b'5', (0, 0)),
        3 => (b'1', (0, 0)),
        4 => (b'3', (0, 0)),
        5 => (b'3', (1, 3)),
        6 => (b'4', (7, 0)),
        _ => (b'6', (0, 0)),
    };
    let mut archive = Vec::new();
    archive.extend_from_slice(&header(b"PaxHeaders/x", b'x', records.len(), (0, 0)));
    padded(&mut archive, records);
    archive.extend_from_slice(&header(b"member", kind, 0, dev));
    archive.extend_from_slice(&[0u8; 1024]);
    let dir = tempfile::tempdir().expect("temp dir");
    let tar = dir.path().join("in.tar");
    std::fs::write(&tar, &archive).expect("writing the archive");
    let source = Source::Tar(tar);
    if let Ok(tree) = source.load(dir.path()) {
        check(&tree);
        let opts = Ext4Options {
            seed: b"fuzz".to_vec(),
            ..Default::default()
        };
        // The tree was accepted: writing it may only fail for a reason, never panic.
        let _ = build_image(&source, &dir.path().join("out.img"), &opts);
    }
});
