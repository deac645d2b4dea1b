//! The one partition-table reader of the tests: `sfdisk --json`, the real tool's view.

use std::path::Path;
use std::process::Command;

/// One partition as `sfdisk --json` reads it, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub start: u64,
    pub size: u64,
    /// The partition UUID, lowercase.
    pub uuid: String,
    /// The type GUID, lowercase.
    pub type_guid: String,
}

/// The partitions of `image` (a disk image or a device), as `sfdisk --json` reads them.
pub fn read(image: &Path) -> Vec<Part> {
    let out = Command::new(crate::skip::find_tool("sfdisk").unwrap_or_else(|| "sfdisk".into()))
        .arg("--json")
        .arg(image)
        .output()
        .expect("running sfdisk");
    assert!(
        out.status.success(),
        "sfdisk --json {}: {}",
        image.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("sfdisk's JSON");
    let sector = v["partitiontable"]["sectorsize"].as_u64().unwrap_or(512);
    let text =
        |p: &serde_json::Value, key: &str| p[key].as_str().unwrap_or_default().to_lowercase();
    v["partitiontable"]["partitions"]
        .as_array()
        .expect("a partition list")
        .iter()
        .map(|p| Part {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            start: p["start"].as_u64().expect("start") * sector,
            size: p["size"].as_u64().expect("size") * sector,
            uuid: text(p, "uuid"),
            type_guid: text(p, "type"),
        })
        .collect()
}
