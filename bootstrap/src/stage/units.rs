//! Ignition's systemd units: contents, drop-ins, masks, and the links that enable them.

use std::path::Path;

use super::allowed::{check_path, OwnUnits};
use super::tree::Tree;
use super::{EntryKind, StageError};
use crate::model::UnitSpec;

/// Targets that enable a unit, from its `[Install]` section: `(target, "wants"|"requires")`.
fn install_targets(contents: &str) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    let mut in_install = false;
    for line in contents.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_install = l == "[Install]";
            continue;
        }
        if !in_install {
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            continue;
        };
        let kind = match k.trim() {
            "WantedBy" => "wants",
            "RequiredBy" => "requires",
            _ => continue,
        };
        for t in v.split_whitespace() {
            if !t.contains('/') && !t.is_empty() {
                out.push((t.to_string(), kind));
            }
        }
    }
    out
}

const SYSTEM_DIR: &str = "/etc/systemd/system";

/// Stages every unit of the data.
pub(super) fn stage_units(
    tree: &mut Tree,
    units: &[UnitSpec],
    own_units: &OwnUnits,
) -> Result<(), StageError> {
    for u in units {
        stage_unit(tree, u, own_units)?;
    }
    Ok(())
}

fn stage_unit(tree: &mut Tree, u: &UnitSpec, own_units: &OwnUnits) -> Result<(), StageError> {
    let sysdir = Path::new(SYSTEM_DIR);
    let unit_path = sysdir.join(&u.name);
    check_path(
        &unit_path,
        &format!("systemd.units {:?}", u.name),
        own_units,
    )?;
    if let Some(c) = &u.contents {
        if !u.mask {
            tree.data_entry(
                &unit_path,
                EntryKind::File(c.clone().into_bytes()),
                0o644,
                0,
                0,
            )?;
        }
    }
    for d in &u.dropins {
        let p = sysdir.join(format!("{}.d", u.name)).join(&d.name);
        check_path(
            &p,
            &format!("systemd.units {:?} dropins", u.name),
            own_units,
        )?;
        tree.data_entry(
            &p,
            EntryKind::File(d.contents.clone().into_bytes()),
            0o644,
            0,
            0,
        )?;
    }
    if u.mask {
        if u.contents.is_some() {
            tree.warnings.push(format!(
                "unit {}: masked, so its contents are not written",
                u.name
            ));
        }
        return tree.data_entry(
            &unit_path,
            EntryKind::Symlink("/dev/null".into()),
            0o777,
            0,
            0,
        );
    }
    match u.enabled {
        Some(true) => enable(tree, u),
        Some(false) => {
            tree.warnings.push(format!(
                "unit {}: `enabled: false` cannot disable a unit the base OS enables; nothing done",
                u.name
            ));
            Ok(())
        }
        None => Ok(()),
    }
}

/// Links an enabled unit into the targets its `[Install]` section names.
fn enable(tree: &mut Tree, u: &UnitSpec) -> Result<(), StageError> {
    let sysdir = Path::new(SYSTEM_DIR);
    let unit_path = sysdir.join(&u.name);
    let (targets, link_to) = match &u.contents {
        Some(c) => (install_targets(c), unit_path),
        None => {
            tree.warnings.push(format!(
                "unit {}: enabled without contents; linked into multi-user.target.wants from /usr/lib/systemd/system",
                u.name
            ));
            (
                vec![("multi-user.target".to_string(), "wants")],
                Path::new("/usr/lib/systemd/system").join(&u.name),
            )
        }
    };
    if targets.is_empty() {
        tree.warnings.push(format!(
            "unit {}: enabled but has no WantedBy=/RequiredBy=; not linked",
            u.name
        ));
    }
    if u.name.contains("@.") {
        tree.warnings.push(format!(
            "unit {}: a template unit cannot be enabled without an instance; not linked",
            u.name
        ));
        return Ok(());
    }
    for (t, kind) in targets {
        let link = sysdir.join(format!("{t}.{kind}")).join(&u.name);
        tree.put(&link, EntryKind::Symlink(link_to.clone()), 0o777, 0, 0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_sections() {
        let t = install_targets("[Unit]\nWantedBy=no.target\n[Install]\nWantedBy=multi-user.target other.target\nRequiredBy=x.target\n");
        assert_eq!(
            t,
            vec![
                ("multi-user.target".to_string(), "wants"),
                ("other.target".to_string(), "wants"),
                ("x.target".to_string(), "requires")
            ]
        );
    }
}
