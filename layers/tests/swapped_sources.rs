//! A `dir` source whose file is swapped or changed between the scan and the image write (item
//! 12 of "hostile input, second pass"). Before, the write reopened the path and followed a
//! symlink put in the file's place, bringing the target's bytes (any file the builder can read)
//! into the image. Now the write opens with `O_NOFOLLOW` and checks device, inode and size
//! against the scan. The swap is made deterministic by doing it in the check that runs between
//! the scan and the write.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use ingot_layers::{build_layer_checked, Ext4Options, LayerError, Source};

fn opts() -> Ext4Options {
    Ext4Options {
        seed: b"swap".to_vec(),
        source_date_epoch: 1_700_000_000,
        ..Default::default()
    }
}

/// Builds `tree` (holding `etc/motd`), running `swap` between the scan and the write.
fn build_swapped(dir: &Path, swap: impl FnOnce(&Path)) -> Result<(), LayerError> {
    let tree = dir.join("tree");
    let motd = tree.join("etc/motd");
    let out = dir.join("layer.img");
    build_layer_checked(&Source::Dir(tree), &out, None, &opts(), |_| {
        swap(&motd);
        Ok(())
    })
    .map(|_| ())
}

fn fresh(dir: &Path) {
    let tree = dir.join("tree");
    let _ = fs::remove_dir_all(&tree);
    fs::create_dir_all(tree.join("etc")).unwrap();
    fs::write(tree.join("etc/motd"), b"welcome to the node\n").unwrap();
}

#[test]
fn a_file_swapped_after_the_scan_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("secret");
    fs::write(&secret, b"SECRET key material!").unwrap(); // the same size as motd

    type Swap = Box<dyn FnOnce(&Path)>;
    let s = secret.clone();
    let other = tmp.path().join("other");
    let o = other.clone();
    let cases: Vec<(&str, Swap)> = vec![
        (
            "a symlink to another file",
            Box::new(move |p: &Path| {
                fs::remove_file(p).unwrap();
                symlink(&s, p).unwrap();
            }),
        ),
        (
            "another file of the same size",
            Box::new(move |p: &Path| {
                fs::write(&o, b"other bytes, 20 long").unwrap();
                fs::rename(&o, p).unwrap();
            }),
        ),
        (
            "the same file, grown",
            Box::new(|p: &Path| {
                let f = fs::OpenOptions::new().append(true).open(p).unwrap();
                f.set_len(4096).unwrap();
            }),
        ),
    ];
    for (what, swap) in cases {
        fresh(tmp.path());
        let err = build_swapped(tmp.path(), swap).expect_err(what);
        match &err {
            LayerError::FileChanged { path } => {
                assert!(path.ends_with("etc/motd"), "{what}: {err}")
            }
            other => panic!("{what}: {other}"),
        }
        assert!(
            err.to_string()
                .contains("file changed while the image was being written"),
            "{what}: {err}"
        );
        assert!(
            !tmp.path().join("layer.img").exists(),
            "{what}: an image was left"
        );
    }

    // Unchanged, the same build succeeds.
    fresh(tmp.path());
    build_swapped(tmp.path(), |_| {}).unwrap();
    assert!(tmp.path().join("layer.img").exists());
}
