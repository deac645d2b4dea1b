//! The first-boot script: copy relocated files back to their tmpfs, apply deferred appends, run
//! `bootcmd` then `runcmd`, and mark the bootstrap done. The unit that runs it once
//! (`ingot-bootstrap.service`, ordered after containerd and the image preload, before the
//! kubelet) is the base's (`boot/systemd/`): a node layer only carries data.

use std::path::Path;

use super::data::Deferred;
use super::jinja::render_jinja;
use super::relocate;
use super::tree::Tree;
use super::{StageError, StageInput, RELOCATED_DIRS};
use crate::model::Format;
use crate::shell::shell_quote;

const SCRIPT: &str = "/etc/ingot/bootstrap.sh";
const UNIT: &str = "/etc/systemd/system/ingot-bootstrap.service";
const DONE: &str = "/var/lib/ingot/bootstrap.done";
const WANTS_LINK: &str = "/etc/systemd/system/multi-user.target.wants/ingot-bootstrap.service";

/// Stages the first-boot script when there is anything to run on first boot.
pub(super) fn stage_first_boot(
    tree: &mut Tree,
    input: &StageInput,
    deferred: &Deferred,
    host: &str,
) -> Result<(), StageError> {
    let b = &input.bootstrap;
    let jinja = matches!(b.format, Format::CloudConfig { jinja: true });
    let mut render = |key: &str, cmds: &[String]| -> Vec<String> {
        if !jinja {
            return cmds.to_vec();
        }
        let mut out = Vec::with_capacity(cmds.len());
        for (i, c) in cmds.iter().enumerate() {
            let (rendered, unresolved) = render_jinja(c, host);
            if unresolved {
                tree.warnings.push(format!(
                    "{key}[{i}]: jinja expressions other than the hostname variables are left as they are"
                ));
            }
            out.push(rendered);
        }
        out
    };
    let boot = render("bootcmd", &b.boot_commands);
    let cmds = render("runcmd", &b.commands);
    if deferred.restore.is_empty()
        && deferred.appends.is_empty()
        && boot.is_empty()
        && cmds.is_empty()
    {
        return Ok(());
    }
    // The data may not bring its own copy of what runs it: ours would replace it unseen.
    for path in [SCRIPT, UNIT, WANTS_LINK] {
        if tree.map.contains_key(Path::new(path)) {
            return Err(Tree::conflict(
                Path::new(path),
                "is written by ingot to run the data's bootcmd, runcmd and first-boot copies; \
                 the bootstrap data may not write it too",
            ));
        }
    }
    tree.generated(SCRIPT, script(deferred, &boot, &cmds), 0o700, 0, 0)?;
    if !b.units.iter().any(|u| u.name == "kubeadm.service")
        && b.kubeadm.is_some()
        && cmds.is_empty()
    {
        tree.warnings
            .push("kubeadm: found in files but not in runcmd; nothing runs it".to_string());
    }
    Ok(())
}

/// The script's text.
fn script(deferred: &Deferred, boot: &[String], cmds: &[String]) -> String {
    let mut sh = String::from(
        "#!/bin/sh\n# Written by ingot: the Cluster API bootstrap, run once on first boot by ingot-bootstrap.service.\nset -eu\nexport HOME=/root\n",
    );
    for root in &deferred.restore {
        let target = RELOCATED_DIRS
            .iter()
            .find(|(_, to)| to == root)
            .map(|(from, _)| *from)
            .unwrap_or("/run");
        // cp -a keeps modes and owners; /run and /tmp are empty tmpfs at this point.
        sh.push_str(&format!("cp -a {root}/. {target}/\n"));
    }
    for (keep, target) in &deferred.appends {
        let runtime = relocate(target)
            .map(|_| {
                // Appends to tmpfs paths go to the live path, after the copy above.
                target.clone()
            })
            .unwrap_or_else(|| target.clone());
        sh.push_str(&format!(
            "cat {} >> {}\n",
            shell_quote(&keep.display().to_string()),
            shell_quote(&runtime.display().to_string())
        ));
    }
    if !boot.is_empty() {
        sh.push_str("# bootcmd\n");
        for c in boot {
            sh.push_str(c);
            sh.push('\n');
        }
    }
    if !cmds.is_empty() {
        sh.push_str("# runcmd\n");
        for c in cmds {
            sh.push_str(c);
            sh.push('\n');
        }
    }
    sh.push_str(&format!(
        "mkdir -p {}\n: > {DONE}\n",
        Path::new(DONE).parent().unwrap().display()
    ));
    sh
}
