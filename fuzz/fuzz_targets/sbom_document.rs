//! A layer's SBOM as `ingot verify`, `inspect --packages` and `diff` read it, and an os-release
//! as the build reads the purls' `distro` from it (`OS_RELEASE\0SBOM`): never a panic; a distro
//! only of `[a-z0-9._-]` within its bound; and the packages of an accepted document, written
//! again with that distro and read back, are the same packages.
#![no_main]

use ingot_artifact::sbom::{
    distro_from_os_release, packages_of, spdx_document, DocumentInfo, SbomError, MAX_DISTRO_FIELD,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (os_release, sbom) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let distro = distro_from_os_release(&String::from_utf8_lossy(os_release));
    if let Some(d) = &distro {
        assert!(d.len() <= 2 * MAX_DISTRO_FIELD + 1);
        assert!(d
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)));
    }
    let Ok(packages) = packages_of(sbom, "fuzz") else {
        return;
    };
    let info = DocumentInfo {
        stack: "fuzz",
        version: "1.0.0",
        layer: "fuzz",
        created: "2024-01-01T00:00:00Z",
        distro: distro.as_deref(),
    };
    let doc = match spdx_document(&info, &packages) {
        Ok(doc) => doc,
        // The distro's bytes can take a document read just under the limit over it.
        Err(SbomError::TooLarge { .. }) => return,
        Err(e) => panic!("read but not written again: {e}"),
    };
    let again = packages_of(&doc, "fuzz").expect("what was written is read");
    let key =
        |p: &ingot_artifact::sbom::DebPackage| (p.name.clone(), p.arch.clone(), p.version.clone());
    let (a, b): (Vec<_>, Vec<_>) = (
        packages.iter().map(key).collect(),
        again.iter().map(key).collect(),
    );
    assert_eq!(a, b);
});
