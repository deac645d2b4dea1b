//! The dpkg status: its installed packages, parsed under the limits the module sets, each with
//! its declared licence from the layer's tree; and what each layer of a stack lists.

use std::collections::BTreeMap;

use super::{
    check_fields, copyright, show, DebPackage, SbomError, MAX_ARCH, MAX_MAINTAINER, MAX_NAME,
    MAX_PACKAGES, MAX_STATUS_SIZE, MAX_VERSION, STATUS_PATHS,
};

/// Parse a dpkg status file: the packages whose `Status` is `install ok installed`, sorted.
/// `layer` and `path` name the file in errors.
pub fn parse_status(bytes: &[u8], layer: &str, path: &str) -> Result<Vec<DebPackage>, SbomError> {
    let refuse = |reason: String| SbomError::Status {
        layer: layer.to_owned(),
        path: path.to_owned(),
        reason,
    };
    if bytes.len() as u64 > MAX_STATUS_SIZE {
        return Err(refuse(format!(
            "{} bytes, more than the {MAX_STATUS_SIZE} a status may have",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        refuse(format!(
            "not UTF-8 text (byte {} is not valid)",
            e.valid_up_to()
        ))
    })?;
    if text.contains('\0') {
        return Err(refuse("holds a NUL byte: not a text file".into()));
    }
    let mut out: BTreeMap<(String, String), DebPackage> = BTreeMap::new();
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    let mut start_line = 1;
    let mut last: Option<&str> = None;
    let lines = text.split('\n').chain(std::iter::once(""));
    for (i, line) in lines.enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            if !fields.is_empty() {
                finish_entry(&fields, start_line, &mut out).map_err(&refuse)?;
                if out.len() > MAX_PACKAGES {
                    return Err(refuse(format!("more than {MAX_PACKAGES} packages")));
                }
                fields.clear();
            }
            last = None;
            start_line = n + 1;
            continue;
        }
        if line.starts_with([' ', '\t']) {
            // A continuation line (Description, Conffiles): only the fields kept must be one line.
            match last {
                Some(f) if KEPT.contains(&f) => {
                    return Err(refuse(format!(
                        "line {n}: field {f} continues on a second line"
                    )))
                }
                Some(_) => continue,
                None => {
                    return Err(refuse(format!(
                        "line {n}: a continuation line opens an entry"
                    )))
                }
            }
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(refuse(format!("line {n}: not a `Field: value` line")));
        };
        if name.is_empty() || name.contains([' ', '\t']) {
            return Err(refuse(format!(
                "line {n}: `{}` is not a field name",
                show(name)
            )));
        }
        let value = value.trim();
        if let Some(max) = field_limit(name).filter(|max| value.len() > *max) {
            return Err(refuse(format!(
                "line {n}: field {name} is longer than {max} bytes"
            )));
        }
        if fields.insert(name, value).is_some() {
            return Err(refuse(format!(
                "line {n}: field {name} appears twice in one entry"
            )));
        }
        last = Some(name);
    }
    Ok(out.into_values().collect())
}

const KEPT: [&str; 5] = ["Package", "Version", "Architecture", "Maintainer", "Status"];

/// The longest value a kept field may have; `None` for the fields not kept.
fn field_limit(field: &str) -> Option<usize> {
    Some(match field {
        "Package" => MAX_NAME,
        "Version" => MAX_VERSION,
        "Architecture" => MAX_ARCH,
        "Maintainer" => MAX_MAINTAINER,
        "Status" => 64,
        _ => return None,
    })
}

fn finish_entry(
    fields: &BTreeMap<&str, &str>,
    line: usize,
    out: &mut BTreeMap<(String, String), DebPackage>,
) -> Result<(), String> {
    let get = |f: &str| {
        fields
            .get(f)
            .copied()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the entry at line {line} has no {f} field"))
    };
    let name = get("Package")?;
    if get("Status")? != "install ok installed" {
        return Ok(());
    }
    let (version, arch) = (get("Version")?, get("Architecture")?);
    if let Some(why) = check_fields(name, arch, version) {
        return Err(format!("the entry at line {line}: {why}"));
    }
    let maintainer = fields.get("Maintainer").copied();
    if let Some(m) = maintainer.filter(|m| m.chars().any(char::is_control)) {
        return Err(format!(
            "the entry at line {line}: Maintainer `{}` holds a control character",
            show(m)
        ));
    }
    let pkg = DebPackage {
        name: name.to_owned(),
        arch: arch.to_owned(),
        version: version.to_owned(),
        maintainer: maintainer.map(str::to_owned),
        declared: None,
        sha256: None,
    };
    if out
        .insert((pkg.name.clone(), pkg.arch.clone()), pkg)
        .is_some()
    {
        return Err(format!(
            "the entry at line {line}: package {name}:{arch} is listed twice"
        ));
    }
    Ok(())
}

/// The installed packages of a layer's tree: its dpkg status at the first of [`STATUS_PATHS`]
/// that is there, `None` when neither is (a layer without a status has no packages).
pub fn status_of(
    tree: &ingot_layers::tree::Tree,
    layer: &str,
) -> Result<Option<Vec<DebPackage>>, SbomError> {
    for path in STATUS_PATHS {
        let bytes = tree
            .read_file_bounded(path, MAX_STATUS_SIZE)
            .map_err(|reason| SbomError::Status {
                layer: layer.to_owned(),
                path: path.to_owned(),
                reason,
            })?;
        if let Some(bytes) = bytes {
            let mut packages = parse_status(&bytes, layer, path)?;
            declare_licences(tree, &mut packages);
            return Ok(Some(packages));
        }
    }
    Ok(None)
}

/// Where a tree says which distribution it is (Debian's `/etc/os-release` is a symlink to the
/// first, which a tree lookup does not follow).
const OS_RELEASE_PATHS: [&str; 2] = ["usr/lib/os-release", "etc/os-release"];
/// The longest os-release `ID` or version taken (so a purl's `distro` is at most 65 bytes).
pub const MAX_DISTRO_FIELD: usize = 32;

/// The distribution of `tree` as a purl's `distro` qualifier: os-release's `ID` and
/// `VERSION_ID` (`debian-12`), or `ID` and `VERSION_CODENAME` (`debian-bookworm`: testing has no
/// `VERSION_ID`). `None` when the tree has no os-release (a layer above the base) or it names
/// none in `[a-z0-9._-]`.
pub fn distro_of(tree: &ingot_layers::tree::Tree) -> Option<String> {
    let text = OS_RELEASE_PATHS
        .iter()
        .find_map(|p| tree.read_file_bounded(p, 64 << 10).ok().flatten())?;
    distro_from_os_release(&String::from_utf8_lossy(&text))
}

/// [`distro_of`] from os-release's text.
pub fn distro_from_os_release(text: &str) -> Option<String> {
    let field = |key: &str| {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
            .next_back()
            .filter(|v| {
                (1..=MAX_DISTRO_FIELD).contains(&v.len())
                    && v.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
            })
    };
    let id = field("ID")?;
    let version = field("VERSION_ID").or_else(|| field("VERSION_CODENAME"))?;
    Some(format!("{id}-{version}"))
}

/// Each package's declared licence from its copyright file in `tree` ([`copyright::declared`]);
/// a file that is missing, too large, not a regular file or not DEP-5 says nothing.
pub fn declare_licences(tree: &ingot_layers::tree::Tree, packages: &mut [DebPackage]) {
    let mut seen: BTreeMap<String, Option<copyright::Declared>> = BTreeMap::new();
    for p in packages {
        let declared = seen.entry(p.name.clone()).or_insert_with(|| {
            tree.read_file_bounded(&copyright::path(&p.name), copyright::MAX_COPYRIGHT_SIZE)
                .ok()
                .flatten()
                .and_then(|bytes| copyright::declared(&bytes))
        });
        p.declared = declared.clone();
    }
}

/// Per layer (stack order, each layer's own status or `None`), the packages its SBOM lists: the
/// base's whole status; above it, what a layer's status adds or changes relative to the status
/// the layers below give (the nearest lower layer that has one hides the others, as the
/// overlay does); nothing for a layer without a status.
pub fn layer_packages(statuses: &[Option<Vec<DebPackage>>]) -> Vec<Vec<DebPackage>> {
    let mut below: &[DebPackage] = &[];
    let mut out = Vec::with_capacity(statuses.len());
    for status in statuses {
        match status {
            Some(this) => {
                out.push(added_or_changed(this, below));
                below = this;
            }
            None => out.push(Vec::new()),
        }
    }
    out
}

/// The packages `this` status adds or changes relative to `below` (the status the layers below
/// give): a package (name, architecture) absent there, or there at another version.
pub fn added_or_changed(this: &[DebPackage], below: &[DebPackage]) -> Vec<DebPackage> {
    let below: BTreeMap<(&str, &str), &str> = below
        .iter()
        .map(|p| ((p.name.as_str(), p.arch.as_str()), p.version.as_str()))
        .collect();
    this.iter()
        .filter(|p| below.get(&(p.name.as_str(), p.arch.as_str())) != Some(&p.version.as_str()))
        .cloned()
        .collect()
}
