//! Deterministic test data that compresses no better than random bytes: big layers, kernels
//! and blobs whose frames must stay frames, reproducible run after run.

/// `n` pseudo-random bytes from `seed`: xorshift64 (fast, deterministic, incompressible to zstd
/// and gzip), its state started from `seed` by splitmix64 so that nearby seeds give unrelated
/// data.
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = splitmix64(seed).max(1);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        assert_eq!(noise(1, 1000), noise(1, 1000));
        assert_ne!(noise(1, 1000), noise(2, 1000));
        assert_eq!(noise(7, 13).len(), 13);
        assert_eq!(&noise(7, 4096)[..100], &noise(7, 100)[..]);
    }

    #[test]
    fn zstd_cannot_shrink_it() {
        let data = noise(3, 1 << 20);
        let packed = zstd::encode_all(&data[..], 19).unwrap();
        assert!(
            packed.len() >= data.len(),
            "{} of {}",
            packed.len(),
            data.len()
        );
    }
}
