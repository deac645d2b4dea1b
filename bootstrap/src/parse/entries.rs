//! How many entries bootstrap data asks for, counted before it is loaded.
//!
//! Every file, directory, link, unit, drop-in, user and group becomes staged entries, an inode
//! and a block of the per-node layer, all held in memory by the writer in a RAM-only rescue
//! system: 300,000 one-byte `write_files` took 1.5 GB. [`MAX_ENTRIES`] bounds them. A
//! cloud-config's lists are counted on libyaml's events (`yaml_depth`) and an Ignition config's
//! by walking the JSON without keeping it, so data over the limit is refused before its entries
//! are loaded; the loaded data is counted again (YAML aliases repeat entries the events show once).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::ParseError;
use crate::model::Bootstrap;

/// Most entries (files, directories, links, units, drop-ins, users and groups together) accepted.
/// CABPK's data for a control plane has about 15 (certificates, kubeadm's config, its units); a
/// node with a few dozen accounts and units stays far below. 4096 bounds the writer's memory for
/// them to tens of megabytes.
pub const MAX_ENTRIES: usize = 4096;

/// The top-level cloud-config keys whose list items are entries.
pub(super) const CLOUD_CONFIG_LISTS: &[&str] = &["write_files", "users", "groups"];

/// Refuses `count` entries over the limit.
pub(super) fn check(count: usize) -> Result<(), ParseError> {
    if count > MAX_ENTRIES {
        return Err(ParseError::TooManyEntries {
            count,
            limit: MAX_ENTRIES,
        });
    }
    Ok(())
}

/// The entries of parsed data.
pub(super) fn of(b: &Bootstrap) -> usize {
    b.files.len()
        + b.dirs.len()
        + b.links.len()
        + b.units.iter().map(|u| 1 + u.dropins.len()).sum::<usize>()
        + b.users.len()
        + b.groups.len()
}

/// Where entries are in a JSON document: lists whose items count (and may hold counted lists).
enum Shape {
    Ignore,
    Object(&'static [(&'static str, Shape)]),
    List(&'static Shape),
}

const UNITS: Shape = Shape::List(&Shape::Object(&[("dropins", Shape::List(&Shape::Ignore))]));

/// An Ignition config's lists: `storage`, `systemd`, `passwd` and 2.x's `networkd`.
const IGNITION: Shape = Shape::Object(&[
    (
        "storage",
        Shape::Object(&[
            ("files", Shape::List(&Shape::Ignore)),
            ("directories", Shape::List(&Shape::Ignore)),
            ("links", Shape::List(&Shape::Ignore)),
        ]),
    ),
    ("systemd", Shape::Object(&[("units", UNITS)])),
    ("networkd", Shape::Object(&[("units", UNITS)])),
    (
        "passwd",
        Shape::Object(&[
            ("users", Shape::List(&Shape::Ignore)),
            ("groups", Shape::List(&Shape::Ignore)),
        ]),
    ),
]);

/// The entries of an Ignition config's text, or `None` when it is not valid JSON (the parser
/// reports that). A value of another type than expected counts nothing: the parser refuses it.
pub(super) fn in_ignition(text: &str) -> Option<usize> {
    let mut de = serde_json::Deserializer::from_str(text);
    let n = (&IGNITION).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(n)
}

impl<'de> DeserializeSeed<'de> for &'static Shape {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        match self {
            Shape::Ignore => d.deserialize_ignored_any(IgnoredAny).map(|_| 0),
            _ => d.deserialize_any(self),
        }
    }
}

impl<'de> Visitor<'de> for &'static Shape {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let fields: &[(&str, Shape)] = match self {
            Shape::Object(fields) => fields,
            _ => &[],
        };
        let mut n = 0usize;
        while let Some(key) = map.next_key::<String>()? {
            match fields.iter().find(|(k, _)| *k == key) {
                Some((_, shape)) => n = n.saturating_add(map.next_value_seed(shape)?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(n)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0usize;
        match self {
            Shape::List(item) => {
                while let Some(inner) = seq.next_element_seed(*item)? {
                    n = n.saturating_add(1 + inner);
                }
            }
            _ => while seq.next_element::<IgnoredAny>()?.is_some() {},
        }
        Ok(n)
    }

    fn visit_bool<E>(self, _: bool) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_str<E>(self, _: &str) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<usize, E> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignition_lists_are_counted_without_loading() {
        let text = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/a"},{"path":"/etc/b"}],"directories":[{}],"links":"oops"},"systemd":{"units":[{"name":"a.service","dropins":[{},{}]},{"name":"b.service"}]},"passwd":{"users":[{"name":"u"}],"groups":[]},"other":[[1,2,3]]}"#;
        assert_eq!(in_ignition(text), Some(2 + 1 + 3 + 1 + 1));
        assert_eq!(in_ignition("{\"storage\": "), None);
        assert_eq!(in_ignition("[1, 2]"), Some(0));
    }
}
