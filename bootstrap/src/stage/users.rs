//! The accounts the data asks for: `/etc/passwd` and `/etc/group` when they change, home
//! directories, `authorized_keys` and the sudoers drop-in.

use std::path::PathBuf;

use super::accounts::Accounts;
use super::allowed::check_home;
use super::tree::Tree;
use super::{Entry, EntryKind, StageError, StageInput};

/// Applies the data's users and groups to the base OS's accounts and stages what changes.
/// Returns the accounts, through which the data's owner names map to ids.
pub(super) fn stage_accounts(tree: &mut Tree, input: &StageInput) -> Result<Accounts, StageError> {
    let mut acc = Accounts::parse(&input.base_passwd, &input.base_group)?;
    acc.apply(&input.bootstrap)?;
    tree.warnings.append(&mut acc.warnings);
    if acc.changed() {
        tree.generated("/etc/passwd", acc.passwd_file(), 0o644, 0, 0)?;
        tree.generated("/etc/group", acc.group_file(), 0o644, 0, 0)?;
    }
    let mut sudoers = String::new();
    for r in &acc.resolved {
        let home = PathBuf::from(&r.home);
        if r.create_home || !r.keys.is_empty() {
            check_home(&r.name, r.uid, &r.home)?;
        }
        if r.create_home {
            tree.dir(&home, 0o700, r.uid, r.gid)?;
        }
        if !r.keys.is_empty() {
            let ssh = home.join(".ssh");
            tree.dir(&ssh, 0o700, r.uid, r.gid)?;
            let keys = ssh.join("authorized_keys");
            let mut text = match tree.map.get(&keys) {
                Some(Entry {
                    kind: EntryKind::File(c),
                    ..
                }) => c.clone(),
                _ => Vec::new(),
            };
            for k in &r.keys {
                text.extend_from_slice(k.as_bytes());
                text.push(b'\n');
            }
            tree.generated(&keys.display().to_string(), text, 0o600, r.uid, r.gid)?;
        }
        for rule in &r.sudo {
            sudoers.push_str(&format!("{} {}\n", r.name, rule.trim()));
        }
    }
    if !sudoers.is_empty() {
        tree.generated("/etc/sudoers.d/90-ingot-users", sudoers, 0o440, 0, 0)?;
    }
    Ok(acc)
}
