//! Byte-for-byte compatibility with the real `veritysetup` (cryptsetup-bin): the same files in,
//! the same hash device and root hash out; each accepts the other's trees; both refuse the same
//! corruptions.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ingot_verity::{format_file, verify_files, HashAlgorithm, HashType, VerityError, VerityParams};
use rand::{Rng, RngCore, SeedableRng};

/// The veritysetup binary (cryptsetup-bin), or None: the test is skipped (`ingot_testkit::skip`).
fn veritysetup() -> Option<PathBuf> {
    use ingot_testkit::skip::{current_test, find_tool, have_tool};
    have_tool(&current_test(), "veritysetup").then(|| find_tool("veritysetup").expect("installed"))
}

fn run(tool: &Path, args: &[String]) -> Output {
    Command::new(tool)
        .args(args)
        .output()
        .expect("running veritysetup")
}

fn root_from_stdout(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .unwrap_or_else(|| panic!("no root hash in veritysetup output: {text}"))
        .trim()
        .to_string()
}

/// veritysetup's arguments for `params` (salt, uuid, everything explicit).
fn args(params: &VerityParams) -> Vec<String> {
    let mut a = vec![
        format!("--hash={}", params.algorithm),
        format!("--format={}", params.hash_type.as_u32()),
        format!("--data-block-size={}", params.data_block_size),
        format!("--hash-block-size={}", params.hash_block_size),
        format!("--data-blocks={}", params.data_blocks),
        format!("--hash-offset={}", params.hash_offset),
        format!(
            "--salt={}",
            if params.salt.is_empty() {
                "-".to_string()
            } else {
                hex::encode(&params.salt)
            }
        ),
    ];
    if let Some(u) = params.uuid {
        a.push(format!("--uuid={}", ingot_verity::uuid_to_string(&u)));
    }
    if !params.superblock {
        a.push("--no-superblock".into());
    }
    a
}

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Case {
        Case {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Formats `data` with both tools onto fresh hash files and asserts identical bytes and roots.
/// Returns (ingot hash path, veritysetup hash path, root hex).
fn cross_format(
    tool: &Path,
    case: &Case,
    data: &Path,
    params: &VerityParams,
    label: &str,
) -> (PathBuf, PathBuf, String) {
    let ours = case.path(&format!("{label}.ingot.hash"));
    let theirs = case.path(&format!("{label}.vs.hash"));
    let result =
        format_file(data, &ours, params).unwrap_or_else(|e| panic!("{label}: ingot format: {e}"));
    let mut a = vec!["format".to_string()];
    a.extend(args(params));
    a.push(data.display().to_string());
    a.push(theirs.display().to_string());
    let out = run(tool, &a);
    assert!(
        out.status.success(),
        "{label}: veritysetup format failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = root_from_stdout(&out);
    assert_eq!(
        result.root_hash.to_string(),
        root,
        "{label}: root hash differs from veritysetup"
    );
    let a = std::fs::read(&ours).unwrap();
    let b = std::fs::read(&theirs).unwrap();
    assert_eq!(a.len(), b.len(), "{label}: hash file length differs");
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!("{label}: hash files differ first at byte {i}");
    }
    (ours, theirs, root)
}

fn write_mod251(path: &Path, len: usize) {
    let data: Vec<u8> = (0..len).map(|k| (k % 251) as u8).collect();
    std::fs::write(path, data).unwrap();
}

fn vector_params(n: u64) -> VerityParams {
    VerityParams {
        data_blocks: n,
        salt: (0u8..32).collect(),
        uuid: ingot_verity::parse_uuid("12345678-1234-1234-1234-123456789abc"),
        ..VerityParams::default()
    }
}

/// A change to the base parameters of a test case.
type Tweak = fn(&mut VerityParams);

/// Every row of the reference's table 1.8, plus the further cases it lists, against the real tool.
#[test]
fn reference_table_against_veritysetup() {
    let Some(tool) = veritysetup() else { return };
    let case = Case::new();
    for n in [1u64, 2, 128, 129, 16385] {
        let data = case.path(&format!("mod251-{n}"));
        write_mod251(&data, n as usize * 4096);
        cross_format(&tool, &case, &data, &vector_params(n), &format!("n{n}"));
    }
    let zero = case.path("zero");
    std::fs::write(&zero, vec![0u8; 256 * 4096]).unwrap();
    cross_format(&tool, &case, &zero, &vector_params(256), "zero");

    let data = case.path("mod251-129");
    let variants: [(&str, Tweak); 9] = [
        ("nosalt", |p| p.salt.clear()),
        ("v0", |p| p.hash_type = HashType::ChromeOs),
        ("sha1", |p| p.algorithm = HashAlgorithm::Sha1),
        ("sha512", |p| p.algorithm = HashAlgorithm::Sha512),
        ("nosb", |p| p.superblock = false),
        ("offset1536", |p| p.hash_offset = 1536),
        ("1k-4k", |p| {
            p.data_block_size = 1024;
            p.data_blocks = 129 * 4;
        }),
        ("4k-1k", |p| p.hash_block_size = 1024),
        ("512-512", |p| {
            p.data_block_size = 512;
            p.hash_block_size = 512;
            p.data_blocks = 129 * 8;
        }),
    ];
    for (label, change) in variants {
        let mut p = vector_params(129);
        change(&mut p);
        cross_format(&tool, &case, &data, &p, label);
    }

    // v0 with sha1 on 300 blocks.
    let d300 = case.path("mod251-300");
    write_mod251(&d300, 300 * 4096);
    let mut p = vector_params(300);
    p.hash_type = HashType::ChromeOs;
    p.algorithm = HashAlgorithm::Sha1;
    cross_format(&tool, &case, &d300, &p, "v0-sha1-300");
}

/// Data and tree on one file: `--data-blocks 200 --hash-offset 819200`, and the overlap refusal.
#[test]
fn shared_device_with_hash_offset() {
    let Some(tool) = veritysetup() else { return };
    let case = Case::new();
    let ours = case.path("ours.img");
    let theirs = case.path("theirs.img");
    write_mod251(&ours, 300 * 4096);
    write_mod251(&theirs, 300 * 4096);
    let mut p = vector_params(200);
    p.hash_offset = 819_200;
    let r = format_file(&ours, &ours, &p).unwrap();
    let mut a = vec!["format".to_string()];
    a.extend(args(&p));
    a.push(theirs.display().to_string());
    a.push(theirs.display().to_string());
    let out = run(&tool, &a);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(r.root_hash.to_string(), root_from_stdout(&out));
    assert_eq!(
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap()
    );

    p.hash_offset = 200 * 4096 - 512;
    let err = format_file(&ours, &ours, &p).unwrap_err();
    assert!(matches!(err, VerityError::Overlap { .. }), "{err}");
}

/// Random sizes, block sizes, salts, formats, algorithms, superblock on and off, hash offsets.
#[test]
fn randomized_cross_check() {
    let Some(tool) = veritysetup() else { return };
    let seed: u64 = std::env::var("INGOT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("randomized_cross_check seed {seed} (INGOT_TEST_SEED={seed} reproduces it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let case = Case::new();
    let algorithms = [
        HashAlgorithm::Sha256,
        HashAlgorithm::Sha1,
        HashAlgorithm::Sha512,
    ];
    let sizes = [1u64, 128, 129, 16385, 300_000];
    for (i, &blocks) in sizes
        .iter()
        .chain(&[rng.gen_range(2..5000u64), rng.gen_range(2..5000u64)])
        .enumerate()
    {
        // Keep the big case at 512-byte blocks so the data stays ~150 MB.
        let dbs: u32 = if blocks >= 100_000 {
            512
        } else {
            1 << rng.gen_range(9..=16)
        };
        let hbs: u32 = 1 << rng.gen_range(9..=16);
        let mut salt = vec![0u8; rng.gen_range(0..=256)];
        rng.fill_bytes(&mut salt);
        let mut uuid = [0u8; 16];
        rng.fill_bytes(&mut uuid);
        let superblock = rng.gen_bool(0.7);
        // A one-block tree is only a superblock, which veritysetup writes read-modify-write in
        // min(hash block, page) units: it refuses an offset inside such a unit of an empty file.
        let unit = if blocks == 1 && superblock {
            (hbs as u64).min(4096)
        } else {
            512
        };
        let hash_offset = if rng.gen_bool(0.3) {
            // Without a superblock veritysetup truncates to the hash block size: keep it aligned.
            if superblock {
                unit * rng.gen_range(1..20u64)
            } else {
                hbs as u64 * rng.gen_range(1..4u64)
            }
        } else {
            0
        };
        let p = VerityParams {
            hash_type: if rng.gen_bool(0.8) {
                HashType::Normal
            } else {
                HashType::ChromeOs
            },
            algorithm: algorithms[rng.gen_range(0..algorithms.len())],
            data_block_size: dbs,
            hash_block_size: hbs,
            data_blocks: blocks,
            salt,
            uuid: Some(uuid),
            hash_offset,
            superblock,
        };
        let data = case.path(&format!("rand-{i}"));
        let mut bytes = vec![0u8; (blocks * dbs as u64) as usize + rng.gen_range(0..dbs as usize)];
        // Mix random and zero regions, as real images have.
        for chunk in bytes.chunks_mut(dbs as usize) {
            if rng.gen_bool(0.7) {
                rng.fill_bytes(chunk);
            }
        }
        std::fs::write(&data, &bytes).unwrap();
        let label = format!(
            "case {i}: {p:?}",
            p = (
                blocks,
                dbs,
                hbs,
                p.algorithm,
                p.hash_type,
                p.salt.len(),
                superblock,
                hash_offset
            )
        );
        cross_format(&tool, &case, &data, &p, &format!("rand{i}"));
        eprintln!("ok {label}");
    }
}

/// Each tool accepts the other's trees; both refuse a flipped data byte and a flipped hash byte.
#[test]
fn verify_interop_and_corruption() {
    let Some(tool) = veritysetup() else { return };
    let case = Case::new();
    let data = case.path("data");
    let n = 5000u64;
    let mut bytes = vec![0u8; n as usize * 4096];
    rand::thread_rng().fill_bytes(&mut bytes[..3000 * 4096]);
    std::fs::write(&data, &bytes).unwrap();
    let p = vector_params(n);
    let (ours, theirs, root) = cross_format(&tool, &case, &data, &p, "interop");
    let root_bytes: ingot_verity::RootHash = root.parse().unwrap();

    let vs_verify = |data: &Path, hash: &Path| {
        run(
            &tool,
            &[
                "verify".into(),
                data.display().to_string(),
                hash.display().to_string(),
                root.clone(),
            ],
        )
        .status
        .success()
    };
    // Trees cross over.
    verify_files(&data, &theirs, &root_bytes, &VerityParams::default())
        .expect("ingot accepts veritysetup's tree");
    assert!(vs_verify(&data, &ours), "veritysetup accepts ingot's tree");

    // A flipped data byte, in a random block and in a zero block.
    for offset in [1234 * 4096 + 77, 4000 * 4096 + 5] {
        let bad = case.path("bad-data");
        let mut b = bytes.clone();
        b[offset] ^= 0x40;
        std::fs::write(&bad, &b).unwrap();
        let err = verify_files(&bad, &ours, &root_bytes, &VerityParams::default()).unwrap_err();
        let block = offset as u64 / 4096;
        assert!(
            matches!(err, VerityError::Verify(ingot_verity::VerifyError::DataBlock { block: b, .. }) if b == block),
            "{err}"
        );
        assert!(
            !vs_verify(&bad, &ours),
            "veritysetup must refuse a flipped data byte at {offset}"
        );
    }

    // A flipped byte in a level-0 hash block, and in the top block.
    let g = p.geometry().unwrap();
    for offset in [
        g.level_start[0] * 4096 + 10 * 4096 + 3,
        g.level_start[g.levels - 1] * 4096 + 1,
    ] {
        let bad = case.path("bad-hash");
        let mut h = std::fs::read(&ours).unwrap();
        h[offset as usize] ^= 1;
        std::fs::write(&bad, &h).unwrap();
        let err = verify_files(&data, &bad, &root_bytes, &VerityParams::default()).unwrap_err();
        assert!(matches!(err, VerityError::Verify(_)), "{err}");
        assert!(
            !vs_verify(&data, &bad),
            "veritysetup must refuse a flipped hash byte at {offset}"
        );
    }
}

/// Data files that are sparse (holes) give the same tree as veritysetup, which reads the zeros.
#[test]
fn sparse_file_matches() {
    let Some(tool) = veritysetup() else { return };
    let case = Case::new();
    let data = case.path("sparse");
    let f = std::fs::File::create(&data).unwrap();
    f.set_len(64 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    let mut chunk = vec![0u8; 1 << 20];
    rand::thread_rng().fill_bytes(&mut chunk);
    f.write_all_at(&chunk, 10 << 20).unwrap();
    f.write_all_at(&chunk[..5000], (40 << 20) + 100).unwrap();
    drop(f);
    let p = VerityParams {
        data_blocks: (64 << 20) / 4096,
        ..vector_params(1)
    };
    cross_format(&tool, &case, &data, &p, "sparse");
}
