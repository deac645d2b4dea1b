//! Ignition JSON as CABPK emits it: spec 2.3.0 through the Container Linux Config transpiler
//! (`storage.files` with `data:` URLs, decimal `mode`, `user.name`/`group.name`,
//! `systemd.units`, `passwd.users`), and spec 3.x (the Butane path: `contents.compression`,
//! `overwrite`, `append` as a list). Everything else is reported in `warnings`, or refused when
//! skipping it would leave the node broken (remote sources, hard links, config merging).

use std::path::PathBuf;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256, Sha512};

use super::{base64_decode, check_path, kubeadm_action, numeric_mode, Budget, ParseError};
use crate::model::{
    Bootstrap, DirSpec, DropIn, FileSpec, Format, GroupSpec, IdOrName, LinkSpec, Owner, UnitSpec,
    UserSpec,
};

pub(super) fn parse(text: &str) -> Result<Bootstrap, ParseError> {
    // Counted without keeping the JSON, so too many entries are refused before they are loaded.
    if let Some(n) = super::entries::in_ignition(text) {
        super::entries::check(n)?;
    }
    let root: Value = serde_json::from_str(text).map_err(|e| ParseError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let Value::Object(root) = root else {
        return Err(shape("Ignition config", "a JSON object"));
    };
    let version = root
        .get("ignition")
        .and_then(|i| i.get("version"))
        .and_then(Value::as_str)
        .ok_or_else(|| shape("ignition.version", "a version string such as \"2.3.0\""))?
        .to_string();
    let major = version.split('.').next().unwrap_or("");
    let v3 = match major {
        "2" => false,
        "3" => true,
        _ => return Err(ParseError::IgnitionVersion { version }),
    };
    let mut b = Bootstrap::empty(Format::Ignition {
        version: version.clone(),
    });
    let mut budget = Budget::new();
    for (key, v) in &root {
        match key.as_str() {
            "ignition" => ignition_section(v, &mut b)?,
            "storage" => storage(v, v3, &mut budget, &mut b)?,
            "passwd" => passwd(v, &mut b)?,
            "systemd" => systemd(v, &mut b)?,
            "networkd" => networkd(v, &mut budget, &mut b)?,
            other => {
                if !is_empty(v) {
                    b.warnings
                        .push(format!("{other}: not applied (not supported by ingot)"));
                }
            }
        }
    }
    // CABPK puts the kubeadm command in /etc/kubeadm.sh and its config in /etc/kubeadm.yml.
    let files = &b.files;
    let lookup = |p: &str| {
        files
            .iter()
            .rev()
            .find(|f| f.path.as_os_str() == p)
            .map(|f| String::from_utf8_lossy(&f.content).into_owned())
    };
    b.kubeadm = files
        .iter()
        .filter(|f| f.content.len() < (1 << 20))
        .filter_map(|f| std::str::from_utf8(&f.content).ok())
        .filter(|t| t.contains("kubeadm"))
        .find_map(|t| kubeadm_action(t, lookup));
    Ok(b)
}

fn shape(at: &str, expected: &str) -> ParseError {
    ParseError::Shape {
        at: at.to_string(),
        expected: expected.to_string(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn object<'a>(at: &str, v: &'a Value) -> Result<Option<&'a Map<String, Value>>, ParseError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(m) => Ok(Some(m)),
        _ => Err(shape(at, "an object")),
    }
}

fn array<'a>(at: &str, v: &'a Value) -> Result<&'a [Value], ParseError> {
    match v {
        Value::Null => Ok(&[]),
        Value::Array(a) => Ok(a),
        _ => Err(shape(at, "an array")),
    }
}

fn string(at: &str, v: &Value) -> Result<Option<String>, ParseError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => Err(shape(at, "a string")),
    }
}

fn boolean(at: &str, v: &Value) -> Result<Option<bool>, ParseError> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(x) => Ok(Some(*x)),
        _ => Err(shape(at, "true or false")),
    }
}

fn uint(at: &str, v: &Value) -> Result<Option<u32>, ParseError> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| shape(at, "a non-negative 32-bit integer")),
        _ => Err(shape(at, "a number")),
    }
}

fn strings(at: &str, v: &Value) -> Result<Vec<String>, ParseError> {
    array(at, v)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            string(&format!("{at}[{i}]"), x)?
                .ok_or_else(|| shape(&format!("{at}[{i}]"), "a string"))
        })
        .collect()
}

fn ignition_section(v: &Value, b: &mut Bootstrap) -> Result<(), ParseError> {
    let Some(m) = object("ignition", v)? else {
        return Ok(());
    };
    for (key, val) in m {
        match key.as_str() {
            "version" => {}
            "config" => {
                if !is_empty(val) {
                    return Err(ParseError::Unsupported {
                        at: "ignition.config".to_string(),
                        what: "merging or replacing the config from another source".to_string(),
                    });
                }
            }
            other => {
                if !is_empty(val) {
                    b.warnings.push(format!(
                        "ignition.{other}: not applied (no fetching at boot)"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn node_owner(at: &str, m: &Map<String, Value>) -> Result<Owner, ParseError> {
    let one = |which: &str| -> Result<Option<IdOrName>, ParseError> {
        let Some(o) = m
            .get(which)
            .map(|v| object(&format!("{at}.{which}"), v))
            .transpose()?
        else {
            return Ok(None);
        };
        let Some(o) = o else { return Ok(None) };
        if let Some(Some(id)) = o
            .get("id")
            .map(|v| uint(&format!("{at}.{which}.id"), v))
            .transpose()?
        {
            return Ok(Some(IdOrName::Id(id)));
        }
        Ok(o.get("name")
            .map(|v| string(&format!("{at}.{which}.name"), v))
            .transpose()?
            .flatten()
            .filter(|n| !n.is_empty())
            .map(IdOrName::Name))
    };
    Ok(Owner {
        user: one("user")?,
        group: one("group")?,
    })
}

fn mode(at: &str, path: &str, m: &Map<String, Value>, default: u32) -> Result<u32, ParseError> {
    match m.get("mode") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) => numeric_mode(path, n),
            None => Err(ParseError::Permissions {
                path: path.to_string(),
                value: n.to_string(),
                reason: "not an integer".to_string(),
            }),
        },
        Some(_) => Err(shape(&format!("{at}.mode"), "a decimal number")),
    }
}

/// Decodes one Ignition resource (`contents` or an `append` entry) to bytes.
fn resource(
    at: &str,
    path: &str,
    r: &Map<String, Value>,
    budget: &mut Budget,
    b: &mut Bootstrap,
) -> Result<Vec<u8>, ParseError> {
    let mut source = None;
    let mut compression = None;
    let mut hash = None;
    for (key, val) in r {
        match key.as_str() {
            "source" => source = string(&format!("{at}.source"), val)?,
            "compression" => compression = string(&format!("{at}.compression"), val)?,
            "verification" => {
                if let Some(v) = object(&format!("{at}.verification"), val)? {
                    hash = v
                        .get("hash")
                        .map(|h| string(&format!("{at}.verification.hash"), h))
                        .transpose()?
                        .flatten();
                }
            }
            "httpHeaders" => {
                if !is_empty(val) {
                    b.warnings
                        .push(format!("{at}.httpHeaders ({path}): ignored (no fetching)"));
                }
            }
            other => b
                .warnings
                .push(format!("{at}.{other} ({path}): not understood, ignored")),
        }
    }
    let Some(source) = source else {
        return Ok(Vec::new());
    };
    let Some(rest) = source.strip_prefix("data:") else {
        let scheme = source.split(':').next().unwrap_or("").to_string();
        return Err(ParseError::Unsupported {
            at: format!("{at}.source ({path})"),
            what: format!("a `{scheme}:` source (only data: URLs can be read offline)"),
        });
    };
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(ParseError::Encoding {
            path: path.to_string(),
            encoding: "data URL".to_string(),
            reason: "no `,` separating the media type from the data".to_string(),
        });
    };
    let is_b64 = meta.ends_with(";base64");
    let encoding = if is_b64 {
        "data URL (base64)"
    } else {
        "data URL"
    };
    let unescaped: Vec<u8> = percent_encoding::percent_decode_str(data).collect();
    let raw = if is_b64 {
        let text = String::from_utf8(unescaped).map_err(|_| ParseError::Encoding {
            path: path.to_string(),
            encoding: encoding.to_string(),
            reason: "base64 text is not ASCII".to_string(),
        })?;
        base64_decode(&text).map_err(|reason| ParseError::Encoding {
            path: path.to_string(),
            encoding: encoding.to_string(),
            reason,
        })?
    } else {
        unescaped
    };
    let content = match compression.as_deref() {
        None | Some("") => raw.clone(),
        Some("gzip") => budget.gunzip(path, "gzip", &raw)?,
        Some(other) => {
            return Err(ParseError::Encoding {
                path: path.to_string(),
                encoding: other.to_string(),
                reason: "unknown compression (only gzip is)".to_string(),
            })
        }
    };
    if let Some(h) = hash {
        // The spec hashes the decompressed file; accept the raw bytes' hash as well.
        if !hash_matches(&h, &content) && !hash_matches(&h, &raw) {
            return Err(ParseError::Hash {
                path: path.to_string(),
                hash: h,
            });
        }
    }
    budget.take(path, content.len())?;
    Ok(content)
}

fn hash_matches(hash: &str, data: &[u8]) -> bool {
    match hash.split_once('-') {
        Some(("sha512", hex)) => hex::encode(Sha512::digest(data)).eq_ignore_ascii_case(hex),
        Some(("sha256", hex)) => hex::encode(Sha256::digest(data)).eq_ignore_ascii_case(hex),
        _ => false,
    }
}

fn storage(v: &Value, v3: bool, budget: &mut Budget, b: &mut Bootstrap) -> Result<(), ParseError> {
    let Some(m) = object("storage", v)? else {
        return Ok(());
    };
    for (key, val) in m {
        match key.as_str() {
            "files" => {
                for (i, f) in array("storage.files", val)?.iter().enumerate() {
                    file(&format!("storage.files[{i}]"), f, v3, budget, b)?;
                }
            }
            "directories" => {
                for (i, d) in array("storage.directories", val)?.iter().enumerate() {
                    let at = format!("storage.directories[{i}]");
                    let d = object(&at, d)?.ok_or_else(|| shape(&at, "an object"))?;
                    let (path, p) = node_path(&at, d)?;
                    check_node_keys(&at, &p, d, &["mode", "overwrite"], b)?;
                    b.dirs.push(DirSpec {
                        mode: mode(&at, &p, d, 0o755)?,
                        owner: node_owner(&at, d)?,
                        path,
                    });
                }
            }
            "links" => {
                for (i, l) in array("storage.links", val)?.iter().enumerate() {
                    let at = format!("storage.links[{i}]");
                    let l = object(&at, l)?.ok_or_else(|| shape(&at, "an object"))?;
                    let (path, p) = node_path(&at, l)?;
                    check_node_keys(&at, &p, l, &["target", "hard", "overwrite"], b)?;
                    if boolean(&format!("{at}.hard"), l.get("hard").unwrap_or(&Value::Null))?
                        == Some(true)
                    {
                        return Err(ParseError::Unsupported {
                            at: format!("{at} ({p})"),
                            what: "a hard link".to_string(),
                        });
                    }
                    let target = string(
                        &format!("{at}.target"),
                        l.get("target").unwrap_or(&Value::Null),
                    )?
                    .filter(|t| !t.is_empty() && !t.contains('\0'))
                    .ok_or_else(|| shape(&format!("{at}.target ({p})"), "a link target"))?;
                    b.links.push(LinkSpec {
                        owner: node_owner(&at, l)?,
                        path,
                        target: PathBuf::from(target),
                    });
                }
            }
            other => {
                if !is_empty(val) {
                    b.warnings.push(format!(
                        "storage.{other}: not applied (ingot owns the disk layout)"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn node_path(at: &str, m: &Map<String, Value>) -> Result<(PathBuf, String), ParseError> {
    let raw = string(&format!("{at}.path"), m.get("path").unwrap_or(&Value::Null))?
        .ok_or_else(|| shape(&format!("{at}.path"), "a path (the key is missing)"))?;
    let path = check_path(at, &raw)?;
    let p = path.display().to_string();
    Ok((path, p))
}

/// Warns about keys of a file/directory/link that are neither common nor in `extra`.
fn check_node_keys(
    at: &str,
    p: &str,
    m: &Map<String, Value>,
    extra: &[&str],
    b: &mut Bootstrap,
) -> Result<(), ParseError> {
    for (key, val) in m {
        match key.as_str() {
            "path" | "user" | "group" => {}
            "filesystem" => {
                let fs = string(&format!("{at}.filesystem"), val)?;
                if fs.as_deref().is_some_and(|f| f != "root") {
                    return Err(ParseError::Unsupported {
                        at: format!("{at} ({p})"),
                        what: format!("filesystem {fs:?} (only \"root\")"),
                    });
                }
            }
            k if extra.contains(&k) => {}
            other => b
                .warnings
                .push(format!("{at} ({p}): key `{other}` not understood, ignored")),
        }
    }
    Ok(())
}

fn file(
    at: &str,
    v: &Value,
    v3: bool,
    budget: &mut Budget,
    b: &mut Bootstrap,
) -> Result<(), ParseError> {
    let f = object(at, v)?.ok_or_else(|| shape(at, "an object"))?;
    let (path, p) = node_path(at, f)?;
    check_node_keys(at, &p, f, &["contents", "mode", "append", "overwrite"], b)?;
    let mode = mode(at, &p, f, 0o644)?;
    let owner = node_owner(at, f)?;
    let contents = match f.get("contents") {
        Some(c) => match object(&format!("{at}.contents"), c)? {
            Some(c) => Some(resource(&format!("{at}.contents"), &p, c, budget, b)?),
            None => None,
        },
        None => None,
    };
    let spec = |content: Vec<u8>, append: bool| FileSpec {
        path: path.clone(),
        content,
        mode,
        owner: owner.clone(),
        append,
        jinja: false,
    };
    match (v3, f.get("append")) {
        // 3.x: `append` is a list of resources added after `contents`.
        (true, Some(list)) if !list.is_null() && !list.is_boolean() => {
            let list = array(&format!("{at}.append"), list)?;
            if let Some(c) = contents {
                b.files.push(spec(c, false));
            }
            for (j, r) in list.iter().enumerate() {
                let rat = format!("{at}.append[{j}]");
                let r = object(&rat, r)?.ok_or_else(|| shape(&rat, "an object"))?;
                let data = resource(&rat, &p, r, budget, b)?;
                b.files.push(spec(data, true));
            }
        }
        (_, Some(flag)) if flag.is_boolean() || flag.is_null() => {
            let append = boolean(&format!("{at}.append"), flag)?.unwrap_or(false);
            b.files.push(spec(contents.unwrap_or_default(), append));
        }
        (_, Some(_)) => return Err(shape(&format!("{at}.append"), "true or false")),
        (_, None) => b.files.push(spec(contents.unwrap_or_default(), false)),
    }
    Ok(())
}

fn passwd(v: &Value, b: &mut Bootstrap) -> Result<(), ParseError> {
    let Some(m) = object("passwd", v)? else {
        return Ok(());
    };
    for (key, val) in m {
        match key.as_str() {
            "users" => {
                for (i, u) in array("passwd.users", val)?.iter().enumerate() {
                    user(&format!("passwd.users[{i}]"), u, b)?;
                }
            }
            "groups" => {
                for (i, g) in array("passwd.groups", val)?.iter().enumerate() {
                    let at = format!("passwd.groups[{i}]");
                    let g = object(&at, g)?.ok_or_else(|| shape(&at, "an object"))?;
                    let name =
                        string(&format!("{at}.name"), g.get("name").unwrap_or(&Value::Null))?
                            .ok_or_else(|| shape(&format!("{at}.name"), "a group name"))?;
                    let mut spec = GroupSpec {
                        name: name.clone(),
                        ..GroupSpec::default()
                    };
                    for (k, x) in g {
                        match k.as_str() {
                            "name" => {}
                            "gid" => spec.gid = uint(&format!("{at}.gid"), x)?,
                            "system" => {}
                            other => b
                                .warnings
                                .push(format!("{at} ({name}): key `{other}` not applied")),
                        }
                    }
                    b.groups.push(spec);
                }
            }
            other => {
                if !is_empty(val) {
                    b.warnings
                        .push(format!("passwd.{other}: not understood, not applied"));
                }
            }
        }
    }
    Ok(())
}

fn user(at: &str, v: &Value, b: &mut Bootstrap) -> Result<(), ParseError> {
    let m = object(at, v)?.ok_or_else(|| shape(at, "an object"))?;
    let name = string(&format!("{at}.name"), m.get("name").unwrap_or(&Value::Null))?
        .ok_or_else(|| shape(&format!("{at}.name"), "a user name"))?;
    let here = format!("{at} ({name})");
    let mut u = UserSpec {
        name: name.clone(),
        ..UserSpec::default()
    };
    for (key, val) in m {
        let kat = format!("{here}.{key}");
        match key.as_str() {
            "name" => {}
            "sshAuthorizedKeys" => u.ssh_authorized_keys = strings(&kat, val)?,
            "uid" => u.uid = uint(&kat, val)?,
            "gecos" => u.gecos = string(&kat, val)?,
            "homeDir" => u.home = string(&kat, val)?,
            "shell" => u.shell = string(&kat, val)?,
            "primaryGroup" => u.primary_group = string(&kat, val)?,
            "groups" => u.groups = strings(&kat, val)?,
            "system" => u.system = boolean(&kat, val)?.unwrap_or(false),
            "noCreateHome" => u.no_create_home = boolean(&kat, val)?.unwrap_or(false),
            "passwordHash" => {
                if !val.is_null() {
                    b.warnings.push(format!(
                        "{kat}: not applied; ingot accounts have no password (key-only)"
                    ));
                }
            }
            other => {
                if !is_empty(val) && val != &Value::Bool(false) {
                    b.warnings
                        .push(format!("{here}: key `{other}` not understood, not applied"));
                }
            }
        }
    }
    b.users.push(u);
    Ok(())
}

fn unit_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\0', '\n'])
}

fn systemd(v: &Value, b: &mut Bootstrap) -> Result<(), ParseError> {
    let Some(m) = object("systemd", v)? else {
        return Ok(());
    };
    for (key, val) in m {
        if key != "units" {
            if !is_empty(val) {
                b.warnings
                    .push(format!("systemd.{key}: not understood, not applied"));
            }
            continue;
        }
        for (i, u) in array("systemd.units", val)?.iter().enumerate() {
            let at = format!("systemd.units[{i}]");
            let u = object(&at, u)?.ok_or_else(|| shape(&at, "an object"))?;
            let name = string(&format!("{at}.name"), u.get("name").unwrap_or(&Value::Null))?
                .filter(|n| unit_name_ok(n))
                .ok_or_else(|| shape(&format!("{at}.name"), "a unit file name"))?;
            let here = format!("{at} ({name})");
            let mut spec = UnitSpec {
                name: name.clone(),
                enabled: None,
                mask: false,
                contents: None,
                dropins: Vec::new(),
            };
            for (k, x) in u {
                let kat = format!("{here}.{k}");
                match k.as_str() {
                    "name" => {}
                    // `enable` is 2.x's deprecated spelling.
                    "enabled" | "enable" => {
                        if let Some(e) = boolean(&kat, x)? {
                            spec.enabled = Some(e);
                        }
                    }
                    "mask" => spec.mask = boolean(&kat, x)?.unwrap_or(false),
                    "contents" => spec.contents = string(&kat, x)?,
                    "dropins" => spec.dropins = dropins(&kat, x)?,
                    other => b
                        .warnings
                        .push(format!("{here}: key `{other}` not understood, not applied")),
                }
            }
            b.units.push(spec);
        }
    }
    Ok(())
}

fn dropins(at: &str, v: &Value) -> Result<Vec<DropIn>, ParseError> {
    let mut out = Vec::new();
    for (j, d) in array(at, v)?.iter().enumerate() {
        let dat = format!("{at}[{j}]");
        let d = object(&dat, d)?.ok_or_else(|| shape(&dat, "an object"))?;
        let name = string(
            &format!("{dat}.name"),
            d.get("name").unwrap_or(&Value::Null),
        )?
        .filter(|n| unit_name_ok(n))
        .ok_or_else(|| shape(&format!("{dat}.name"), "a drop-in file name"))?;
        let contents = string(
            &format!("{dat}.contents"),
            d.get("contents").unwrap_or(&Value::Null),
        )?
        .unwrap_or_default();
        out.push(DropIn { name, contents });
    }
    Ok(out)
}

/// Ignition 2.x `networkd.units`: written straight to /etc/systemd/network.
fn networkd(v: &Value, budget: &mut Budget, b: &mut Bootstrap) -> Result<(), ParseError> {
    let Some(m) = object("networkd", v)? else {
        return Ok(());
    };
    for (key, val) in m {
        if key != "units" {
            if !is_empty(val) {
                b.warnings
                    .push(format!("networkd.{key}: not understood, not applied"));
            }
            continue;
        }
        for (i, u) in array("networkd.units", val)?.iter().enumerate() {
            let at = format!("networkd.units[{i}]");
            let u = object(&at, u)?.ok_or_else(|| shape(&at, "an object"))?;
            let name = string(&format!("{at}.name"), u.get("name").unwrap_or(&Value::Null))?
                .filter(|n| unit_name_ok(n))
                .ok_or_else(|| shape(&format!("{at}.name"), "a networkd file name"))?;
            let mut push = |path: String, contents: String| -> Result<(), ParseError> {
                budget.take(&path, contents.len())?;
                b.files.push(FileSpec {
                    path: PathBuf::from(path),
                    content: contents.into_bytes(),
                    mode: 0o644,
                    owner: Owner::default(),
                    append: false,
                    jinja: false,
                });
                Ok(())
            };
            if let Some(c) = string(
                &format!("{at}.contents"),
                u.get("contents").unwrap_or(&Value::Null),
            )? {
                push(format!("/etc/systemd/network/{name}"), c)?;
            }
            if let Some(d) = u.get("dropins") {
                for di in dropins(&format!("{at}.dropins"), d)? {
                    push(
                        format!("/etc/systemd/network/{name}.d/{}", di.name),
                        di.contents,
                    )?;
                }
            }
        }
    }
    Ok(())
}
