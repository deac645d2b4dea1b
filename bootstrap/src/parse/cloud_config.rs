//! `#cloud-config` as CABPK writes it (and the parts of cloud-init's schema around it).
//!
//! The YAML is read into a generic tree and walked by hand, so every key that is not
//! understood lands in `warnings` with its place (`users[0].inactive`) instead of vanishing.

use std::path::PathBuf;

use serde_norway::{Mapping, Value};

use super::{
    base64_decode, check_path, kubeadm_action, numeric_mode, octal_mode, Budget, ParseError,
};
use crate::model::{Bootstrap, FileSpec, Format, GroupSpec, IdOrName, Owner, UserSpec};
use crate::shell::shell_quote;

/// Keys cloud-init knows that ingot deliberately does not apply, with the reason.
const NOT_APPLIED: &[(&str, &str)] = &[
    ("disk_setup", "ingot owns the disk layout"),
    ("fs_setup", "ingot owns the disk layout"),
    ("mounts", "ingot owns the disk layout"),
    ("mount_default_fields", "ingot owns the disk layout"),
    ("swap", "ingot owns the disk layout"),
    ("growpart", "ingot owns the disk layout"),
    ("resize_rootfs", "ingot owns the disk layout"),
    (
        "package_update",
        "the node OS is sealed; packages come from the image",
    ),
    (
        "package_upgrade",
        "the node OS is sealed; packages come from the image",
    ),
    (
        "packages",
        "the node OS is sealed; packages come from the image",
    ),
    ("apt", "the node OS is sealed; packages come from the image"),
    ("ssh_pwauth", "sshd configuration comes from the image"),
    ("disable_root", "sshd configuration comes from the image"),
    ("chpasswd", "passwords are not set; accounts are key-only"),
    ("password", "passwords are not set; accounts are key-only"),
    ("final_message", "there is no cloud-init on the node"),
    ("power_state", "there is no cloud-init on the node"),
];

pub(super) fn parse(text: &str, jinja: bool) -> Result<Bootstrap, ParseError> {
    let root = load(text)?;
    let mut b = Bootstrap::empty(Format::CloudConfig { jinja });
    if text.contains("!!binary") {
        b.warnings.push(
            "`!!binary` YAML tags are read as text; write binary content with `encoding: b64`"
                .to_string(),
        );
    }
    let map = match &root {
        Value::Null => {
            b.warnings.push("cloud-config is empty".to_string());
            return Ok(b);
        }
        Value::Mapping(m) => m,
        _ => {
            return Err(ParseError::Shape {
                at: "cloud-config".to_string(),
                expected: "a mapping of keys at the top level".to_string(),
            })
        }
    };
    let mut budget = Budget::new();
    for (k, v) in map {
        apply_key(&key_name(k), v, jinja, &mut budget, &mut b)?;
    }
    let files = &b.files;
    let shell = b.commands.join("\n");
    b.kubeadm = kubeadm_action(&shell, |p| {
        files
            .iter()
            .rev()
            .find(|f| f.path.as_os_str() == p)
            .map(|f| String::from_utf8_lossy(&f.content).into_owned())
    });
    Ok(b)
}

/// The document as YAML values, refused before loading when too deep or with too many entries.
fn load(text: &str) -> Result<Value, ParseError> {
    // Before serde_norway: loading a deeply nested document costs time quadratic in its depth.
    let scan = super::yaml_scan(text);
    if let Some(at) = scan.too_deep {
        return Err(ParseError::TooDeep {
            line: at.line,
            column: at.column,
            limit: super::MAX_YAML_DEPTH,
        });
    }
    // Before serde_norway too: its events and values cost far more than the text.
    super::entries::check(scan.entries)?;
    serde_norway::from_str(text).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((0, 0));
        ParseError::Yaml {
            line,
            column,
            message: e.to_string(),
        }
    })
}

/// One top-level key: applied to `b`, or a warning saying why it is not.
fn apply_key(
    key: &str,
    v: &Value,
    jinja: bool,
    budget: &mut Budget,
    b: &mut Bootstrap,
) -> Result<(), ParseError> {
    match key {
        "write_files" => write_files(v, jinja, budget, b)?,
        "runcmd" => b.commands = commands("runcmd", v)?,
        "bootcmd" => {
            b.boot_commands = commands("bootcmd", v)?;
            if !b.boot_commands.is_empty() {
                b.warnings.push(
                    "bootcmd: run once on first boot before runcmd (cloud-init runs it on every boot)"
                        .to_string(),
                );
            }
        }
        "users" => users(v, b)?,
        "groups" => groups(v, b)?,
        "ssh_authorized_keys" => {
            b.root_authorized_keys = string_list("ssh_authorized_keys", v)?;
            if !b.root_authorized_keys.is_empty() {
                b.warnings.push(
                    "ssh_authorized_keys: ingot has no distro default user; the keys are installed for root"
                        .to_string(),
                );
            }
        }
        "hostname" => b.hostname = opt_string("hostname", v)?,
        "fqdn" => b.fqdn = opt_string("fqdn", v)?,
        "preserve_hostname" => {
            if as_bool("preserve_hostname", v)? {
                b.warnings.push(
                    "preserve_hostname: ignored; ingot always writes /etc/hostname".to_string(),
                );
            }
        }
        "manage_etc_hosts" => {
            if matches!(v, Value::Bool(false)) {
                b.warnings.push(
                    "manage_etc_hosts: false ignored; ingot always writes /etc/hosts".to_string(),
                );
            }
        }
        "prefer_fqdn_over_hostname" => b.warnings.push(
            "prefer_fqdn_over_hostname: ignored; /etc/hostname gets the short hostname".to_string(),
        ),
        "ntp" => ntp(v, budget, b)?,
        other => match NOT_APPLIED.iter().find(|(k, _)| *k == other) {
            Some((_, why)) => b.warnings.push(format!("{other}: not applied ({why})")),
            None => b
                .warnings
                .push(format!("{other}: key not understood, not applied")),
        },
    }
    Ok(())
}

fn key_name(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".to_string(),
        _ => "<complex key>".to_string(),
    }
}

fn shape(at: &str, expected: &str) -> ParseError {
    ParseError::Shape {
        at: at.to_string(),
        expected: expected.to_string(),
    }
}

/// A scalar as text (YAML numbers and booleans are stringified, as cloud-init's `str()` does).
fn scalar(at: &str, v: &Value) -> Result<String, ParseError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(shape(at, "a string")),
    }
}

fn opt_string(at: &str, v: &Value) -> Result<Option<String>, ParseError> {
    match v {
        Value::Null => Ok(None),
        _ => scalar(at, v).map(Some),
    }
}

/// YAML 1.1 booleans too (`yes`/`no`/`on`/`off`), since cloud-init reads YAML 1.1.
fn as_bool(at: &str, v: &Value) -> Result<bool, ParseError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Null => Ok(false),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "y" => Ok(true),
            "false" | "no" | "off" | "n" => Ok(false),
            _ => Err(shape(at, "true or false")),
        },
        _ => Err(shape(at, "true or false")),
    }
}

/// A list of strings, or a single (comma-separated when `split`) string.
fn string_list_with(at: &str, v: &Value, split: bool) -> Result<Vec<String>, ParseError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Sequence(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| scalar(&format!("{at}[{i}]"), x))
            .collect(),
        Value::String(s) if split => Ok(s
            .split(',')
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect()),
        Value::String(s) => Ok(vec![s.clone()]),
        _ => Err(shape(at, "a list of strings")),
    }
}

fn string_list(at: &str, v: &Value) -> Result<Vec<String>, ParseError> {
    string_list_with(at, v, false)
}

fn commands(at: &str, v: &Value) -> Result<Vec<String>, ParseError> {
    let Value::Sequence(items) = v else {
        return match v {
            Value::Null => Ok(Vec::new()),
            _ => Err(shape(at, "a list of commands")),
        };
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let here = format!("{at}[{i}]");
        match item {
            Value::Null => {}
            Value::Sequence(argv) => {
                let words = argv
                    .iter()
                    .enumerate()
                    .map(|(j, w)| scalar(&format!("{here}[{j}]"), w).map(|w| shell_quote(&w)))
                    .collect::<Result<Vec<_>, _>>()?;
                out.push(words.join(" "));
            }
            _ => out.push(scalar(&here, item)?),
        }
    }
    Ok(out)
}

fn owner(path: &str, raw: &str) -> Result<Owner, ParseError> {
    let (u, g) = match raw.split_once(':') {
        Some((u, g)) => (u.trim(), g.trim()),
        None => (raw.trim(), ""),
    };
    let part = |s: &str| -> Result<Option<IdOrName>, ParseError> {
        if s.is_empty() {
            return Ok(None);
        }
        if s.contains(|c: char| c.is_whitespace() || c == ':' || c == '\0') {
            return Err(ParseError::Shape {
                at: format!("{path}: owner {raw:?}"),
                expected: "`user:group` names without spaces".to_string(),
            });
        }
        Ok(Some(match s.parse::<u32>() {
            Ok(id) => IdOrName::Id(id),
            Err(_) => IdOrName::Name(s.to_string()),
        }))
    };
    Ok(Owner {
        user: part(u)?,
        group: part(g)?,
    })
}

fn write_files(
    v: &Value,
    jinja: bool,
    budget: &mut Budget,
    b: &mut Bootstrap,
) -> Result<(), ParseError> {
    let items = match v {
        Value::Null => return Ok(()),
        Value::Sequence(items) => items,
        _ => return Err(shape("write_files", "a list of files")),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("write_files[{i}]");
        let Value::Mapping(m) = item else {
            return Err(shape(&at, "a mapping with `path` and `content`"));
        };
        let file = write_file(&at, m, jinja, budget, &mut b.warnings)?;
        b.files.push(file);
    }
    Ok(())
}

/// One `write_files` entry: its keys, then its content decoded (counted against `budget`).
fn write_file(
    at: &str,
    m: &serde_norway::Mapping,
    jinja: bool,
    budget: &mut Budget,
    warnings: &mut Vec<String>,
) -> Result<FileSpec, ParseError> {
    let raw_path = match m.get("path") {
        Some(p) => scalar(&format!("{at}.path"), p)?,
        None => return Err(shape(&format!("{at}.path"), "a path (the key is missing)")),
    };
    let path = check_path(at, &raw_path)?;
    let p = path.display().to_string();
    let mut file = FileSpec {
        path,
        content: Vec::new(),
        mode: 0o644,
        owner: Owner::default(),
        append: false,
        jinja: false,
    };
    let mut encoding = "text".to_string();
    let mut content: Option<String> = None;
    for (k, val) in m {
        let key = key_name(k);
        match key.as_str() {
            "path" => {}
            "content" => content = opt_string(&format!("{at}.content ({p})"), val)?,
            "encoding" => {
                encoding = opt_string(&format!("{at}.encoding ({p})"), val)?
                    .unwrap_or_else(|| "text".to_string())
            }
            "permissions" => file.mode = mode(at, &p, val, warnings)?,
            "owner" => {
                if let Some(o) = opt_string(&format!("{at}.owner ({p})"), val)? {
                    file.owner = owner(&p, &o)?;
                }
            }
            "append" => file.append = as_bool(&format!("{at}.append ({p})"), val)?,
            // Deferred writes happen after users exist; owners are resolved against the
            // accounts ingot creates anyway, so the order does not matter here.
            "defer" => {
                as_bool(&format!("{at}.defer ({p})"), val)?;
            }
            "source" => {
                return Err(ParseError::Unsupported {
                    at: format!("{at} ({p})"),
                    what: "`source` (fetching content from a URL)".to_string(),
                })
            }
            other => warnings.push(format!("{at} ({p}): key `{other}` not understood, ignored")),
        }
    }
    let text = content.unwrap_or_default();
    let enc = encoding.trim().to_ascii_lowercase();
    let bad = |reason: String| ParseError::Encoding {
        path: p.clone(),
        encoding: encoding.clone(),
        reason,
    };
    file.content =
        match enc.as_str() {
            "" | "text" | "text/plain" => {
                file.jinja = jinja;
                text.into_bytes()
            }
            "b64" | "base64" => base64_decode(&text).map_err(bad)?,
            "gz" | "gzip" => {
                // Raw gzip bytes cannot survive YAML text unless they are valid UTF-8.
                budget.gunzip(&p, &encoding, text.as_bytes())?
            }
            "gz+b64" | "gz+base64" | "gzip+b64" | "gzip+base64" => {
                let gz = base64_decode(&text).map_err(bad)?;
                budget.gunzip(&p, &encoding, &gz)?
            }
            _ => return Err(bad(
                "unknown encoding (expected b64, base64, gz, gzip, gz+b64, gzip+base64 or text)"
                    .to_string(),
            )),
        };
    budget.take(&p, file.content.len())?;
    Ok(file)
}

/// A `permissions` value: an octal string, or a YAML integer taken as the mode itself (with a
/// warning, as cloud-init does).
fn mode(at: &str, p: &str, val: &Value, warnings: &mut Vec<String>) -> Result<u32, ParseError> {
    Ok(match val {
        Value::Number(n) => {
            let n = n.as_i64().ok_or_else(|| ParseError::Permissions {
                path: p.to_string(),
                value: n.to_string(),
                reason: "not an integer".to_string(),
            })?;
            let mode = numeric_mode(p, n)?;
            // cloud-init takes a YAML integer as the mode itself.
            warnings.push(format!(
            "{at} ({p}): permissions {n} is a YAML integer, taken as mode {mode:#o}; quote it ('0644') to mean octal"
        ));
            mode
        }
        Value::Null => 0o644,
        _ => octal_mode(p, &scalar(&format!("{at}.permissions ({p})"), val)?)?,
    })
}

fn users(v: &Value, b: &mut Bootstrap) -> Result<(), ParseError> {
    let items: Vec<Value> = match v {
        Value::Null => return Ok(()),
        Value::Sequence(items) => items.clone(),
        Value::String(s) => s
            .split(',')
            .map(|n| Value::String(n.trim().to_string()))
            .collect(),
        _ => return Err(shape("users", "a list of users")),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("users[{i}]");
        let m: Mapping = match item {
            Value::String(s) if s == "default" => {
                b.warnings.push(format!(
                    "{at}: `default` user not created (ingot has no distro default user)"
                ));
                continue;
            }
            Value::String(s) => {
                let mut m = Mapping::new();
                m.insert(Value::from("name"), Value::from(s.clone()));
                m
            }
            Value::Mapping(m) => m.clone(),
            _ => return Err(shape(&at, "a user name or a mapping")),
        };
        let name = match m.get("name") {
            Some(n) => scalar(&format!("{at}.name"), n)?,
            None => {
                return Err(shape(
                    &format!("{at}.name"),
                    "a user name (the key is missing)",
                ))
            }
        };
        let mut u = UserSpec {
            name: name.clone(),
            ..UserSpec::default()
        };
        let here = format!("{at} ({name})");
        for (k, val) in &m {
            let key = key_name(k);
            let kat = format!("{here}.{key}");
            match key.as_str() {
                "name" => {}
                "gecos" => u.gecos = opt_string(&kat, val)?,
                "homedir" => u.home = opt_string(&kat, val)?,
                "shell" => u.shell = opt_string(&kat, val)?,
                "primary_group" => u.primary_group = opt_string(&kat, val)?,
                "groups" => u.groups = string_list_with(&kat, val, true)?,
                "sudo" => {
                    u.sudo = match val {
                        Value::Bool(false) | Value::Null => Vec::new(),
                        _ => string_list(&kat, val)?,
                    }
                }
                "ssh_authorized_keys" => u.ssh_authorized_keys = string_list(&kat, val)?,
                "uid" => {
                    u.uid = Some(
                        scalar(&kat, val)?
                            .parse()
                            .map_err(|_| shape(&kat, "a numeric uid"))?,
                    )
                }
                "system" => u.system = as_bool(&kat, val)?,
                "no_create_home" => u.no_create_home = as_bool(&kat, val)?,
                "lock_passwd" => {
                    if !as_bool(&kat, val)? {
                        b.warnings.push(format!(
                            "{kat}: false not applied; ingot accounts have no password (key-only)"
                        ));
                    }
                }
                "passwd" | "hashed_passwd" | "plain_text_passwd" => b.warnings.push(format!(
                    "{kat}: not applied; ingot accounts have no password (key-only)"
                )),
                other => b
                    .warnings
                    .push(format!("{here}: key `{other}` not understood, not applied")),
            }
        }
        b.users.push(u);
    }
    Ok(())
}

fn groups(v: &Value, b: &mut Bootstrap) -> Result<(), ParseError> {
    let mut add = |name: String, members: Vec<String>| {
        b.groups.push(GroupSpec {
            name,
            gid: None,
            members,
        })
    };
    match v {
        Value::Null => {}
        Value::String(s) => {
            for n in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                add(n.to_string(), Vec::new());
            }
        }
        Value::Mapping(m) => {
            for (k, members) in m {
                let name = key_name(k);
                add(
                    name.clone(),
                    string_list(&format!("groups.{name}"), members)?,
                );
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                let at = format!("groups[{i}]");
                match item {
                    Value::Mapping(m) => {
                        for (k, members) in m {
                            let name = key_name(k);
                            add(name.clone(), string_list(&format!("{at}.{name}"), members)?);
                        }
                    }
                    _ => add(scalar(&at, item)?, Vec::new()),
                }
            }
        }
        _ => return Err(shape("groups", "a list of groups")),
    }
    Ok(())
}

/// `ntp:` becomes a systemd-timesyncd drop-in (the image's time client).
fn ntp(v: &Value, budget: &mut Budget, b: &mut Bootstrap) -> Result<(), ParseError> {
    let m = match v {
        Value::Null => return Ok(()),
        Value::Mapping(m) => m,
        _ => return Err(shape("ntp", "a mapping")),
    };
    let mut enabled = true;
    let mut servers = Vec::new();
    for (k, val) in m {
        let key = key_name(k);
        match key.as_str() {
            "enabled" => enabled = as_bool("ntp.enabled", val)?,
            "servers" | "pools" => servers.extend(string_list(&format!("ntp.{key}"), val)?),
            other => b.warnings.push(format!(
                "ntp.{other}: not applied (ingot configures systemd-timesyncd servers only)"
            )),
        }
    }
    if !enabled {
        b.warnings
            .push("ntp.enabled: false; the image's time sync is left as it is".to_string());
        return Ok(());
    }
    if servers.is_empty() {
        return Ok(());
    }
    for s in &servers {
        if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c.is_control()) {
            return Err(shape(
                &format!("ntp.servers ({s:?})"),
                "a host name or address",
            ));
        }
    }
    let content = format!(
        "# Written by ingot from the bootstrap data's `ntp:` servers.\n[Time]\nNTP={}\n",
        servers.join(" ")
    )
    .into_bytes();
    let path = PathBuf::from("/etc/systemd/timesyncd.conf.d/50-ingot-ntp.conf");
    budget.take(&path.display().to_string(), content.len())?;
    b.files.push(FileSpec {
        path,
        content,
        mode: 0o644,
        owner: Owner::default(),
        append: false,
        jinja: false,
    });
    Ok(())
}
