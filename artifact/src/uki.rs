//! A unified kernel image read back: its PE/COFF sections by name, as systemd-stub finds them
//! (`.cmdline`, `.linux`, `.initrd`, `.osrel`), each cut to its `VirtualSize` (the file keeps
//! it padded to the file alignment). The `object` crate parses the PE headers.

use object::read::pe::PeFile64;
use sha2::{Digest, Sha256};

/// The most a UKI blob may be: the writer's default ESP.
pub const MAX_UKI_SIZE: u64 = ingot_layers::boot::DEFAULT_ESP_SIZE;

/// Why an image is not a UKI this code reads.
#[derive(Debug, thiserror::Error)]
pub enum UkiError {
    /// Not a PE32+ image.
    #[error("the UKI is not a PE32+ image")]
    Pe(#[source] object::read::Error),
    /// A section systemd-stub needs is missing.
    #[error("the UKI has no {0} section")]
    Missing(&'static str),
    /// A section is there twice (which one would the stub use?).
    #[error("the UKI has two {0} sections")]
    Twice(&'static str),
    /// A section's bytes lie outside the file.
    #[error("the UKI's {0} section lies outside the file")]
    Outside(&'static str),
}

/// The bytes of section `name` (e.g. `.cmdline`), cut to its virtual size.
pub fn section<'a>(image: &'a [u8], name: &'static str) -> Result<&'a [u8], UkiError> {
    let pe = PeFile64::parse(image).map_err(UkiError::Pe)?;
    let mut found = None;
    for s in pe.section_table().iter() {
        if s.raw_name() != name.as_bytes() {
            continue;
        }
        if found.is_some() {
            return Err(UkiError::Twice(name));
        }
        let start = s.pointer_to_raw_data.get(object::LittleEndian) as usize;
        let raw = s.size_of_raw_data.get(object::LittleEndian) as usize;
        let virt = s.virtual_size.get(object::LittleEndian) as usize;
        let len = raw.min(virt);
        let bytes = image
            .get(start..start.checked_add(len).ok_or(UkiError::Outside(name))?)
            .ok_or(UkiError::Outside(name))?;
        found = Some(bytes);
    }
    found.ok_or(UkiError::Missing(name))
}

/// The `.cmdline` section as the stub hands it to the kernel (text; a trailing NUL or newline
/// dropped, as systemd-stub drops them).
pub fn cmdline(image: &[u8]) -> Result<String, UkiError> {
    let bytes = section(image, ".cmdline")?;
    let text = String::from_utf8_lossy(bytes);
    Ok(text.trim_end_matches(['\0', '\n']).to_string())
}

/// The sections systemd-stub 252 measures into PCR 11, in the order it measures them (its
/// `unified_sections` list without `.pcrsig`, which it never measures: the signature cannot
/// cover itself).
pub const MEASURED: [&str; 7] = [
    ".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrpkey",
];

/// One PCR extend: `SHA256(pcr || SHA256(data))`.
pub fn extend(pcr: [u8; 32], data: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(pcr);
    h.update(Sha256::digest(data));
    h.finalize().into()
}

/// The PCR 11 (SHA-256 bank) value systemd-stub leaves when it boots `image`: from zero, for
/// each measured section present, extend by SHA-256 of its name with a NUL, then by SHA-256 of
/// its bytes. `systemd-measure calculate --phase=` computes the same (the tests compare); the
/// booted system's `systemd-pcrphase` extends it further (`sysinit`, ...).
pub fn pcr11(image: &[u8]) -> Result<[u8; 32], UkiError> {
    let mut present = Vec::with_capacity(MEASURED.len());
    for name in MEASURED {
        match section(image, name) {
            Ok(b) => present.push((name, b)),
            Err(UkiError::Missing(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(pcr11_of(&present))
}

/// [`pcr11`] of sections given by name, before they are put into an image (any order: they are
/// measured in [`MEASURED`]'s; names it does not list are not measured).
pub fn pcr11_of(sections: &[(&str, &[u8])]) -> [u8; 32] {
    let mut pcr = [0u8; 32];
    for name in MEASURED {
        let Some((_, bytes)) = sections.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let mut tag = name.as_bytes().to_vec();
        tag.push(0);
        pcr = extend(pcr, &tag);
        pcr = extend(pcr, bytes);
    }
    pcr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_not_a_uki() {
        assert!(matches!(
            section(b"MZ nothing", ".cmdline"),
            Err(UkiError::Pe(_))
        ));
        assert!(matches!(cmdline(&[0u8; 4096]), Err(UkiError::Pe(_))));
    }
}
