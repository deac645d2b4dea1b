//! The guard reads disks that may hold anything: partition tables (GPT, MBR with extended
//! partitions), ext4, FAT, LVM labels and md superblocks from arbitrary bytes must never panic,
//! loop, or allocate without bound.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use ingot_machine::guard::scan_disk;
use ingot_machine::Disk;
use libfuzzer_sys::fuzz_target;

/// One scratch file per fuzzing process, rewritten for every input.
fn scratch() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        PathBuf::from(format!("{dir}/ingot-fuzz-disk-{}.img", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the sector size; the rest is the disk.
    let Some((&pick, image)) = data.split_first() else {
        return;
    };
    let path = scratch();
    std::fs::write(path, image).expect("writing the scratch disk");
    let disk = Disk {
        name: "fuzz0".into(),
        node: path.clone(),
        dev: None,
        size_bytes: image.len() as u64,
        logical_block_size: if pick & 1 == 0 { 512 } else { 4096 },
        rotational: false,
        removable: false,
        model: None,
        serial: None,
        wwn: None,
        identifiers: vec![],
    };
    let _ = scan_disk(&disk, pick & 2 != 0);
});
