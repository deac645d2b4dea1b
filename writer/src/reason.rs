//! The failure reasons a run ends with: the stable kebab-case name CAPH's `message`, the status
//! file's `error` and the last stdout line (`FAILED (REASON)`) carry, the exit status, and what
//! each means and what an operator does about it. The text is matched here, one arm per reason,
//! so a new reason without it does not compile; docgen renders the table into `docs/caph.md`
//! and `docs/writer.md`, and its test fails when the pages do not show every reason.
//!
//! Which error is which reason is decided in `error.rs`, which uses this module.

use ingot_machine::Reason as GateReason;
use strum::IntoEnumIterator;

/// Why a run failed, as an operator reads it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum_macros::EnumIter, strum_macros::IntoStaticStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum FailureReason {
    BootstrapInvalid,
    MachineUnreadable,
    Io,
    ToolsMissing,
    NotUefi,
    TpmMissing,
    PcrPolicyMissing,
    DiskNotFound,
    BadTarget,
    SmartFailing,
    DiskTooSlow,
    DiskUnreadable,
    ForeignOs,
    MdSpansDisks,
    LvmOnTarget,
    TeardownFailed,
    ImageInvalid,
    DownloadFailed,
    StageFailed,
    SealFailed,
    DiskTooSmall,
    CannotBoot,
    WriteFailed,
    Deadline,
    Interrupted,
}

/// What a reason means and what to do about it.
#[derive(Debug, Clone, Copy)]
pub struct ReasonText {
    pub means: &'static str,
    pub action: &'static str,
}

impl FailureReason {
    /// Every reason, in the order the docs list them.
    pub fn all() -> impl Iterator<Item = FailureReason> {
        FailureReason::iter()
    }

    /// The stable name, e.g. `download-failed`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The writer's exit status when a run ends for this reason: every failure is 1 (0 is
    /// success, 2 bad usage).
    pub fn exit_code(self) -> u8 {
        1
    }

    /// What it means and what an operator does about it.
    pub fn text(self) -> ReasonText {
        ReasonText {
            means: self.means(),
            action: self.action(),
        }
    }

    /// What the reason means (one arm each: a new reason without it does not compile).
    fn means(self) -> &'static str {
        use FailureReason::*;
        match self {
            BootstrapInvalid => {
                "the bootstrap data is not cloud-config or Ignition the writer can apply, or \
                 asks for a path the per-node layer may not carry"
            }
            MachineUnreadable => "sysfs or `/proc` could not be read",
            Io => {
                "the bootstrap data file (CAPH's `/root/bootstrap.data`) could not be read: \
                 missing, not a regular file (`/dev/zero`, a FIFO), or over 64 MiB"
            }
            ToolsMissing => {
                "`smartctl` (or `sh` and `reboot` with `--reboot`; `mdadm`, `wipefs` or \
                 `dmsetup` for a teardown) is not in the rescue system"
            }
            NotUefi => {
                "the machine booted the rescue system with legacy BIOS and the stack has no BIOS \
                 boot path (`[boot] bios`)"
            }
            TpmMissing => {
                "the setting `tpm` is `require` and the machine shows no usable TPM 2.0 \
                 (`/sys/class/tpm/tpm0`; Hetzner's cloud servers have none): its secrets \
                 cannot be sealed"
            }
            PcrPolicyMissing => {
                "the setting `tpm` is `require` and the stack has no signed PCR policy this \
                 machine boots through: no signed UKI (or the machine boots with BIOS), or a \
                 UKI without `.pcrpkey` and `.pcrsig`"
            }
            DiskNotFound => {
                "a root device name or WWN matches no disk; the message lists every disk with \
                 its WWN"
            }
            BadTarget => {
                "a root device names a partition, names a disk a second time (`sda sda`, or a \
                 name and its WWN), or is a WWN more than one disk has; the message names the \
                 token and the disks"
            }
            SmartFailing => "SMART says a target is failing",
            DiskTooSlow => {
                "a target reads slower than the threshold (`min_read_speed`, by default CAPH's: \
                 20,000 KiB/s rotational, 40,000 KiB/s otherwise)"
            }
            DiskUnreadable => {
                "a target could not be read in the read test, or the guard could not read a disk \
                 that is not a target, so an OS on it cannot be ruled out"
            }
            ForeignOs => "a disk that is not a target holds an OS the firmware could boot instead",
            MdSpansDisks => "an md array uses a target and a disk that is not one",
            LvmOnTarget => {
                "an LVM volume group uses a target and a disk that is not one (or one the \
                 machine does not show)"
            }
            TeardownFailed => {
                "a target is mounted, or stopping or clearing the old arrays and volume groups \
                 failed (a device is busy)"
            }
            ImageInvalid => {
                "the stack's signature, descriptor or hash trees do not check out against the \
                 trusted key; or a layer's data blob, as the registry sent it (every source), \
                 is not the signed image (a frame does not decode, or a block does not match \
                 the signed tree), in `resolve`, `verify`, `plan` or `write`"
            }
            DownloadFailed => {
                "the registry could not be reached, or stopped delivering, after the retries \
                 and with every source (refused or dropped connections, too slow), in whichever \
                 step was reading: `resolve`, `verify`, `stage`, `plan` or `write`"
            }
            StageFailed => {
                "the per-node files could not be staged (an owner unknown to the base layer, a \
                 base-layer file that is not the signed image)"
            }
            SealFailed => {
                "the per-node layer could not be sealed (its ext4 image or verity tree), or the \
                 TPM could not seal a secret into it (`systemd-creds encrypt` failed)"
            }
            DiskTooSmall => "the stack plus the node layer do not fit on a target",
            CannotBoot => {
                "the stack would not boot as laid out (found before any disk changed): more \
                 partitions than a GPT's 128 entries, a kernel command line past x86's 2047 \
                 bytes, a boot file missing from the base layer or too big for the ESP, or a \
                 kernel argument with a control character or an `ingot.*` parameter"
            }
            WriteFailed => {
                "a block kept reading back wrong, a write failed, or the target changed under \
                 the run"
            }
            Deadline => "the run passed its deadline (default 6 minutes when provisioning)",
            Interrupted => {
                "SIGTERM or SIGINT stopped the run: while checking, with no disk changed, or \
                 later with the partition-table areas it touched cleared (the last line says \
                 which)"
            }
        }
    }

    /// What an operator does about it.
    fn action(self) -> &'static str {
        use FailureReason::*;
        match self {
            BootstrapInvalid => {
                "fix the KubeadmConfig / bootstrap provider output; the message names the key"
            }
            MachineUnreadable => "a broken rescue system; reboot into rescue again",
            Io => {
                "the message names the file and the error; check what CAPH copied there, then \
                 run again"
            }
            ToolsMissing => "use Hetzner's standard rescue image",
            NotUefi => {
                "switch the server to UEFI in the Robot / BIOS setup, or release a stack with a \
                 BIOS loader"
            }
            TpmMissing => {
                "enable the TPM in the firmware setup, or provision this machine with `tpm = \
                 prefer` (its secrets then lie in the clear on its disks, and the status file \
                 says so)"
            }
            PcrPolicyMissing => {
                "release the stack with a PCR key (`ingot build --pcr-key`), or provision with \
                 `tpm = prefer`"
            }
            DiskNotFound => "fix `rootDeviceHints`",
            BadTarget => "name each whole disk once, by name where WWNs collide",
            SmartFailing => "have Hetzner replace the disk",
            DiskTooSlow => {
                "check the disk; as a last resort lower `min_read_speed` in the built-in \
                 settings"
            }
            DiskUnreadable => {
                "check the disk; the message names it. For a disk that is not a target, \
                 `allow_foreign_os` makes it a warning, or wipe it"
            }
            ForeignOs => {
                "add the disk to `rootDeviceHints.raid`, or wipe it (`wipefs -a` in the rescue \
                 system); `allow_foreign_os` makes it a warning"
            }
            MdSpansDisks => "target all of its disks, or stop the array and clear its members",
            LvmOnTarget => "target all of its disks, or remove the volume group",
            TeardownFailed => {
                "the message names the command and its error; reboot into rescue and run again"
            }
            ImageInvalid => {
                "check `image.url`, the registry credentials and that the stack was signed with \
                 the key built into the binary; for a bad blob the message names the layer, \
                 the blob and the frame: the registry's copy is corrupt, push the release again"
            }
            DownloadFailed => {
                "the message names what was being fetched and `details.sources` every source \
                 tried and why it failed; check the registry and the network, then run again"
            }
            StageFailed => "the message names the file or setting",
            SealFailed => {
                "the message names the file or setting, or `systemd-creds`'s own reason; a \
                 secret is never written in the clear instead"
            }
            DiskTooSmall => "larger disks, or fewer layers for this machine",
            CannotBoot => {
                "the message names the limit; fewer layers for this machine, a larger \
                 `esp_size`, or fix the stack or the setting"
            }
            WriteFailed => "the message names disk, layer and offset; check the disk",
            Deadline => {
                "a slow registry or disk; raise `deadline` in the built-in settings only as far \
                 as CAPH's own limit allows"
            }
            Interrupted => "run it again",
        }
    }

    /// The reason a gate, the guard or the teardown stopped with. A warning's reason never
    /// stops a run (the machine crate reports it as a warning, not a `GateFailure`); were one
    /// to, it counts as the failure of the same check.
    pub fn from_gate(reason: GateReason) -> FailureReason {
        use FailureReason as F;
        match reason {
            GateReason::ToolsMissing => F::ToolsMissing,
            GateReason::NotUefi => F::NotUefi,
            GateReason::TpmMissing => F::TpmMissing,
            GateReason::PcrPolicyMissing => F::PcrPolicyMissing,
            GateReason::DiskNotFound => F::DiskNotFound,
            GateReason::BadTarget => F::BadTarget,
            GateReason::DiskTooSmall => F::DiskTooSmall,
            GateReason::SmartFailing | GateReason::SmartUnavailable | GateReason::SmartDegraded => {
                F::SmartFailing
            }
            GateReason::DiskTooSlow | GateReason::ReadNotDirect => F::DiskTooSlow,
            GateReason::ForeignOs => F::ForeignOs,
            GateReason::LvmOnTarget => F::LvmOnTarget,
            GateReason::MdSpansDisks => F::MdSpansDisks,
            GateReason::DiskUnreadable => F::DiskUnreadable,
            GateReason::TeardownFailed | GateReason::StorageTornDown => F::TeardownFailed,
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate's stop keeps the name the machine crate gives it; a warning's reason counts as
    /// the failure of its check.
    #[test]
    fn gate_stops_keep_their_names() {
        use GateReason::*;
        for r in [
            NotUefi,
            TpmMissing,
            PcrPolicyMissing,
            DiskTooSmall,
            TeardownFailed,
            DiskUnreadable,
        ] {
            assert_eq!(FailureReason::from_gate(r).name(), r.as_str());
        }
        assert_eq!(
            FailureReason::from_gate(SmartUnavailable),
            FailureReason::SmartFailing
        );
    }
}
