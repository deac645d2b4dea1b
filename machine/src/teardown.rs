//! Stopping and clearing the storage the guard found living only on target disks
//! ([`Teardown`]), before the writer touches them: installimage's software RAID1 (perhaps with
//! LVM on it), which the rescue system may already have assembled and activated, or an earlier
//! ingot node's mirrored `var`.
//!
//! [`plan`] reads what is active right now from sysfs (`/sys/block/md*/slaves`,
//! `/sys/block/dm-*/slaves`) and `/proc/mounts`, and returns the commands in order:
//!
//! 1. `dmsetup remove NAME` for every active device-mapper device (an LVM logical volume) that
//!    sits only on target disks or on arrays living there, holders before what they hold;
//! 2. for every active md array whose members are all on target disks: `wipefs --all --force`
//!    on the array (what it holds: an LVM label, a filesystem), then `mdadm --stop`;
//! 3. `wipefs --all --force` on every target region with an md superblock or LVM label (it
//!    clears every signature there), partitions first, whole disks last.
//!
//! It refuses (nothing run yet) when a target is mounted, or an active array or device-mapper
//! device uses target and non-target disks at once. [`run`] runs the commands and then checks
//! that nothing holds a target any more.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::gate::{GateFailure, Reason};
use crate::guard::Teardown;
use crate::host::Host;
use crate::{Disk, Sysroot};

/// One command of the teardown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The program (`mdadm`, `vgchange`, `wipefs`), found on `PATH`.
    pub program: String,
    pub args: Vec<String>,
    /// Why, for the report.
    pub why: String,
}

impl Step {
    fn new(program: &str, args: &[&str], why: String) -> Step {
        Step {
            program: program.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            why,
        }
    }

    /// The command line, for messages.
    pub fn command_line(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Whether kernel device `name` is target `disk` or one of its partitions (`sda2`, `nvme0n1p3`).
fn on_disk(name: &str, disk: &str) -> bool {
    let Some(rest) = name.strip_prefix(disk) else {
        return false;
    };
    let digits = if disk.ends_with(|c: char| c.is_ascii_digit()) {
        rest.strip_prefix('p').unwrap_or("x")
    } else {
        rest
    };
    rest.is_empty() || (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// An active stacked device (`md127`, `dm-0`) and the kernel names of what it sits on.
fn stacked(sysroot: &Sysroot, prefix: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(sysroot.path("/sys/block")) else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        let mut slaves: Vec<String> = std::fs::read_dir(e.path().join("slaves"))
            .map(|d| {
                d.flatten()
                    .map(|s| s.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        slaves.sort();
        out.push((name, slaves));
    }
    out.sort();
    out
}

fn refuse(reason: Reason, disk: Option<&str>, message: String) -> GateFailure {
    GateFailure::new(reason, disk, message)
}

/// The commands that stop and clear `teardown` on `targets`, in order (see the module docs).
/// Empty when there is nothing to do.
pub fn plan(
    sysroot: &Sysroot,
    targets: &[Disk],
    teardown: &Teardown,
) -> Result<Vec<Step>, GateFailure> {
    let is_target = |name: &str| targets.iter().any(|t| on_disk(name, &t.name));
    let dev = |name: &str| format!("/dev/{name}");
    refuse_mounted_targets(sysroot, &is_target)?;
    // Arrays (and device-mapper devices) the rescue system has running.
    let arrays = stacked(sysroot, "md");
    let target_md: BTreeSet<&str> = arrays
        .iter()
        .filter(|(_, s)| !s.is_empty() && s.iter().all(|n| is_target(n)))
        .map(|(n, _)| n.as_str())
        .collect();
    let on_targets = |n: &str| is_target(n) || target_md.contains(n);
    let dms = stacked(sysroot, "dm-");
    refuse_mixed(arrays.iter().chain(dms.iter()), &on_targets)?;
    // Device-mapper devices on targets, a holder before what it holds (an LV on a thin pool).
    let dm: Vec<(String, Vec<String>)> = dms
        .into_iter()
        .filter(|(_, s)| !s.is_empty() && s.iter().all(|n| on_targets(n) || n.starts_with("dm-")))
        .collect();
    let mut steps = dm_removals(sysroot, dm);
    for md in &target_md {
        steps.push(Step::new(
            "wipefs",
            &["--all", "--force", &dev(md)],
            format!("clear what array {md} holds"),
        ));
        steps.push(Step::new(
            "mdadm",
            &["--stop", &dev(md)],
            format!("stop array {md}, which lives only on target disks"),
        ));
    }
    for region in &teardown.regions {
        steps.push(Step::new(
            "wipefs",
            &["--all", "--force", &dev(region)],
            format!("clear the md, LVM and filesystem signatures of {region}"),
        ));
    }
    Ok(steps)
}

/// `teardown-failed` when a target (or one of its partitions) is mounted.
fn refuse_mounted_targets(
    sysroot: &Sysroot,
    is_target: &dyn Fn(&str) -> bool,
) -> Result<(), GateFailure> {
    let mounts = std::fs::read_to_string(sysroot.path("/proc/mounts")).unwrap_or_default();
    for line in mounts.lines() {
        let mut f = line.split_whitespace();
        let (Some(src), Some(at)) = (f.next(), f.next()) else {
            continue;
        };
        if let Some(name) = src.strip_prefix("/dev/").filter(|n| is_target(n)) {
            return Err(refuse(
                Reason::TeardownFailed,
                Some(name),
                format!("target {name} is mounted at {at}: unmount it first"),
            ));
        }
    }
    Ok(())
}

/// `md-spans-disks` (an array) or `lvm-on-target` (a device-mapper device) when an active
/// device sits on target and other disks alike.
fn refuse_mixed<'a>(
    devices: impl Iterator<Item = &'a (String, Vec<String>)>,
    on_targets: &dyn Fn(&str) -> bool,
) -> Result<(), GateFailure> {
    for (name, slaves) in devices {
        let on = slaves.iter().any(|n| on_targets(n));
        let off = slaves.iter().any(|n| !on_targets(n));
        if on && off {
            let reason = if name.starts_with("md") {
                Reason::MdSpansDisks
            } else {
                Reason::LvmOnTarget
            };
            return Err(refuse(
                reason,
                None,
                format!(
                    "{name} is active on target and other disks ({}): stop it, or target all \
                     its disks",
                    slaves.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// `dmsetup remove` for each device of `dm`, a holder before what it holds.
fn dm_removals(sysroot: &Sysroot, mut dm: Vec<(String, Vec<String>)>) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    while !dm.is_empty() {
        let before = dm.len();
        dm.retain(|(name, _)| {
            let held = dm_holders(sysroot, name)
                .iter()
                .any(|h| !removed.contains(h));
            if held {
                return true;
            }
            let label = sysroot
                .read_trimmed(format!("/sys/block/{name}/dm/name"))
                .unwrap_or_else(|| name.clone());
            steps.push(Step::new(
                "dmsetup",
                &["remove", &label],
                format!("remove {label} ({name}), an active device on the target disks"),
            ));
            removed.push(name.clone());
            false
        });
        if dm.len() == before {
            // Held by something that is not on the targets: the mixed check names it.
            break;
        }
    }
    steps
}

/// The holders of `name` (`/sys/block/NAME/holders`).
fn dm_holders(sysroot: &Sysroot, name: &str) -> Vec<String> {
    std::fs::read_dir(sysroot.path(format!("/sys/block/{name}/holders")))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The programs `steps` run, each once, for `gate_tools`.
pub fn tools(steps: &[Step]) -> Vec<&str> {
    let set: BTreeSet<&str> = steps.iter().map(|s| s.program.as_str()).collect();
    set.into_iter().collect()
}

/// Runs `steps` in order ([`run_step`]), then [`check_released`].
pub fn run(
    host: &dyn Host,
    sysroot: &Sysroot,
    targets: &[Disk],
    steps: &[Step],
) -> Result<(), GateFailure> {
    for step in steps {
        run_step(host, step)?;
    }
    check_released(sysroot, targets)
}

/// Runs one command; fails with `teardown-failed` naming it and its stderr.
pub fn run_step(host: &dyn Host, step: &Step) -> Result<(), GateFailure> {
    let args: Vec<&str> = step.args.iter().map(String::as_str).collect();
    let out = host.run(&step.program, &args).map_err(|e| {
        refuse(
            Reason::TeardownFailed,
            None,
            format!("{}: {e}", step.command_line()),
        )
    })?;
    if !out.status.success() {
        return Err(refuse(
            Reason::TeardownFailed,
            None,
            format!(
                "{} ({}): {}: {}",
                step.command_line(),
                step.why,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

/// No md array or device-mapper device holds a target (disk or partition) any more; else
/// `teardown-failed` naming the holder.
pub fn check_released(sysroot: &Sysroot, targets: &[Disk]) -> Result<(), GateFailure> {
    let is_target = |name: &str| targets.iter().any(|t| on_disk(name, &t.name));
    for (name, slaves) in stacked(sysroot, "md")
        .into_iter()
        .chain(stacked(sysroot, "dm-"))
    {
        if let Some(s) = slaves.iter().find(|s| is_target(s)) {
            return Err(refuse(
                Reason::TeardownFailed,
                Some(s),
                format!("{name} still uses target {s} after the teardown"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_belong_to_their_disk() {
        assert!(on_disk("sda", "sda") && on_disk("sda12", "sda"));
        assert!(on_disk("nvme0n1p3", "nvme0n1") && on_disk("loop0p1", "loop0"));
        assert!(!on_disk("sdab", "sda") && !on_disk("sdb1", "sda"));
        assert!(!on_disk("nvme0n12", "nvme0n1") && !on_disk("nvme0n1p", "nvme0n1"));
    }
}
