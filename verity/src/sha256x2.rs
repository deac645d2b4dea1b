//! Two SHA-256 computations at once with the x86 SHA extensions.
//!
//! `sha256rnds2` has a latency of several cycles but can issue every cycle or two, so a single
//! hash leaves the SHA unit mostly idle; interleaving two independent messages keeps it busy.
//! The kernel's dm-verity does the same since Linux 6.x ("2-way SHA-256"). The `sha2` crate
//! hashes one message at a time, so this is ours: only the compression loop and padding, checked
//! against `sha2` in the tests below and against veritysetup in the crate's integration tests.
//!
//! Messages are `first || second` (salt and block in either order), both of the same lengths in
//! the two lanes, which is exactly the shape of dm-verity's salted block hashes.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// True when this CPU has the instructions the 2-way path needs.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("sha")
        && is_x86_feature_detected!("sse4.1")
        && is_x86_feature_detected!("ssse3")
}

/// The 64-byte chunks of `first || second || padding`, borrowing whole chunks straight from the
/// input and assembling only those that straddle a boundary or hold the padding.
struct Chunks<'a> {
    first: &'a [u8],
    second: &'a [u8],
    count: usize,
}

impl<'a> Chunks<'a> {
    fn new(first: &'a [u8], second: &'a [u8]) -> Self {
        let len = first.len() + second.len();
        Chunks {
            first,
            second,
            count: (len + 9).div_ceil(64),
        }
    }

    /// Chunk `i`: a direct slice when it lies inside one part, else assembled in `buf`.
    #[inline(always)]
    fn get<'b>(&self, i: usize, buf: &'b mut [u8; 64]) -> &'b [u8; 64]
    where
        'a: 'b,
    {
        let start = i * 64;
        let f = self.first.len();
        let len = f + self.second.len();
        if start + 64 <= f {
            return self.first[start..start + 64].try_into().expect("64 bytes");
        }
        if start >= f && start + 64 <= len {
            return self.second[start - f..start - f + 64]
                .try_into()
                .expect("64 bytes");
        }
        // Straddling chunk: copy what each part contributes, then the 0x80 terminator.
        *buf = [0u8; 64];
        let end = (start + 64).min(len);
        let mut pos = start;
        while pos < end {
            let (src, at) = if pos < f {
                (self.first, pos)
            } else {
                (self.second, pos - f)
            };
            let n = (src.len() - at).min(end - pos);
            buf[pos - start..pos - start + n].copy_from_slice(&src[at..at + n]);
            pos += n;
        }
        if (start..start + 64).contains(&len) {
            buf[len - start] = 0x80;
        }
        if i == self.count - 1 {
            buf[56..].copy_from_slice(&((len as u64) * 8).to_be_bytes());
        }
        buf
    }
}

/// SHA-256 of `first || a` and `first || b` (or `a || second` and `b || second` when `suffix`),
/// written to `out_a` and `out_b` (32 bytes each). `a` and `b` must have equal lengths.
pub(crate) fn hash_pair(
    fixed: &[u8],
    suffix: bool,
    a: &[u8],
    b: &[u8],
    out_a: &mut [u8],
    out_b: &mut [u8],
) {
    assert!(a.len() == b.len() && out_a.len() == 32 && out_b.len() == 32);
    assert!(available(), "hash_pair needs the SHA extensions");
    let (ca, cb) = if suffix {
        (Chunks::new(a, fixed), Chunks::new(b, fixed))
    } else {
        (Chunks::new(fixed, a), Chunks::new(fixed, b))
    };
    // SAFETY: the CPU features the function enables were checked just above.
    unsafe { hash_pair_ni(&ca, &cb, out_a, out_b) }
}

#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
unsafe fn hash_pair_ni(ca: &Chunks<'_>, cb: &Chunks<'_>, out_a: &mut [u8], out_b: &mut [u8]) {
    // SAFETY (whole fn): the helpers need the features this function enables.
    unsafe {
        let (mut a0, mut a1) = init();
        let (mut b0, mut b1) = init();
        let (mut buf_a, mut buf_b) = ([0u8; 64], [0u8; 64]);
        for i in 0..ca.count {
            let ma = ca.get(i, &mut buf_a);
            let mb = cb.get(i, &mut buf_b);
            compress2(&mut a0, &mut a1, ma, &mut b0, &mut b1, mb);
        }
        store(a0, a1, out_a);
        store(b0, b1, out_b);
    }
}

/// The initial state in the ABEF/CDGH layout `sha256rnds2` works on.
#[inline(always)]
unsafe fn init() -> (__m128i, __m128i) {
    // SAFETY (whole fn): callers run with the features enabled; loads are unaligned-safe.
    unsafe {
        let tmp = _mm_loadu_si128(H0.as_ptr() as *const __m128i); // a b c d
        let s1 = _mm_loadu_si128(H0.as_ptr().add(4) as *const __m128i); // e f g h
        let tmp = _mm_shuffle_epi32(tmp, 0xB1); // c d a b
        let s1 = _mm_shuffle_epi32(s1, 0x1B); // h g f e
        let s0 = _mm_alignr_epi8(tmp, s1, 8); // a b e f
        let s1 = _mm_blend_epi16(s1, tmp, 0xF0); // c d g h
        (s0, s1)
    }
}

#[inline(always)]
unsafe fn store(s0: __m128i, s1: __m128i, out: &mut [u8]) {
    // SAFETY (whole fn): features enabled by the caller; `out` is 32 bytes (checked in hash_pair).
    unsafe {
        let tmp = _mm_shuffle_epi32(s0, 0x1B); // f e b a
        let s1 = _mm_shuffle_epi32(s1, 0xB1); // d c h g
        let abcd = _mm_blend_epi16(tmp, s1, 0xF0); // d c b a
        let efgh = _mm_alignr_epi8(s1, tmp, 8); // h g f e
                                                // The digest is the state words big-endian.
        let bswap = _mm_set_epi64x(0x0c0d0e0f08090a0b, 0x0405060700010203);
        _mm_storeu_si128(
            out.as_mut_ptr() as *mut __m128i,
            _mm_shuffle_epi8(abcd, bswap),
        );
        _mm_storeu_si128(
            out.as_mut_ptr().add(16) as *mut __m128i,
            _mm_shuffle_epi8(efgh, bswap),
        );
    }
}

/// One 64-byte block for each lane, the two round chains written side by side so the CPU can
/// overlap them.
#[inline(always)]
unsafe fn compress2(
    a0: &mut __m128i,
    a1: &mut __m128i,
    ma: &[u8; 64],
    b0: &mut __m128i,
    b1: &mut __m128i,
    mb: &[u8; 64],
) {
    // SAFETY (whole fn): features enabled by the caller; every load reads inside a 64-byte array.
    unsafe {
        let bswap = _mm_set_epi64x(0x0c0d0e0f08090a0b, 0x0405060700010203);
        let load = |m: &[u8; 64], q: usize| {
            _mm_shuffle_epi8(
                _mm_loadu_si128(m.as_ptr().add(16 * q) as *const __m128i),
                bswap,
            )
        };
        let mut wa = [load(ma, 0), load(ma, 1), load(ma, 2), load(ma, 3)];
        let mut wb = [load(mb, 0), load(mb, 1), load(mb, 2), load(mb, 3)];
        let (save_a0, save_a1, save_b0, save_b1) = (*a0, *a1, *b0, *b1);
        // Quad i uses words 4i..4i+3; from quad 4 on they are scheduled from the previous four:
        // w[i] = msg2(msg1(w[i-4], w[i-3]) + (w[i-1]:w[i-2] >> 32 bits), w[i-1]).
        macro_rules! quad {
            ($i:expr) => {{
                let i: usize = $i;
                if i >= 4 {
                    let t = _mm_alignr_epi8(wa[(i + 3) % 4], wa[(i + 2) % 4], 4);
                    wa[i % 4] = _mm_sha256msg2_epu32(
                        _mm_add_epi32(_mm_sha256msg1_epu32(wa[i % 4], wa[(i + 1) % 4]), t),
                        wa[(i + 3) % 4],
                    );
                    let t = _mm_alignr_epi8(wb[(i + 3) % 4], wb[(i + 2) % 4], 4);
                    wb[i % 4] = _mm_sha256msg2_epu32(
                        _mm_add_epi32(_mm_sha256msg1_epu32(wb[i % 4], wb[(i + 1) % 4]), t),
                        wb[(i + 3) % 4],
                    );
                }
                let k = _mm_loadu_si128(K.as_ptr().add(4 * i) as *const __m128i);
                let ka = _mm_add_epi32(wa[i % 4], k);
                let kb = _mm_add_epi32(wb[i % 4], k);
                *a1 = _mm_sha256rnds2_epu32(*a1, *a0, ka);
                *b1 = _mm_sha256rnds2_epu32(*b1, *b0, kb);
                *a0 = _mm_sha256rnds2_epu32(*a0, *a1, _mm_shuffle_epi32(ka, 0x0E));
                *b0 = _mm_sha256rnds2_epu32(*b0, *b1, _mm_shuffle_epi32(kb, 0x0E));
            }};
        }
        quad!(0);
        quad!(1);
        quad!(2);
        quad!(3);
        quad!(4);
        quad!(5);
        quad!(6);
        quad!(7);
        quad!(8);
        quad!(9);
        quad!(10);
        quad!(11);
        quad!(12);
        quad!(13);
        quad!(14);
        quad!(15);
        *a0 = _mm_add_epi32(*a0, save_a0);
        *a1 = _mm_add_epi32(*a1, save_a1);
        *b0 = _mm_add_epi32(*b0, save_b0);
        *b1 = _mm_add_epi32(*b1, save_b1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn reference(parts: &[&[u8]]) -> Vec<u8> {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
        }
        h.finalize().to_vec()
    }

    #[test]
    fn matches_sha2_for_every_boundary() {
        if !available() {
            eprintln!("SKIP: no SHA extensions on this CPU");
            return;
        }
        let pattern: Vec<u8> = (0..9000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect();
        // Every salt length around chunk boundaries, and block lengths around them too.
        for fixed_len in (0..=70).chain([127, 128, 129, 255, 256]) {
            let fixed = &pattern[8000..8000 + fixed_len];
            for len in [
                0usize,
                1,
                55,
                56,
                63,
                64,
                65,
                119,
                120,
                512,
                4096,
                4096 + 33,
            ] {
                let a = &pattern[..len];
                let b = &pattern[17..17 + len];
                for suffix in [false, true] {
                    let (mut oa, mut ob) = ([0u8; 32], [0u8; 32]);
                    hash_pair(fixed, suffix, a, b, &mut oa, &mut ob);
                    let (ra, rb) = if suffix {
                        (reference(&[a, fixed]), reference(&[b, fixed]))
                    } else {
                        (reference(&[fixed, a]), reference(&[fixed, b]))
                    };
                    assert_eq!(
                        oa.to_vec(),
                        ra,
                        "lane a: fixed {fixed_len}, len {len}, suffix {suffix}"
                    );
                    assert_eq!(
                        ob.to_vec(),
                        rb,
                        "lane b: fixed {fixed_len}, len {len}, suffix {suffix}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod speed {
    /// `cargo test --release -p ingot-verity -- --ignored --nocapture two_way_speed`
    #[test]
    #[ignore]
    fn two_way_speed() {
        use sha2::{Digest, Sha256};
        let data: Vec<u8> = (0..64u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let salt = [7u8; 32];
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let mut acc = 0u8;
            for pair in data.chunks(8192) {
                let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
                super::hash_pair(&salt, false, &pair[..4096], &pair[4096..], &mut a, &mut b);
                acc ^= a[0] ^ b[0];
            }
            let two = data.len() as f64 / t.elapsed().as_secs_f64() / 1e6;
            let t = std::time::Instant::now();
            for block in data.chunks(4096) {
                acc ^= Sha256::new_with_prefix(salt).chain_update(block).finalize()[0];
            }
            let one = data.len() as f64 / t.elapsed().as_secs_f64() / 1e6;
            println!("two-way {two:.0} MB/s, sha2 {one:.0} MB/s ({acc})");
        }
    }
}
