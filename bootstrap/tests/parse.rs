//! Parsing CABPK's real output shapes: formats, roles, byte-exact files, warnings.

mod common;

use std::io::Read;
use std::path::Path;

use base64::Engine;
use common::*;
use ingot_bootstrap::{parse, Format, IdOrName, KubeadmAction, Role};

fn b64(s: &str) -> Vec<u8> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn roles_of_every_fixture() {
    let want = [
        (
            "cloud-config-controlplane-init.yaml",
            Some(KubeadmAction::Init),
            Role::ControlPlane,
        ),
        (
            "cloud-config-controlplane-join.yaml",
            Some(KubeadmAction::Join {
                control_plane: true,
            }),
            Role::ControlPlane,
        ),
        (
            "cloud-config-worker-join.yaml",
            Some(KubeadmAction::Join {
                control_plane: false,
            }),
            Role::Worker,
        ),
        (
            "ignition-v2-controlplane-init.json",
            Some(KubeadmAction::Init),
            Role::ControlPlane,
        ),
        (
            "ignition-v2-worker-join.json",
            Some(KubeadmAction::Join {
                control_plane: false,
            }),
            Role::Worker,
        ),
        (
            "ignition-v3-controlplane-join.json",
            Some(KubeadmAction::Join {
                control_plane: true,
            }),
            Role::ControlPlane,
        ),
    ];
    for (name, action, role) in want {
        let b = parse(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(b.kubeadm, action, "{name}");
        assert_eq!(b.role(), role, "{name}");
        match &b.format {
            Format::CloudConfig { jinja } => {
                assert!(name.starts_with("cloud-config") && *jinja, "{name}")
            }
            Format::Ignition { version } => {
                assert!(name.starts_with("ignition"), "{name}");
                assert_eq!(&version[..1], if name.contains("-v2-") { "2" } else { "3" });
            }
        }
    }
}

#[test]
fn join_flag_makes_a_control_plane() {
    let text = fixture_text("cloud-config-worker-join.yaml").replace(
        "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml ",
        "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml --control-plane",
    );
    let b = parse(text.as_bytes()).unwrap();
    assert_eq!(b.role(), Role::ControlPlane);
}

#[test]
fn cloud_config_files_decode_byte_exact() {
    let text = fixture_text("cloud-config-controlplane-init.yaml");
    let b = parse(text.as_bytes()).unwrap();
    // Independent reading of the same YAML for the expected bytes.
    let doc: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let items = doc["write_files"].as_sequence().unwrap();
    assert_eq!(
        items.len(),
        b.files.len() - 1,
        "every write_files entry plus the ntp drop-in"
    );
    for item in items {
        let path = item["path"].as_str().unwrap();
        let content = item["content"].as_str().unwrap();
        let want = match item.get("encoding").and_then(|e| e.as_str()) {
            None => content.as_bytes().to_vec(),
            Some("base64") => b64(content),
            Some("gzip+base64") => gunzip(&b64(content)),
            Some(other) => panic!("fixture encoding {other}"),
        };
        let got = b.files.iter().find(|f| f.path == Path::new(path)).unwrap();
        assert_eq!(got.content, want, "{path}");
        let perms = item["permissions"].as_str().unwrap();
        assert_eq!(got.mode, u32::from_str_radix(perms, 8).unwrap(), "{path}");
        assert_eq!(
            got.owner.user,
            Some(IdOrName::Name("root".into())),
            "{path}"
        );
        assert_eq!(
            got.owner.group,
            Some(IdOrName::Name("root".into())),
            "{path}"
        );
    }
    // And against the plain forms kept beside the fixtures.
    for (path, plain) in [
        ("/etc/kubernetes/pki/ca.crt", "plain/ca.crt"),
        ("/etc/kubernetes/pki/ca.key", "plain/ca.key"),
        (
            "/etc/sysctl.d/99-kubernetes.conf",
            "plain/99-kubernetes.conf",
        ),
        ("/etc/containerd/config.toml", "plain/config.toml"),
    ] {
        let f = b.files.iter().find(|f| f.path == Path::new(path)).unwrap();
        assert_eq!(f.content, fixture(plain), "{path}");
    }
    let ntp = b.files.last().unwrap();
    assert_eq!(
        ntp.path,
        Path::new("/etc/systemd/timesyncd.conf.d/50-ingot-ntp.conf")
    );
    assert!(
        String::from_utf8_lossy(&ntp.content).contains("NTP=ntp1.hetzner.de ntp2.hetzner.com\n")
    );
}

#[test]
fn cloud_config_commands_users_and_warnings() {
    let text = fixture_text("cloud-config-controlplane-init.yaml");
    let b = parse(text.as_bytes()).unwrap();
    let doc: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let runcmd: Vec<String> = doc["runcmd"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(b.commands, runcmd);
    assert_eq!(b.users.len(), 1);
    let u = &b.users[0];
    assert_eq!(u.name, "capi");
    assert_eq!(u.groups, vec!["sudo", "docker"]);
    assert_eq!(u.sudo, vec!["ALL=(ALL) NOPASSWD:ALL"]);
    assert_eq!(u.ssh_authorized_keys.len(), 1);
    assert!(b.warnings.is_empty(), "{:?}", b.warnings);

    let worker = parse(&fixture("cloud-config-worker-join.yaml")).unwrap();
    for key in ["disk_setup", "fs_setup", "mounts", "bootcmd"] {
        assert!(
            worker.warnings.iter().any(|w| w.starts_with(key)),
            "{key} not reported: {:?}",
            worker.warnings
        );
    }
    assert_eq!(
        worker.boot_commands,
        vec!["echo bootcmd ran > /var/log/bootcmd.log"]
    );
}

#[test]
fn unknown_keys_are_reported_by_name() {
    let text = "#cloud-config\nfoo_bar: 1\nwrite_files:\n- path: /etc/a\n  content: x\n  bogus: 1\nusers:\n- name: bob\n  inactive: true\n  passwd: $6$hash\nsnap: {}\n";
    let b = parse(text.as_bytes()).unwrap();
    let all = b.warnings.join("\n");
    for needle in [
        "foo_bar",
        "write_files[0] (/etc/a): key `bogus`",
        "users[0] (bob): key `inactive`",
        "passwd",
        "snap",
    ] {
        assert!(all.contains(needle), "{needle} missing in:\n{all}");
    }
}

#[test]
fn permissions_quoted_and_unquoted() {
    let b = parse(b"#cloud-config\nwrite_files:\n- path: /a\n  permissions: 0640\n- path: /b\n  permissions: '0600'\n- path: /c\n  permissions: \"755\"\n- path: /d\n").unwrap();
    let modes: Vec<u32> = b.files.iter().map(|f| f.mode).collect();
    assert_eq!(modes, vec![0o640, 0o600, 0o755, 0o644]);
    // A YAML integer is cloud-init's mode as given, and reported.
    let b = parse(b"#cloud-config\nwrite_files:\n- path: /a\n  permissions: 420\n").unwrap();
    assert_eq!(b.files[0].mode, 0o644);
    assert!(b.warnings[0].contains("YAML integer"), "{:?}", b.warnings);
}

#[test]
fn every_cloud_init_encoding() {
    let plain = "hello\nworld\n";
    let b64s = base64::engine::general_purpose::STANDARD.encode(plain);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, plain.as_bytes()).unwrap();
    let gzb64 = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
    let mut text = String::from("#cloud-config\nwrite_files:\n");
    for (i, (enc, c)) in [
        ("b64", &b64s),
        ("base64", &b64s),
        ("gz+b64", &gzb64),
        ("gzip+base64", &gzb64),
        ("text/plain", &plain.replace('\n', "\\n")),
    ]
    .iter()
    .enumerate()
    {
        text.push_str(&format!(
            "- path: /f{i}\n  encoding: {enc}\n  content: \"{c}\"\n"
        ));
    }
    let b = parse(text.as_bytes()).unwrap();
    assert_eq!(b.files.len(), 5);
    for f in &b.files {
        assert_eq!(f.content, plain.as_bytes(), "{}", f.path.display());
    }
}

#[test]
fn ignition_files_decode_byte_exact() {
    for name in IGNITIONS {
        let text = fixture_text(name);
        let b = parse(text.as_bytes()).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let files = doc["storage"]["files"].as_array().unwrap();
        assert_eq!(files.len(), b.files.len(), "{name}");
        for (f, got) in files.iter().zip(&b.files) {
            let path = f["path"].as_str().unwrap();
            assert_eq!(got.path, Path::new(path));
            let source = f["contents"]["source"].as_str().unwrap();
            let (meta, data) = source
                .strip_prefix("data:")
                .unwrap()
                .split_once(',')
                .unwrap();
            let raw: Vec<u8> = if meta.ends_with(";base64") {
                b64(data)
            } else {
                percent_encoding::percent_decode_str(data).collect()
            };
            let want = match f["contents"]["compression"].as_str() {
                Some("gzip") => gunzip(&raw),
                _ => raw,
            };
            assert_eq!(got.content, want, "{name} {path}");
            assert_eq!(
                u64::from(got.mode),
                f["mode"].as_u64().unwrap(),
                "{name} {path}"
            );
            let user = f["user"]["name"]
                .as_str()
                .map(|n| IdOrName::Name(n.to_string()));
            assert_eq!(got.owner.user, user, "{name} {path}");
        }
        assert_eq!(b.units.len(), 2, "{name}");
        assert_eq!(b.units[0].name, "kubeadm.service");
        assert_eq!(b.units[0].enabled, Some(true));
        assert!(b.units[1].contents.is_none());
        assert_eq!(b.users[0].name, "capi");
        assert_eq!(b.users[0].ssh_authorized_keys.len(), 1);
        assert!(b.warnings.is_empty(), "{name}: {:?}", b.warnings);
    }
}

#[test]
fn ignition_reports_what_it_does_not_apply() {
    let text = r#"{"ignition":{"version":"3.4.0"},"storage":{"disks":[{"device":"/dev/sda"}],"filesystems":[{"device":"/dev/sda1","format":"ext4"}]},"kernelArguments":{"shouldExist":["quiet"]},"passwd":{"users":[{"name":"core","passwordHash":"$6$x","noLogInit":true}]}}"#;
    let b = parse(text.as_bytes()).unwrap();
    let all = b.warnings.join("\n");
    for needle in [
        "storage.disks",
        "storage.filesystems",
        "kernelArguments",
        "passwordHash",
        "noLogInit",
    ] {
        assert!(all.contains(needle), "{needle} missing in:\n{all}");
    }
}

#[test]
fn ignition_v3_append_and_dirs_and_links() {
    let text = r#"{"ignition":{"version":"3.3.0"},"storage":{
        "directories":[{"path":"/etc/foo","mode":448}],
        "files":[{"path":"/etc/foo/a","contents":{"source":"data:,one%0A"},"append":[{"source":"data:;base64,dHdvCg=="}]}],
        "links":[{"path":"/etc/foo/l","target":"a"}]}}"#;
    let b = parse(text.as_bytes()).unwrap();
    assert_eq!(b.dirs[0].mode, 0o700);
    assert_eq!(b.files.len(), 2);
    assert_eq!(b.files[0].content, b"one\n");
    assert!(b.files[1].append);
    assert_eq!(b.files[1].content, b"two\n");
    assert_eq!(b.links[0].target, Path::new("a"));
}

/// Issue 32, item 5: the number of entries had no limit: 300,000 one-byte write_files took
/// 1.5 GB to stage and seal. More than `MAX_ENTRIES` files, directories, links, units, drop-ins,
/// users and groups are refused, naming the count and the limit; the limit itself is accepted.
#[test]
fn too_many_entries_are_refused_naming_count_and_limit() {
    use ingot_bootstrap::{ParseError, MAX_ENTRIES};
    let cloud = |n: usize| {
        let mut t = String::from("#cloud-config\nwrite_files:\n");
        for i in 0..n {
            t.push_str(&format!("- path: /etc/x/{i}\n  content: x\n"));
        }
        t
    };
    let too_many = |r: Result<_, ParseError>, count: usize| match r {
        Err(ParseError::TooManyEntries { count: c, limit }) => {
            assert_eq!((c, limit), (count, MAX_ENTRIES));
        }
        other => panic!("want TooManyEntries {count}, got {other:?}"),
    };
    assert_eq!(
        parse(cloud(MAX_ENTRIES).as_bytes()).unwrap().files.len(),
        MAX_ENTRIES
    );
    let r = parse(cloud(MAX_ENTRIES + 1).as_bytes());
    let msg = match &r {
        Err(e) => e.to_string(),
        Ok(b) => panic!("{} files accepted", b.files.len()),
    };
    assert!(
        msg.contains(&format!("{} entries", MAX_ENTRIES + 1))
            && msg.contains(&format!("more than the {MAX_ENTRIES} accepted")),
        "{msg}"
    );
    too_many(r, MAX_ENTRIES + 1);
    // Counted before the YAML is loaded: a syntax error after the entries is never reached.
    too_many(
        parse(format!("{}runcmd: [\n", cloud(MAX_ENTRIES + 1)).as_bytes()),
        MAX_ENTRIES + 1,
    );
    // Users and groups count too, in both formats.
    let mut users = String::from("#cloud-config\nusers:\n");
    for i in 0..MAX_ENTRIES {
        users.push_str(&format!("- name: u{i}\n"));
    }
    too_many(
        parse(format!("{users}groups: [g]\n").as_bytes()),
        MAX_ENTRIES + 1,
    );
    // A list the events show under another key, loaded as write_files through an alias, counts
    // as loaded.
    let mut aliased = String::from("#cloud-config\nx: &all\n");
    for i in 0..MAX_ENTRIES + 1 {
        aliased.push_str(&format!("- {{path: /etc/x/{i}, content: x}}\n"));
    }
    aliased.push_str("write_files: *all\n");
    too_many(parse(aliased.as_bytes()), MAX_ENTRIES + 1);
    // Ignition: files, directories, links, units and their drop-ins.
    let files: Vec<String> = (0..MAX_ENTRIES - 3)
        .map(|i| format!(r#"{{"path":"/etc/x/{i}","contents":{{"source":"data:,x"}}}}"#))
        .collect();
    let ign = |dropins: usize| {
        let d: Vec<String> = (0..dropins)
            .map(|i| format!(r#"{{"name":"{i}.conf","contents":"[Unit]\n"}}"#))
            .collect();
        format!(
            r#"{{"ignition":{{"version":"3.4.0"}},"storage":{{"files":[{}],"directories":[{{"path":"/etc/d"}}]}},"systemd":{{"units":[{{"name":"a.service","contents":"[Unit]\n","dropins":[{}]}}]}}}}"#,
            files.join(","),
            d.join(",")
        )
    };
    parse(ign(1).as_bytes()).unwrap();
    too_many(parse(ign(2).as_bytes()), MAX_ENTRIES + 1);
}
