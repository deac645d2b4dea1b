//! Staging: relocation, accounts, secrets, generated files, tar, determinism, real ssh-keygen.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use ingot_bootstrap::{parse, stage, Entry, EntryKind, Role, Staged};

fn staged(name: &str, host_keys: bool, seed: u64) -> Staged {
    let b = parse(&fixture(name)).unwrap();
    stage(&input(b, host_keys), &mut rng(seed)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn file<'a>(s: &'a Staged, path: &str) -> (&'a Entry, String) {
    let e = s.get(path).unwrap_or_else(|| panic!("{path} not staged"));
    match &e.kind {
        EntryKind::File(c) => (e, String::from_utf8_lossy(c).into_owned()),
        _ => panic!("{path} is not a file"),
    }
}

#[test]
fn control_plane_init_is_staged() {
    let s = staged("cloud-config-controlplane-init.yaml", false, 7);
    assert_eq!(s.role, Role::ControlPlane);
    assert_eq!(s.hostname, "hetzner-prod-cp-0");
    // /run is relocated, with the jinja hostname rendered and secret mode.
    assert!(s.entries.iter().all(|e| !e.path.starts_with("/run")));
    let (kc, text) = file(&s, "/etc/ingot/run/kubeadm/kubeadm.yaml");
    assert_eq!(
        kc.mode, 0o600,
        "0640 tightened: it carries a bootstrap token"
    );
    assert!(text.contains("name: 'hetzner-prod-cp-0'"), "{text}");
    assert!(s.secrets.contains(&kc.path));
    let (ph, _) = file(&s, "/etc/ingot/run/cluster-api/placeholder");
    assert_eq!(ph.mode, 0o640);
    // Certificates: keys secret, certs as given.
    let (key, _) = file(&s, "/etc/kubernetes/pki/ca.key");
    assert_eq!(key.mode, 0o600);
    assert!(s.secrets.contains(&key.path));
    let (crt, crt_text) = file(&s, "/etc/kubernetes/pki/ca.crt");
    assert_eq!((crt.mode, crt.uid, crt.gid), (0o640, 0, 0));
    assert_eq!(crt_text.as_bytes(), fixture("plain/ca.crt"));
    assert!(!s.secrets.contains(&crt.path));
    // The script copies /run first, then runs runcmd in order, then marks done.
    let (sh, script) = file(&s, "/etc/ingot/bootstrap.sh");
    assert_eq!(sh.mode, 0o700);
    let cp = script.find("cp -a /etc/ingot/run/. /run/").expect(&script);
    let init = script
        .find("kubeadm init --config /run/kubeadm/kubeadm.yaml")
        .expect(&script);
    let sysctl = script.find("sysctl --system").expect(&script);
    let done = script
        .find(": > /var/lib/ingot/bootstrap.done")
        .expect(&script);
    assert!(cp < sysctl && sysctl < init && init < done, "{script}");
    assert!(script.starts_with("#!/bin/sh\n") && script.contains("\nset -eu\n"));
    // The unit that runs it is the base's (boot contract v2): the node layer carries data only.
    assert!(s
        .get("/etc/systemd/system/ingot-bootstrap.service")
        .is_none());
    assert!(s
        .get("/etc/systemd/system/multi-user.target.wants/ingot-bootstrap.service")
        .is_none());
    // Identity.
    assert_eq!(file(&s, "/etc/hostname").1, "hetzner-prod-cp-0\n");
    assert!(file(&s, "/etc/hosts")
        .1
        .contains("127.0.1.1\thetzner-prod-cp-0\n"));
    let id = file(&s, "/etc/machine-id").1;
    assert_eq!(id.len(), 33);
    assert!(
        id[..32]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            && id.ends_with('\n')
    );
    control_plane_accounts(&s);
    control_plane_network_and_labels(&s);
    // Parents before children, no duplicates; /root untouched (no root keys here).
    for w in s.entries.windows(2) {
        assert!(w[0].path < w[1].path);
    }
    for e in &s.entries {
        if let Some(p) = e.path.parent().filter(|p| *p != Path::new("/")) {
            assert_eq!(
                s.get(p).map(|x| &x.kind),
                Some(&EntryKind::Dir),
                "{}",
                e.path.display()
            );
        }
    }
}

/// The control plane's accounts: capi is new (uid 1000), docker created, sudo extended.
fn control_plane_accounts(s: &Staged) {
    let passwd = file(s, "/etc/passwd").1;
    assert!(passwd.starts_with(&fixture_text("base-passwd")));
    assert!(
        passwd.ends_with("capi:*:1000:1000::/home/capi:/bin/bash\n"),
        "{passwd}"
    );
    let group = file(s, "/etc/group").1;
    assert!(
        group.contains("\nsudo:x:27:capi\n") && group.contains("\ndocker:x:1001:capi\n"),
        "{group}"
    );
    let home = s.get("/home/capi").unwrap();
    assert_eq!((home.mode, home.uid, home.gid), (0o700, 1000, 1000));
    let ssh = s.get("/home/capi/.ssh").unwrap();
    assert_eq!((ssh.mode, ssh.uid), (0o700, 1000));
    let (ak, keys) = file(s, "/home/capi/.ssh/authorized_keys");
    assert_eq!((ak.mode, ak.uid, ak.gid), (0o600, 1000, 1000));
    assert!(keys.starts_with("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx3"));
    let (sudo, rules) = file(s, "/etc/sudoers.d/90-ingot-users");
    assert_eq!(
        (sudo.mode, rules.as_str()),
        (0o440, "capi ALL=(ALL) NOPASSWD:ALL\n")
    );
}

/// The control plane's network, node labels and node.json.
fn control_plane_network_and_labels(s: &Staged) {
    let net = file(s, "/etc/systemd/network/10-ingot-enp7s0.network").1;
    for l in [
        "MACAddress=a8:a1:59:0c:12:34",
        "Address=203.0.113.20/26",
        "Address=2001:db8:1:2::2/64",
        "Gateway=203.0.113.1",
        "Gateway=fe80::1",
        "DNS=185.12.64.1",
    ] {
        assert!(net.lines().any(|x| x == l), "{l}:\n{net}");
    }
    assert_eq!(
        file(s, "/etc/default/kubelet").1,
        "KUBELET_EXTRA_ARGS=--node-labels=example.com/rack=r12,node.kubernetes.io/exclude-from-external-load-balancers=true\n"
    );
    let node: serde_json::Value = serde_json::from_str(&file(s, "/etc/ingot/node.json").1).unwrap();
    assert_eq!(node["role"], "control-plane");
    assert_eq!(node["machine_name"], "hetzner-prod-cp-0");
    assert_eq!(node["labels"]["example.com/rack"], "r12");
}

#[test]
fn worker_and_ignition_roles_and_units() {
    let s = staged("cloud-config-worker-join.yaml", false, 1);
    assert_eq!(s.role, Role::Worker);
    let script = file(&s, "/etc/ingot/bootstrap.sh").1;
    assert!(script.find("echo bootcmd ran").unwrap() < script.find("kubeadm join").unwrap());

    let s = staged("ignition-v2-controlplane-init.json", false, 1);
    assert_eq!(s.role, Role::ControlPlane);
    let (u, _) = file(&s, "/etc/systemd/system/kubeadm.service");
    assert_eq!(u.mode, 0o644);
    assert_eq!(
        s.get("/etc/systemd/system/multi-user.target.wants/kubeadm.service")
            .unwrap()
            .kind,
        EntryKind::Symlink("/etc/systemd/system/kubeadm.service".into())
    );
    assert_eq!(
        s.get("/etc/systemd/system/multi-user.target.wants/ntpd.service")
            .unwrap()
            .kind,
        EntryKind::Symlink("/usr/lib/systemd/system/ntpd.service".into())
    );
    assert!(
        s.warnings.iter().any(|w| w.contains("ntpd.service")),
        "{:?}",
        s.warnings
    );
    let (yml, _) = file(&s, "/etc/kubeadm.yml");
    assert_eq!(yml.mode, 0o600);
    assert_eq!(file(&s, "/etc/kubeadm.sh").0.mode, 0o700);
    // Nothing in runcmd, nothing relocated: no first-boot unit of ours.
    assert!(s.get("/etc/ingot/bootstrap.sh").is_none());

    let s = staged("ignition-v3-controlplane-join.json", false, 1);
    assert_eq!(s.role, Role::ControlPlane);
    assert_eq!(
        staged("ignition-v2-worker-join.json", false, 1).role,
        Role::Worker
    );
}

#[test]
fn appends_and_replacements() {
    let text = "#cloud-config\nhostname: n1\nwrite_files:\n- path: /etc/motd\n  content: \"a\\n\"\n- path: /etc/motd\n  append: true\n  content: \"b\\n\"\n- path: /etc/environment\n  append: true\n  content: \"X=1\\n\"\n- path: /etc/hostname\n  content: \"other\\n\"\n";
    let s = stage(&input(parse(text.as_bytes()).unwrap(), false), &mut rng(3)).unwrap();
    assert_eq!(file(&s, "/etc/motd").1, "a\nb\n");
    assert_eq!(file(&s, "/etc/ingot/append/etc/environment").1, "X=1\n");
    assert!(file(&s, "/etc/ingot/bootstrap.sh")
        .1
        .contains("cat /etc/ingot/append/etc/environment >> /etc/environment\n"));
    assert_eq!(file(&s, "/etc/hostname").1, "other\n");
    assert!(
        s.warnings.iter().any(|w| w.contains("/etc/hostname")),
        "{:?}",
        s.warnings
    );
    assert!(s.get("/etc/environment").is_none());
}

#[test]
fn root_keys_keep_root_private() {
    let text =
        "#cloud-config\nssh_authorized_keys:\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx3 a@b\n";
    let s = stage(&input(parse(text.as_bytes()).unwrap(), false), &mut rng(3)).unwrap();
    assert_eq!(s.get("/root").unwrap().mode, 0o700);
    let (ak, _) = file(&s, "/root/.ssh/authorized_keys");
    assert_eq!((ak.mode, ak.uid), (0o600, 0));
    assert!(
        s.get("/etc/passwd").is_none(),
        "no account change, no passwd"
    );
}

#[test]
fn same_seed_same_files() {
    let a = staged("cloud-config-controlplane-join.yaml", true, 42).entries;
    let b = staged("cloud-config-controlplane-join.yaml", true, 42).entries;
    assert!(a == b, "the same data and seed stage different files");
    let c = staged("cloud-config-controlplane-join.yaml", true, 43).entries;
    assert!(a != c, "another seed must give other keys and machine-id");
}

#[test]
fn ssh_host_keys_accepted_by_ssh_keygen() {
    let s = staged("cloud-config-worker-join.yaml", true, 9);
    let dir = tempfile::tempdir().unwrap();
    for (name, bits) in [("ed25519", "256"), ("rsa", "3072")] {
        let (k, private) = file(&s, &format!("/etc/ssh/ssh_host_{name}_key"));
        assert_eq!(k.mode, 0o600);
        assert!(s.secrets.contains(&k.path));
        let (p, public) = file(&s, &format!("/etc/ssh/ssh_host_{name}_key.pub"));
        assert_eq!(p.mode, 0o644);
        let kp = dir.path().join(name);
        std::fs::write(&kp, &private).unwrap();
        std::fs::set_permissions(&kp, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let out = Command::new("ssh-keygen")
            .arg("-y")
            .arg("-f")
            .arg(&kp)
            .output()
            .expect("ssh-keygen (apt-get install openssh-client)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let derived = String::from_utf8(out.stdout).unwrap();
        let fields = |t: &str| {
            t.split_whitespace()
                .take(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(fields(&derived), fields(&public), "{name}");
        let pp = dir.path().join(format!("{name}.pub"));
        std::fs::write(&pp, &public).unwrap();
        let out = Command::new("ssh-keygen")
            .arg("-l")
            .arg("-f")
            .arg(&pp)
            .output()
            .unwrap();
        assert!(out.status.success());
        let line = String::from_utf8(out.stdout).unwrap();
        assert!(line.starts_with(&format!("{bits} SHA256:")), "{line}");
        assert!(line.contains("root@hetzner-prod-cp-0"), "{line}");
        assert!(line.to_lowercase().contains(&format!("({name})")), "{line}");
    }
}

/// The staged tree, sealed as the writer seals it, read back with e2fsprogs' own `debugfs`.
#[test]
fn sealed_layer_keeps_modes_and_owners() {
    let s = staged("cloud-config-controlplane-init.yaml", false, 5);
    let dir = tempfile::tempdir().unwrap();
    let (img, hash) = (dir.path().join("node.img"), dir.path().join("node.hash"));
    let opts = ingot_layers::Ext4Options {
        seed: b"test/node/cp-0".to_vec(),
        source_date_epoch: 0,
        size: None,
        progress: None,
    };
    ingot_layers::seal_tree(&s.to_tree().unwrap(), &img, &hash, &opts).unwrap();
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    for (name, mode, uid, gid) in [
        ("/etc", "0755", 0, 0),
        ("/etc/kubernetes/pki/ca.key", "0600", 0, 0),
        ("/etc/kubernetes/pki/ca.crt", "0640", 0, 0),
        ("/etc/ingot/run/kubeadm/kubeadm.yaml", "0600", 0, 0),
        ("/etc/ingot/bootstrap.sh", "0700", 0, 0),
        ("/etc/sudoers.d/90-ingot-users", "0440", 0, 0),
        ("/home/capi", "0700", 1000, 1000),
        ("/home/capi/.ssh/authorized_keys", "0600", 1000, 1000),
    ] {
        let out = Command::new("debugfs")
            .arg("-R")
            .arg(format!("stat {name}"))
            .arg(&img)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |key: &str| {
            text.split_whitespace()
                .skip_while(|w| *w != key)
                .nth(1)
                .unwrap_or_else(|| panic!("{name}: no {key} in\n{text}"))
                .to_string()
        };
        assert_eq!(field("Mode:"), mode, "{name}");
        assert_eq!(field("User:"), uid.to_string(), "{name}");
        assert_eq!(field("Group:"), gid.to_string(), "{name}");
        let size = s.get(name).map(|e| match &e.kind {
            EntryKind::File(c) => c.len(),
            _ => 0,
        });
        if let Some(n) = size.filter(|n| *n > 0) {
            assert_eq!(field("Size:"), n.to_string(), "{name}");
        }
    }
}

#[test]
fn no_secret_in_debug_output() {
    for name in CLOUD_CONFIGS.iter().chain(IGNITIONS) {
        let b = parse(&fixture(name)).unwrap();
        let dbg = format!("{b:?}");
        let s = stage(&input(b, false), &mut rng(1)).unwrap();
        let sdbg = format!("{s:?}");
        for text in [&dbg, &sdbg] {
            assert!(!text.contains(TOKEN), "{name}");
            assert!(
                !text.contains("MIIEowIBAAKCAQEAzHtQ1Ko9u7uWcW5b3l3Yk0m6gM5cV8"),
                "{name}"
            );
            assert!(!text.contains("PRIVATE KEY"), "{name}");
        }
    }
    let s = staged("cloud-config-worker-join.yaml", true, 2);
    let sdbg = format!("{s:?}");
    assert!(!sdbg.contains("OPENSSH PRIVATE KEY"));
    let (_, private) = file(&s, "/etc/ssh/ssh_host_ed25519_key");
    let body = private.lines().nth(1).unwrap();
    assert!(!sdbg.contains(body));
    // Commands with tokens are redacted in Debug.
    let b = parse(
        b"#cloud-config\nruncmd:\n- kubeadm join 1.2.3.4:6443 --token 6h4ylc.5x2jgkf0q8t7mw1d\n",
    )
    .unwrap();
    assert!(!format!("{b:?}").contains(TOKEN));
    assert!(format!("{b:?}").contains("[REDACTED]"));
}

fn stage_text(text: &str) -> Result<Staged, ingot_bootstrap::StageError> {
    let b = parse(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
    stage(&input(b, false), &mut rng(1))
}

/// Issue 15, item 8: files under /proc, /sys and /dev were staged into the node layer, where the
/// kernel's mounts hide them at boot. They are refused, naming the path and the mount.
#[test]
fn paths_under_kernel_mounts_are_refused() {
    for (key, path) in [
        ("write_files", "/proc/sys/kernel/x"),
        ("write_files", "/sys/kernel/mm/transparent_hugepage/enabled"),
        ("write_files", "/dev/shm/token"),
        ("write_files", "/dev"),
    ] {
        let text = format!("#cloud-config\n{key}:\n- path: {path}\n  content: x\n");
        let err = stage_text(&text).expect_err(path).to_string();
        let top = format!("/{}", path.split('/').nth(1).unwrap());
        assert!(
            err.contains(path) && err.contains(&format!("under {top}")),
            "{path}: {err}"
        );
    }
    // Ignition directories and links too.
    let ign = r#"{"ignition":{"version":"3.4.0"},"storage":{"directories":[{"path":"/sys/fs/x"}],"links":[{"path":"/dev/disk/by-id/x","target":"/dev/sda"}]}}"#;
    let err = stage_text(ign).expect_err("ignition").to_string();
    assert!(
        err.contains("/sys/fs/x") && err.contains("under /sys"),
        "{err}"
    );
    // A path merely starting with the same letters is not under /dev. (Boot contract v3 changed
    // this check: it was staged; now the per-node layer's allow-list refuses it, for that reason.)
    let err = stage_text("#cloud-config\nwrite_files:\n- path: /devices.txt\n  content: x\n")
        .expect_err("/devices.txt")
        .to_string();
    assert!(
        !err.contains("under /dev") && err.contains("only carry paths under /etc, /root and /home"),
        "{err}"
    );
}

/// Issue 15, item 9: in a jinja template, the host name variables in a write_files path are
/// rendered (cloud-init renders the whole document); other jinja in a path is refused rather
/// than staged as a directory of that literal name; jinja left in runcmd/bootcmd is reported.
#[test]
fn jinja_in_paths_and_commands_is_rendered_or_reported() {
    let text = "## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/{{ ds.meta_data.hostname }}/id\n  content: x\n";
    let s = stage_text(text).unwrap();
    assert!(
        s.get("/etc/hetzner-prod-cp-0/id").is_some(),
        "{:?}",
        s.entries
    );
    assert!(s
        .entries
        .iter()
        .all(|e| !e.path.to_string_lossy().contains("{{")));

    let text = "## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/{{ ds.meta_data.region }}/id\n  content: x\n";
    let err = stage_text(text)
        .expect_err("unknown jinja in a path")
        .to_string();
    assert!(
        err.contains("/etc/{{ ds.meta_data.region }}/id") && err.contains("jinja"),
        "{err}"
    );

    let text = "## template: jinja\n#cloud-config\nbootcmd:\n- echo {{ v1.hostname }}\nruncmd:\n- echo {{ ds.meta_data.hostname }}\n- echo {{ ds.meta_data.instance_id }}\n";
    let s = stage_text(text).unwrap();
    let (_, script) = file(&s, "/etc/ingot/bootstrap.sh");
    assert!(script.contains("echo hetzner-prod-cp-0\n"), "{script}");
    assert!(
        script.contains("echo {{ ds.meta_data.instance_id }}\n"),
        "{script}"
    );
    let reported: Vec<&String> = s.warnings.iter().filter(|w| w.contains("jinja")).collect();
    assert_eq!(reported.len(), 1, "{:?}", s.warnings);
    assert!(reported[0].starts_with("runcmd[1]:"), "{reported:?}");

    // Without the template header, braces are data, in paths and commands alike.
    let s = stage_text("#cloud-config\nwrite_files:\n- path: /etc/{{x}}\n  content: x\n").unwrap();
    assert!(s.get("/etc/{{x}}").is_some());
}

/// Issue 15, item 10: with runcmd present, the data's own /etc/ingot/bootstrap.sh or
/// ingot-bootstrap.service was silently replaced by ingot's. That conflict is refused, naming
/// the path; without anything to run, the data's file is staged as given.
#[test]
fn the_data_cannot_also_write_the_first_boot_script() {
    for path in [
        "/etc/ingot/bootstrap.sh",
        "/etc/systemd/system/ingot-bootstrap.service",
    ] {
        let text = format!(
            "#cloud-config\nwrite_files:\n- path: {path}\n  content: mine\nruncmd:\n- echo hi\n"
        );
        let err = stage_text(&text).expect_err(path).to_string();
        assert!(err.contains(path) && err.contains("ingot"), "{err}");
        let text = format!("#cloud-config\nwrite_files:\n- path: {path}\n  content: mine\n");
        let s = stage_text(&text).unwrap();
        assert_eq!(file(&s, path).1, "mine");
    }
}

fn refused(text: &str, want: &str) {
    let err = stage_text(text).expect_err(want).to_string();
    assert!(err.starts_with(want), "want {want:?}, got: {err}");
    assert!(
        matches!(
            stage_text(text),
            Err(ingot_bootstrap::StageError::NotAllowed { .. })
        ),
        "{err}"
    );
}

/// Boot contract v3: the per-node layer, highest in `/` and sealed for the machine's life, may
/// only carry what a node's identity and bootstrap need: paths under /etc, /root and /home
/// (/run and /tmp staged under /etc/ingot). Anything else, and the loader's and systemd's
/// manager configuration, and a drop-in for a unit of the release, is refused naming the path
/// and where in the data it came from.
#[test]
fn node_layer_paths_outside_the_allow_list_are_refused() {
    for path in [
        "/usr/bin/kubelet",
        "/usr/local/bin/x",
        "/opt/cni/bin/bridge",
        "/var/lib/kubelet/config.yaml",
        "/srv/x",
        "/boot/vmlinuz",
        "/x",
        "/etc",
        "/etc/ld.so.preload",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d/evil.conf",
        "/etc/systemd/system.conf.d/env.conf",
        "/etc/systemd/system-generators/x",
        "/etc/systemd/system/containerd.service.d/override.conf",
        "/etc/systemd/system/multi-user.target.d/x.conf",
    ] {
        let text = format!("#cloud-config\nwrite_files:\n- path: {path}\n  content: x\n");
        refused(&text, &format!("write_files: {path}: "));
    }
    // The data's own unit may have its own drop-in; the allowed places stage as before.
    let ok = stage_text(
        "#cloud-config\nwrite_files:\n- path: /etc/systemd/system/mine.service\n  content: |\n    [Service]\n    ExecStart=/bin/true\n- path: /etc/systemd/system/mine.service.d/10.conf\n  content: x\n- path: /root/.kube/config\n  content: x\n- path: /home/capi/x\n  content: x\n- path: /run/kubeadm/k.yaml\n  content: x\n",
    )
    .unwrap();
    for p in [
        "/etc/systemd/system/mine.service.d/10.conf",
        "/root/.kube/config",
        "/home/capi/x",
        "/etc/ingot/run/kubeadm/k.yaml",
    ] {
        assert!(ok.get(p).is_some(), "{p}");
    }
    // Ignition: files, directories, links, and drop-ins for a unit without contents (the base's).
    let ign = |storage: &str, units: &str| {
        format!(
            r#"{{"ignition":{{"version":"3.4.0"}},"storage":{{{storage}}},"systemd":{{"units":[{units}]}}}}"#
        )
    };
    refused(
        &ign(
            r#""files":[{"path":"/usr/bin/kubelet","contents":{"source":"data:,x"}}]"#,
            "",
        ),
        "storage.files: /usr/bin/kubelet: ",
    );
    refused(
        &ign(r#""directories":[{"path":"/usr/local","mode":511}]"#, ""),
        "storage.directories: /usr/local: ",
    );
    refused(
        &ign(
            r#""links":[{"path":"/etc/ld.so.preload","target":"/etc/x.so"}]"#,
            "",
        ),
        "storage.links: /etc/ld.so.preload: ",
    );
    refused(
        &ign("", r#"{"name":"containerd.service","dropins":[{"name":"x.conf","contents":"[Service]\nExecStart=\nExecStart=/etc/evil\n"}]}"#),
        "systemd.units \"containerd.service\" dropins: /etc/systemd/system/containerd.service.d/x.conf: ",
    );
    let own = stage_text(&ign("", r#"{"name":"mine.service","contents":"[Service]\nExecStart=/bin/true\n","dropins":[{"name":"x.conf","contents":"[Unit]\n"}]}"#)).unwrap();
    assert!(own
        .get("/etc/systemd/system/mine.service.d/x.conf")
        .is_some());
}

/// Hostile-input issue, item 6: a user whose home directory is an existing system directory
/// would make it the user's (mode 0700, the user's uid) in the sealed node layer, hiding the
/// base's own metadata of `/usr`, `/` or `/etc`. Homes the stage makes must be strictly below
/// /home (/root for root); keys for a base user whose home is elsewhere are refused too.
#[test]
fn a_home_that_is_a_system_directory_is_refused() {
    for home in [
        "/usr",
        "/",
        "/etc",
        "/home",
        "/root",
        "/var/lib/intruder",
        "/opt",
    ] {
        let text = format!("#cloud-config\nusers:\n- name: intruder\n  homedir: {home}\n");
        refused(&text, &format!("users \"intruder\" homedir: {home}: "));
    }
    refused(
        "#cloud-config\nusers:\n- name: daemon\n  ssh_authorized_keys:\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx3VdZ2n2Zl0QpG1mW8b4YyNw9qL3c7T5s0dR6eF8hJ x\n",
        "users \"daemon\" homedir: /usr/sbin: ",
    );
    // Without a home to make (no_create_home, no keys) any home is only a passwd field.
    let s = stage_text(
        "#cloud-config\nusers:\n- name: svc\n  homedir: /nonexistent\n  no_create_home: true\n",
    )
    .unwrap();
    assert!(s.get("/nonexistent").is_none());
    let s = stage_text("#cloud-config\nusers:\n- name: capi\n").unwrap();
    let home = s.get("/home/capi").expect("/home/capi");
    assert_eq!(home.mode, 0o700);
}

/// A cloud-config writing each `(path, content)`.
fn write_files(files: &[(&str, &str)]) -> String {
    let mut text = String::from("#cloud-config\nwrite_files:\n");
    for (p, c) in files {
        text.push_str(&format!("- path: '{p}'\n  content: {c:?}\n"));
    }
    text
}

/// Issue 32, item 4: the allow-list checked only the first name under /etc/systemd/system, so a
/// dummy file named `service` owned `service.d/` (a drop-in for every service), `systemd-.service`
/// owned the prefix drop-in `systemd-.service.d/`, and system.control/, system.attached/, user/
/// and /run/systemd/... (copied there on first boot) were not checked at all. Every unit
/// directory of the system and user managers is checked alike, a drop-in is owned only by a unit
/// file under a valid name, and type-level and prefix drop-ins are refused.
#[test]
#[allow(clippy::too_many_lines)] // one table of refused unit paths, read as a list
fn every_systemd_unit_directory_is_checked() {
    let env = "[Service]\nEnvironment=LD_PRELOAD=/etc/evil.so\n";
    for (files, path, why) in [
        (
            vec![
                ("/etc/systemd/system/service", ""),
                ("/etc/systemd/system/service.d/env.conf", env),
            ],
            "/etc/systemd/system/service",
            "is not a unit name",
        ),
        (
            vec![("/etc/systemd/system/service.d/env.conf", env)],
            "/etc/systemd/system/service.d/env.conf",
            "type-level .d directory",
        ),
        (
            vec![("/etc/systemd/system/socket.wants/evil.service", "")],
            "/etc/systemd/system/socket.wants/evil.service",
            "type-level .wants directory",
        ),
        (
            vec![
                ("/etc/systemd/system/systemd-.service", "[Unit]\n"),
                ("/etc/systemd/system/systemd-.service.d/env.conf", env),
            ],
            "/etc/systemd/system/systemd-.service.d/env.conf",
            "prefix .d directory",
        ),
        (
            vec![(
                "/etc/systemd/system.control/containerd.service.d/50-exec.conf",
                env,
            )],
            "/etc/systemd/system.control/containerd.service.d/50-exec.conf",
            "a drop-in for containerd.service",
        ),
        (
            vec![(
                "/etc/systemd/system.attached/containerd.service.d/x.conf",
                env,
            )],
            "/etc/systemd/system.attached/containerd.service.d/x.conf",
            "a drop-in for containerd.service",
        ),
        (
            vec![("/etc/systemd/user/dbus.service.d/x.conf", env)],
            "/etc/systemd/user/dbus.service.d/x.conf",
            "a drop-in for dbus.service",
        ),
        (
            vec![("/etc/xdg/systemd/user/service.d/x.conf", env)],
            "/etc/xdg/systemd/user/service.d/x.conf",
            "type-level",
        ),
        (
            vec![("/root/.config/systemd/user/dbus.service.d/x.conf", env)],
            "/root/.config/systemd/user/dbus.service.d/x.conf",
            "a drop-in for dbus.service",
        ),
        (
            vec![("/run/systemd/system/containerd.service.d/x.conf", env)],
            "/run/systemd/system/containerd.service.d/x.conf",
            "a drop-in for containerd.service",
        ),
        (
            vec![(
                "/var/run/systemd/transient/containerd.service.d/x.conf",
                env,
            )],
            "/var/run/systemd/transient/containerd.service.d/x.conf",
            "a drop-in for containerd.service",
        ),
        (
            vec![(
                "/etc/ingot/run/systemd/system/containerd.service.d/x.conf",
                env,
            )],
            "/etc/ingot/run/systemd/system/containerd.service.d/x.conf",
            "a drop-in for containerd.service",
        ),
        (
            vec![("/run/systemd/system.conf.d/env.conf", env)],
            "/run/systemd/system.conf.d/env.conf",
            "DefaultEnvironment",
        ),
        (
            vec![("/etc/systemd/user.conf.d/env.conf", env)],
            "/etc/systemd/user.conf.d/env.conf",
            "DefaultEnvironment",
        ),
        (
            vec![("/etc/systemd/system/x/y.service", "")],
            "/etc/systemd/system/x/y.service",
            "is not a drop-in",
        ),
        // A unit of the system manager does not own a user manager's drop-in.
        (
            vec![
                ("/etc/systemd/system/mine.service", "[Service]\n"),
                ("/etc/systemd/user/mine.service.d/x.conf", env),
            ],
            "/etc/systemd/user/mine.service.d/x.conf",
            "a drop-in for mine.service",
        ),
    ] {
        refused(&write_files(&files), &format!("write_files: {path}: "));
        let err = stage_text(&write_files(&files)).unwrap_err().to_string();
        assert!(err.contains(why), "{path}: want {why:?}, got: {err}");
    }
}

/// Issue 32, item 4, in Ignition data: a link's drop-ins and a unit's own name are checked.
#[test]
fn ignition_links_and_unit_names_are_checked() {
    // A link is an alias: its drop-ins would apply to the unit it names.
    let ign = r#"{"ignition":{"version":"3.4.0"},"storage":{"links":[{"path":"/etc/systemd/system/mine.service","target":"/usr/lib/systemd/system/containerd.service"}],"files":[{"path":"/etc/systemd/system/mine.service.d/x.conf","contents":{"source":"data:,x"}}]}}"#;
    refused(
        ign,
        "storage.files: /etc/systemd/system/mine.service.d/x.conf: ",
    );
    // An Ignition unit's own name, checked before its drop-ins.
    refused(
        r#"{"ignition":{"version":"3.4.0"},"systemd":{"units":[{"name":"service","contents":"[Service]\n","dropins":[{"name":"x.conf","contents":"[Service]\n"}]}]}}"#,
        "systemd.units \"service\": /etc/systemd/system/service: ",
    );
}

/// Issue 32, item 4: the data's own units are accepted in every unit directory.
#[test]
fn the_datas_own_units_and_their_drop_ins_are_staged() {
    // The data's own units, in any unit directory, with their drop-ins, instances and links.
    let ok = stage_text(&write_files(&[
        ("/etc/systemd/system.control/mine.service", "[Service]\n"),
        (
            "/etc/systemd/system.control/mine.service.d/x.conf",
            "[Service]\n",
        ),
        ("/etc/systemd/system/tpl@.service", "[Service]\n"),
        ("/etc/systemd/system/tpl@a.service.d/x.conf", "[Service]\n"),
        (
            "/etc/systemd/system/multi-user.target.wants/tpl@a.service",
            "",
        ),
        ("/etc/systemd/user/u.service", "[Service]\n"),
        (
            "/home/capi/.config/systemd/user/u.service.d/x.conf",
            "[Service]\n",
        ),
        ("/run/systemd/system/r.service", "[Service]\n"),
        ("/run/systemd/system/r.service.d/x.conf", "[Service]\n"),
        ("/etc/systemd/system/-.slice.d/x.conf", "[Slice]\n"),
        ("/etc/systemd/system/-.slice", "[Slice]\n"),
    ]))
    .unwrap();
    for p in [
        "/etc/systemd/system.control/mine.service.d/x.conf",
        "/etc/systemd/system/tpl@a.service.d/x.conf",
        "/home/capi/.config/systemd/user/u.service.d/x.conf",
        "/etc/ingot/run/systemd/system/r.service.d/x.conf",
        "/etc/systemd/system/-.slice.d/x.conf",
    ] {
        assert!(ok.get(p).is_some(), "{p}");
    }
}

/// Issue 32, item 4: the unit names the stage accepts are the ones systemd accepts. Each name is
/// a unit file for `systemd-analyze verify`, which refuses a name that is not a unit name
/// ("Failed to prepare filename"), and a write_files path under /etc/systemd/system.
#[test]
fn unit_names_agree_with_systemd() {
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}.service", "l".repeat(247));
    for name in [
        "good.service",
        "a@b.service",
        "tpl@.service",
        "a@b@c.service",
        "a:b_c.timer",
        "a\\x2db.mount",
        "-.slice",
        "foo-.service",
        ".x.service",
        long.as_str(),
        "service",
        "x.bogus",
        "a b.service",
        "@a.service",
        "ä.service",
        "a+b.service",
        "a%b.socket",
        "x.",
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, "[Unit]\nDescription=x\n").unwrap();
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path)
            .env("SYSTEMD_LOG_LEVEL", "err")
            .output()
            .expect("systemd-analyze (the systemd package) runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let systemd_ok = !stderr.contains("Failed to prepare filename");
        let ours = stage_text(&write_files(&[(
            &format!("/etc/systemd/system/{name}"),
            "[Unit]\n",
        )]));
        assert_eq!(
            ours.is_ok(),
            systemd_ok,
            "{name:?}: systemd says {stderr:?}, ingot says {:?}",
            ours.err()
        );
    }
}
