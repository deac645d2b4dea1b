//! Users and groups: the base OS's `/etc/passwd` and `/etc/group`, plus what the data adds.
//!
//! New accounts get the next free id from 1000 (100 for `system` users) and the password field
//! `*`: no password, no `/etc/shadow` entry needed (none is staged), key-based SSH only.

use std::collections::BTreeMap;

use super::StageError;
use crate::model::{Bootstrap, UserSpec};

#[derive(Debug, Clone)]
struct Pw {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

#[derive(Debug, Clone)]
struct Gr {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// A user the stage writes files for (authorized_keys, home, sudo).
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub create_home: bool,
    pub keys: Vec<String>,
    pub sudo: Vec<String>,
}

pub(crate) struct Accounts {
    base_passwd: String,
    base_group: String,
    users: Vec<Pw>,
    groups: Vec<Gr>,
    base_users: usize,
    base_groups: usize,
    /// Lines for new accounts, in creation order.
    new_passwd: Vec<String>,
    /// Base groups whose member list grew, by name.
    grown: BTreeMap<String, ()>,
    pub resolved: Vec<Resolved>,
    pub warnings: Vec<String>,
}

fn bad(file: &str, line: usize, reason: impl Into<String>) -> StageError {
    StageError::Accounts {
        file: file.to_string(),
        line,
        reason: reason.into(),
    }
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter().enumerate().all(|(i, &c)| {
            c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || c == b'_'
                || c == b'-'
                || (c == b'$' && i == b.len() - 1)
        })
}

impl Accounts {
    pub(crate) fn parse(passwd: &str, group: &str) -> Result<Self, StageError> {
        let mut users = Vec::new();
        for (i, line) in passwd.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split(':').collect();
            if f.len() != 7 {
                return Err(bad("/etc/passwd", i + 1, "expected 7 `:`-separated fields"));
            }
            let id = |s: &str, what: &str| {
                s.parse::<u32>().map_err(|_| {
                    bad(
                        "/etc/passwd",
                        i + 1,
                        format!("{what} {s:?} is not a number"),
                    )
                })
            };
            users.push(Pw {
                name: f[0].to_string(),
                uid: id(f[2], "uid")?,
                gid: id(f[3], "gid")?,
                home: f[5].to_string(),
            });
        }
        let mut groups = Vec::new();
        for (i, line) in group.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split(':').collect();
            if f.len() != 4 {
                return Err(bad("/etc/group", i + 1, "expected 4 `:`-separated fields"));
            }
            groups.push(Gr {
                name: f[0].to_string(),
                gid: f[2].parse().map_err(|_| {
                    bad(
                        "/etc/group",
                        i + 1,
                        format!("gid {:?} is not a number", f[2]),
                    )
                })?,
                members: f[3]
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect(),
            });
        }
        Ok(Accounts {
            base_passwd: passwd.to_string(),
            base_group: group.to_string(),
            base_users: users.len(),
            base_groups: groups.len(),
            users,
            groups,
            new_passwd: Vec::new(),
            grown: BTreeMap::new(),
            resolved: Vec::new(),
            warnings: Vec::new(),
        })
    }

    pub(crate) fn uid(&self, name: &str) -> Option<u32> {
        self.users.iter().find(|u| u.name == name).map(|u| u.uid)
    }

    pub(crate) fn gid(&self, name: &str) -> Option<u32> {
        self.groups.iter().find(|g| g.name == name).map(|g| g.gid)
    }

    /// Whether anything changed, so `/etc/passwd` and `/etc/group` must be staged.
    pub(crate) fn changed(&self) -> bool {
        self.users.len() > self.base_users
            || self.groups.len() > self.base_groups
            || !self.grown.is_empty()
    }

    fn free_id(taken: impl Fn(u32) -> bool, system: bool) -> Option<u32> {
        let range = if system { 100..1000 } else { 1000..60000 };
        range.into_iter().find(|&id| !taken(id))
    }

    fn ensure_group(
        &mut self,
        name: &str,
        gid: Option<u32>,
        system: bool,
    ) -> Result<u32, StageError> {
        if let Some(g) = self.gid(name) {
            return Ok(g);
        }
        if !valid_name(name) {
            return Err(StageError::User {
                name: name.to_string(),
                reason: "is not a valid group name".to_string(),
            });
        }
        let gid = match gid {
            Some(g) if self.groups.iter().any(|x| x.gid == g) => {
                return Err(StageError::User {
                    name: name.to_string(),
                    reason: format!("gid {g} is already taken in /etc/group"),
                })
            }
            Some(g) => g,
            None => Self::free_id(|id| self.groups.iter().any(|g| g.gid == id), system)
                .ok_or_else(|| StageError::User {
                    name: name.to_string(),
                    reason: "no free gid".to_string(),
                })?,
        };
        self.groups.push(Gr {
            name: name.to_string(),
            gid,
            members: Vec::new(),
        });
        Ok(gid)
    }

    fn add_member(&mut self, group: &str, user: &str) {
        let base = self.base_groups;
        if let Some((i, g)) = self
            .groups
            .iter_mut()
            .enumerate()
            .find(|(_, g)| g.name == group)
        {
            if !g.members.iter().any(|m| m == user) {
                g.members.push(user.to_string());
                if i < base {
                    self.grown.insert(group.to_string(), ());
                }
            }
        }
    }

    /// Applies the data's groups, users and root keys.
    pub(crate) fn apply(&mut self, b: &Bootstrap) -> Result<(), StageError> {
        for g in &b.groups {
            self.ensure_group(&g.name, g.gid, false)?;
            for m in &g.members {
                self.add_member(&g.name, m);
            }
        }
        for u in &b.users {
            self.user(u)?;
        }
        if !b.root_authorized_keys.is_empty() {
            let root = self
                .users
                .iter()
                .find(|u| u.name == "root")
                .cloned()
                .ok_or_else(|| StageError::User {
                    name: "root".to_string(),
                    reason: "is not in the base /etc/passwd".to_string(),
                })?;
            let keys = checked_keys("root", &b.root_authorized_keys)?;
            match self.resolved.iter_mut().find(|r| r.name == "root") {
                Some(r) => r.keys.extend(keys),
                None => self.resolved.push(Resolved {
                    name: root.name,
                    uid: root.uid,
                    gid: root.gid,
                    home: root.home,
                    create_home: false,
                    keys,
                    sudo: Vec::new(),
                }),
            }
        }
        Ok(())
    }

    fn user(&mut self, u: &UserSpec) -> Result<(), StageError> {
        if !valid_name(&u.name) {
            return Err(StageError::User {
                name: u.name.clone(),
                reason: "is not a valid user name ([a-z_][a-z0-9_-]*, at most 32 characters)"
                    .to_string(),
            });
        }
        let keys = checked_keys(&u.name, &u.ssh_authorized_keys)?;
        for rule in &u.sudo {
            if rule.trim().is_empty() || rule.contains(['\n', '\r', '\0']) {
                return Err(StageError::User {
                    name: u.name.clone(),
                    reason: "sudo rule is empty or spans lines".to_string(),
                });
            }
        }
        let existing = self.users.iter().find(|p| p.name == u.name).cloned();
        let (pw, create_home) = match existing {
            Some(p) => {
                if u.uid.is_some_and(|id| id != p.uid)
                    || u.home.as_ref().is_some_and(|h| *h != p.home)
                    || u.shell.is_some()
                    || u.primary_group.is_some()
                    || u.gecos.is_some()
                {
                    self.warnings.push(format!(
                        "user {}: exists in the base OS; only keys, groups and sudo are applied",
                        u.name
                    ));
                }
                (p, false)
            }
            None => (self.new_user(u)?, !u.no_create_home),
        };
        for g in &u.groups {
            self.ensure_group(g, None, false)?;
            self.add_member(g, &u.name);
        }
        self.resolved.push(Resolved {
            name: pw.name,
            uid: pw.uid,
            gid: pw.gid,
            home: pw.home,
            create_home,
            keys,
            sudo: u.sudo.clone(),
        });
        Ok(())
    }

    /// A user the base OS does not have: its primary group, uid and passwd line.
    fn new_user(&mut self, u: &UserSpec) -> Result<Pw, StageError> {
        let gid = self.primary_gid(u)?;
        let uid = self.new_uid(u, gid)?;
        let home = u
            .home
            .clone()
            .unwrap_or_else(|| format!("/home/{}", u.name));
        let shell = u.shell.clone().unwrap_or_else(|| "/bin/sh".to_string());
        let gecos = u.gecos.clone().unwrap_or_default();
        for (what, v) in [("home", &home), ("shell", &shell), ("gecos", &gecos)] {
            if v.contains([':', '\n', '\0']) {
                return Err(StageError::User {
                    name: u.name.clone(),
                    reason: format!("{what} contains `:` or a line break"),
                });
            }
        }
        if !home.starts_with('/') || home.split('/').any(|c| c == "..") {
            return Err(StageError::User {
                name: u.name.clone(),
                reason: format!("home {home:?} is not an absolute path"),
            });
        }
        self.new_passwd
            .push(format!("{}:*:{uid}:{gid}:{gecos}:{home}:{shell}", u.name));
        let pw = Pw {
            name: u.name.clone(),
            uid,
            gid,
            home,
        };
        self.users.push(pw.clone());
        Ok(pw)
    }

    /// The named primary group, or a user-private group with gid = uid when that is free.
    fn primary_gid(&mut self, u: &UserSpec) -> Result<u32, StageError> {
        Ok(match &u.primary_group {
            Some(g) => self.ensure_group(g, None, u.system)?,
            None => match self.gid(&u.name) {
                Some(g) => g,
                None => {
                    let want = u.uid.filter(|id| !self.groups.iter().any(|g| g.gid == *id));
                    self.ensure_group(&u.name, want, u.system)?
                }
            },
        })
    }

    /// The asked uid when free; else the primary gid when free and the group is the user's
    /// own; else the first free id.
    fn new_uid(&self, u: &UserSpec, gid: u32) -> Result<u32, StageError> {
        Ok(match u.uid {
            Some(id) if self.users.iter().any(|p| p.uid == id) => {
                return Err(StageError::User {
                    name: u.name.clone(),
                    reason: format!("uid {id} is already taken in /etc/passwd"),
                })
            }
            Some(id) => id,
            None => {
                let gid_free = !self.users.iter().any(|p| p.uid == gid)
                    && gid >= if u.system { 100 } else { 1000 };
                if gid_free && u.primary_group.is_none() {
                    gid
                } else {
                    Self::free_id(|id| self.users.iter().any(|p| p.uid == id), u.system)
                        .ok_or_else(|| StageError::User {
                            name: u.name.clone(),
                            reason: "no free uid".to_string(),
                        })?
                }
            }
        })
    }

    /// The full `/etc/passwd`: the base file, then the new accounts.
    pub(crate) fn passwd_file(&self) -> String {
        let mut out = with_newline(&self.base_passwd);
        for l in &self.new_passwd {
            out.push_str(l);
            out.push('\n');
        }
        out
    }

    /// The full `/etc/group`: base lines (member lists extended), then the new groups.
    pub(crate) fn group_file(&self) -> String {
        let mut out = String::new();
        for line in self.base_group.lines() {
            let name = line.split(':').next().unwrap_or("");
            match self.groups[..self.base_groups]
                .iter()
                .find(|g| g.name == name)
            {
                Some(g) if self.grown.contains_key(name) => {
                    let f: Vec<&str> = line.split(':').collect();
                    out.push_str(&format!(
                        "{}:{}:{}:{}\n",
                        f[0],
                        f[1],
                        f[2],
                        g.members.join(",")
                    ));
                }
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        for g in &self.groups[self.base_groups..] {
            out.push_str(&format!("{}:x:{}:{}\n", g.name, g.gid, g.members.join(",")));
        }
        out
    }
}

fn with_newline(s: &str) -> String {
    let mut s = s.to_string();
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

fn checked_keys(user: &str, keys: &[String]) -> Result<Vec<String>, StageError> {
    keys.iter()
        .map(|k| k.trim())
        .filter(|k| !k.is_empty())
        .map(|k| {
            if k.contains(['\n', '\r', '\0']) {
                Err(StageError::User {
                    name: user.to_string(),
                    reason: "an ssh_authorized_keys entry spans lines".to_string(),
                })
            } else {
                Ok(k.to_string())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\nadmin:x:1000:1000::/home/admin:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:\nadmin:x:1000:\n";

    #[test]
    fn new_user_gets_next_ids_and_groups() {
        let mut a = Accounts::parse(PASSWD, GROUP).unwrap();
        let u = UserSpec {
            name: "capi".into(),
            groups: vec!["sudo".into(), "docker".into()],
            ..Default::default()
        };
        a.user(&u).unwrap();
        assert_eq!(a.uid("capi"), Some(1001));
        assert_eq!(a.gid("capi"), Some(1001));
        assert_eq!(a.gid("docker"), Some(1002));
        assert!(a
            .passwd_file()
            .ends_with("capi:*:1001:1001::/home/capi:/bin/sh\n"));
        let g = a.group_file();
        assert!(g.contains("sudo:x:27:capi\n"), "{g}");
        assert!(g.contains("docker:x:1002:capi\n"), "{g}");
        assert!(a.changed());
    }

    #[test]
    fn bad_lines_are_named() {
        let e = Accounts::parse("root:x:0:0\n", GROUP).err().unwrap();
        assert!(e.to_string().contains("/etc/passwd line 1"), "{e}");
        let e = Accounts::parse(PASSWD, "root:x:zero:\n").err().unwrap();
        assert!(e.to_string().contains("/etc/group line 1"), "{e}");
    }
}
