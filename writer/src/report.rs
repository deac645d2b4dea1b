//! Telling people and machines what the writer is doing: a named stage and progress for each
//! step, as a progress bar on a terminal, JSON lines (`--events`), and a JSON status file
//! (`--report`) rewritten atomically at every stage change and at the end.
//!
//! Nothing secret passes through here: messages name layers, offsets and digests only.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use ingot_artifact::registry::{Served, SourceLog};
use serde::Serialize;

/// The writer's named stages, in the order a run first reports them (`gate` comes back after
/// `verify` for the firmware and after `seal` for the size; `plan` to `partition-table` repeat
/// for each target). docgen renders [`Stage::all`] with [`Stage::text`] into `docs/writer.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum_macros::EnumIter)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Reading the machine and the bootstrap data (provisioning runs only).
    Check,
    /// Tools, firmware, target disks, size, SMART health, read speed.
    Gate,
    /// Other operating systems, LVM and md RAID on the disks.
    Guard,
    Resolve,
    Verify,
    /// Staging the per-node files from the bootstrap data.
    #[serde(rename = "stage")]
    Staging,
    /// Sealing the per-node layer: ext4 image and verity tree.
    Seal,
    /// Stopping and clearing the old md arrays and volume groups living only on the targets:
    /// the first step that changes a disk.
    Teardown,
    Plan,
    Wipe,
    Write,
    Esp,
    PartitionTable,
    Finish,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Check => "check",
            Stage::Gate => "gate",
            Stage::Guard => "guard",
            Stage::Staging => "stage",
            Stage::Seal => "seal",
            Stage::Teardown => "teardown",
            Stage::Resolve => "resolve",
            Stage::Verify => "verify",
            Stage::Plan => "plan",
            Stage::Wipe => "wipe",
            Stage::Write => "write",
            Stage::Esp => "esp",
            Stage::PartitionTable => "partition-table",
            Stage::Finish => "finish",
        }
    }

    /// Every stage, in order.
    pub fn all() -> impl Iterator<Item = Stage> {
        <Stage as strum::IntoEnumIterator>::iter()
    }

    /// What the stage does, for the operator's table (one arm each in `what`: a new stage
    /// without it does not compile).
    pub fn text(self) -> StageText {
        use Stage::*;
        StageText {
            runs: match self {
                Check | Gate | Guard | Staging | Seal | Teardown => Runs::Provisioning,
                Resolve | Verify | Plan | Wipe | Write | Esp | PartitionTable | Finish => {
                    Runs::Always
                }
            },
            changes_disk: match self {
                Teardown | Wipe | Write | Esp | PartitionTable => true,
                Check | Gate | Guard | Resolve | Verify | Staging | Seal | Plan | Finish => false,
            },
            what: self.what(),
        }
    }

    /// What the stage does.
    fn what(self) -> &'static str {
        use Stage::*;
        match self {
            Check => {
                "machine facts (UEFI, NVIDIA GPU from PCI, virtualization from CPU flags and \
                 /dev/kvm, disks); parse the bootstrap data; the role from it (`kubeadm init`, or \
                 a join with a control-plane section, is a control plane) unless `--role`"
            }
            Gate => {
                "tools on PATH (`smartctl` on a real machine; `sh` and `reboot` with \
                 `--reboot`), UEFI firmware, the target disks from names or WWNs, and for every \
                 target SMART health (a disk that cannot report is a warning) and an O_DIRECT \
                 sequential read test (`--min-read-speed`, default 20,000 KiB/s rotational, \
                 40,000 KiB/s otherwise, over `--read-test-seconds`, default 3); with `--tpm \
                 require`, a TPM 2.0. Again after `verify`: on a BIOS machine it passes when \
                 the stack carries a BIOS loader (`[boot] bios`); then the node's secrets are \
                 sealed or in the clear, from `--tpm`, the TPM and the stack's PCR policy \
                 (`require` without a policy stops here). Again after `seal`: every target is \
                 large enough for the plan, node layer included"
            }
            Guard => {
                "read every disk's partition table, file systems, md superblocks and LVM \
                 metadata: stop when a non-target disk holds a Linux root, /boot or an ESP with \
                 boot entries (`--allow-foreign-os` makes it a warning), or an md array or LVM \
                 volume group spans target and non-target disks; arrays and volume groups \
                 living only on targets are listed for the teardown (a warning each), whose \
                 commands are planned from what is active (`details.teardown`) and their tools \
                 gated"
            }
            Resolve => {
                "open the source (an OCI layout, or a registry: a tag is resolved to its \
                 digest, `details.resolved` names the source that resolved it)"
            }
            Verify => {
                "check the signature over the descriptor (minisign, or cosign), parse it, \
                 select this machine's layers, fetch each selected layer's hash tree and check \
                 every hash block against the signed root hash; on a UEFI machine, read and \
                 check the release's signed UKI when the stack has one"
            }
            Staging => {
                "read `/etc/passwd` and `/etc/group` from the base layer's blob (from a \
                 registry only the zstd frames holding them, by `Range` requests), stage the \
                 per-node files from the bootstrap data (`bootstrap.md`)"
            }
            Seal => {
                "when the `gate` decided to seal: every staged secret sealed with the TPM under \
                 the release's PCR public key (`systemd-creds encrypt`), its plaintext replaced \
                 by the credential, a symlink into `/run/ingot/secrets` and a line of \
                 `/etc/ingot/sealed-secrets`; then the staged files as a deterministic ext4 \
                 image with its dm-verity tree, by the same layer builder the stack uses"
            }
            Teardown => {
                "only when the guard found md arrays or volume groups living only on the \
                 targets: remove active device-mapper devices on them, empty and stop active \
                 arrays, `wipefs` every target region with a signature, one message per \
                 command; then check nothing holds a target. With `--sysroot` (a fixture \
                 machine) the same commands run against the fixture: each is recorded in \
                 `SYSROOT/host/ran`, `mdadm --stop` and `dmsetup remove` take the device out of \
                 its `sys/block`, and a program named by a `SYSROOT/host/fail/PROGRAM` file \
                 fails with that file's text"
            }
            Plan => {
                "for each target in turn: open it (refused when mounted or held, locked by \
                 another writer, or read-only: `BLKROGET`, an immutable file, a read-only \
                 filesystem), read the base layer's boot files, lay out the disk, check the \
                 boot contract's limits, refuse a target too small for the plan"
            }
            Wipe => "zero the first and last MiB (protective MBR, both GPTs)",
            Write => {
                "per layer: decompress zstd frames in parallel (streamed from the registry when \
                 the source is one; disks after the first copy from the first), write with \
                 O_DIRECT, read back with O_DIRECT and check every block against the signed \
                 tree; a frame that reads back wrong but is right in memory is rewritten up to \
                 `--max-attempts` times; then the hash tree, read back and compared"
            }
            Esp => {
                "read the boot files from the written base layer (every block checked against \
                 its tree), build the FAT32 ESP for the disk's boot chain (a systemd-boot entry, \
                 or the signed UKI; GRUB's core image into the BIOS boot partition with a BIOS \
                 loader), write it, read it back"
            }
            PartitionTable => {
                "write the GPT and protective MBR last (GRUB's boot code in the MBR with a BIOS \
                 loader), sync, read the table back and compare it with the plan"
            }
            Finish => {
                "the summary: which stack went to which disks and the boot chain they got \
                 (`IMAGE_URL_DONE …` when provisioning)"
            }
        }
    }
}

/// Which runs report a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// Only a provisioning run (CAPH's arguments, no `--target`).
    Provisioning,
    /// Every run.
    Always,
}

/// A stage, as the operator's table describes it.
#[derive(Debug, Clone, Copy)]
pub struct StageText {
    pub runs: Runs,
    /// Whether the stage changes a disk (a failure from it on clears the partition tables).
    pub changes_disk: bool,
    pub what: &'static str,
}

/// One line of `--events`.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Seconds since the epoch, with milliseconds.
    pub time: f64,
    pub stage: Stage,
    /// `start`, `progress`, `warning`, `rewrite`, `done`, `failed`.
    pub event: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
}

/// A range that failed its read-back check and was written again.
#[derive(Debug, Clone, Serialize)]
pub struct Rewrite {
    pub layer: String,
    /// Byte offset on the target.
    pub offset: u64,
    pub length: u64,
    pub attempt: u32,
}

/// The `--report` file (`/root/output.json` when provisioning). Its fields are listed, with
/// their JSON type and meaning, in [`Status::FIELDS`]; docgen renders that into the docs and
/// its test checks the list against what this struct serialises to.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// `running`, `done`, `failed`, or `dry-run` (every check passed, nothing was written).
    pub state: &'static str,
    /// The same as CAPH reads it: `Running`, `Succeeded` or `Failed`.
    pub status: &'static str,
    pub stage: Stage,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub layers: Vec<String>,
    pub rewrites: Vec<Rewrite>,
    pub bytes_written: u64,
    /// A failed run: what it left on the disks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disks: Option<DiskState>,
    /// What did not stop the run but should be known (a disk without SMART, unknown keys in
    /// the bootstrap data).
    pub warnings: Vec<String>,
    /// Structured results of provisioning stages (machine facts, gate results, guard scan).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub details: serde_json::Map<String, serde_json::Value>,
    pub updated: f64,
}

/// A field of the status file, as the docs list it.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    /// The JSON type.
    pub kind: &'static str,
    pub means: &'static str,
}

impl Status {
    /// Every field [`Status`] serialises, in its order.
    pub const FIELDS: &'static [Field] = &[
        Field {
            name: "state",
            kind: "string",
            means: "`running`, `done`, `failed`, or `dry-run` (every check passed, nothing was \
                    written)",
        },
        Field {
            name: "status",
            kind: "string",
            means: "as CAPH reads it: `Running`, then `Succeeded` (a dry run too) or `Failed`",
        },
        Field {
            name: "stage",
            kind: "string",
            means: "the stage reported last (the stage table above)",
        },
        Field {
            name: "message",
            kind: "string",
            means: "what CAPH shows as the condition's message: the stage and what is happening \
                    (`write: base: 45% (460 of 1024 MiB)`); on success the summary, on failure \
                    `failed in STAGE: ` and the `error`",
        },
        Field {
            name: "error",
            kind: "string, only on failure",
            means: "the whole error, after the failure reason when provisioning \
                    (`download-failed: …`)",
        },
        Field {
            name: "layers",
            kind: "array of strings",
            means: "the layers selected for this machine, in stacking order",
        },
        Field {
            name: "rewrites",
            kind: "array of objects",
            means: "ranges that read back wrong and were written again: `layer`, `offset`, \
                    `length` (bytes), `attempt`",
        },
        Field {
            name: "bytes_written",
            kind: "number",
            means: "bytes written to the disks so far",
        },
        Field {
            name: "disks",
            kind: "string, only on failure",
            means: "what the failed run left on the disks: `untouched`, `cleared` (no partition \
                    table), or `clear-failed`",
        },
        Field {
            name: "warnings",
            kind: "array of strings",
            means: "what did not stop the run but should be known (a disk without SMART, unknown \
                    keys in the bootstrap data, arrays torn down, a source refused for a blob)",
        },
        Field {
            name: "details",
            kind: "object, left out when empty",
            means: "structured results by key: `settings` (where they came from), `machine` \
                    (facts), `selection` (the machine the layers were selected for), `gates`, \
                    `guard`, `teardown` (the commands), `resolved`, `staged`, `secrets` (sealed \
                    or in the clear, and why: \"The node's secrets\"), `sources`, `plan` (dry \
                    run), `pipeline-LAYER` (time per pipeline stage)",
        },
        Field {
            name: "updated",
            kind: "number",
            means: "when the file was written, seconds since the epoch with milliseconds",
        },
    ];
}

pub struct Reporter {
    events: Option<Mutex<Box<dyn Write + Send>>>,
    report_path: Option<PathBuf>,
    status: Mutex<Status>,
    bar: Mutex<Option<ProgressBar>>,
    show_bar: bool,
    /// When progress last rewrote the status file (it is polled, not streamed).
    last_progress_save: Mutex<f64>,
    /// Print each stage's message as a line on stdout (a provisioner keeps stdout as its log).
    stdout_log: bool,
    /// What each registry source served and why one failed, filled by the registry client:
    /// recorded at the end of every run, whatever its outcome.
    sources: SourceLog,
}

/// What a failed run left on the disks, carried by the pipeline from the first step that
/// changes one; the failure line and the status file say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskState {
    /// Nothing was written to any disk.
    Untouched,
    /// Disks were changed (torn down, wiped, written) and their partition tables cleared
    /// again, so none of them looks bootable.
    Cleared,
    /// Disks were changed and clearing a partition table failed too: a disk may still hold a
    /// table.
    ClearFailed,
}

impl DiskState {
    /// What the failure line says about the disks.
    pub fn describe(self) -> &'static str {
        match self {
            DiskState::Untouched => "no disk was changed",
            DiskState::Cleared => "the target disk was left without a partition table",
            DiskState::ClearFailed => {
                "the target disk was changed and clearing its partition table failed too: \
                 it may still look bootable"
            }
        }
    }
}

fn now() -> f64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_millis() as f64) / 1000.0
}

impl Reporter {
    /// `events`: a path, `-` for stdout, or none. `report`: the status file, or none.
    pub fn new(events: Option<&str>, report: Option<PathBuf>) -> std::io::Result<Reporter> {
        let events: Option<Box<dyn Write + Send>> = match events {
            None => None,
            Some("-") => Some(Box::new(std::io::stdout())),
            Some(path) => Some(Box::new(File::create(path)?)),
        };
        Ok(Reporter {
            events: events.map(Mutex::new),
            report_path: report,
            status: Mutex::new(Status {
                state: "running",
                status: "Running",
                stage: Stage::Resolve,
                message: "resolve: starting".into(),
                error: None,
                layers: Vec::new(),
                rewrites: Vec::new(),
                bytes_written: 0,
                disks: None,
                warnings: Vec::new(),
                details: serde_json::Map::new(),
                updated: now(),
            }),
            bar: Mutex::new(None),
            show_bar: std::io::stderr().is_terminal(),
            last_progress_save: Mutex::new(0.0),
            stdout_log: false,
            sources: SourceLog::default(),
        })
    }

    /// The stage the run begins with, so the status file never shows a stage that has not
    /// started (a provisioning run begins at `check`, a plain write at `resolve`).
    pub fn starting_at(self, stage: Stage) -> Self {
        {
            let mut s = self.status.lock().expect("status lock");
            s.stage = stage;
            s.message = format!("{}: starting", stage.name());
        }
        self
    }

    /// Also print every stage start and warning as a line on stdout.
    pub fn with_stdout_log(mut self) -> Self {
        self.stdout_log = true;
        self
    }

    fn log_line(&self, stage: Stage, message: &str) {
        if self.stdout_log {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "[{}] {message}", stage.name());
            let _ = out.flush();
        }
    }

    fn emit(&self, e: Event) {
        if let Some(out) = &self.events {
            let mut out = out.lock().expect("events lock");
            if let Ok(line) = serde_json::to_string(&e) {
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        }
    }

    fn save(&self) {
        let Some(path) = &self.report_path else {
            return;
        };
        let mut status = self.status.lock().expect("status lock");
        status.updated = now();
        let Ok(json) = serde_json::to_vec_pretty(&*status) else {
            return;
        };
        drop(status);
        // Write beside and rename: a reader never sees half a file.
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, json)
            .and_then(|_| std::fs::rename(&tmp, path))
            .is_err()
        {
            tracing::warn!("cannot write the status file {}", path.display());
        }
    }

    fn event(
        &self,
        stage: Stage,
        event: &'static str,
        message: String,
        layer: Option<&str>,
    ) -> Event {
        Event {
            time: now(),
            stage,
            event,
            message,
            layer: layer.map(str::to_string),
            bytes: None,
            total: None,
            percent: None,
        }
    }

    /// A stage begins.
    pub fn stage(&self, stage: Stage, message: impl Into<String>) {
        let message = message.into();
        tracing::info!("[{}] {message}", stage.name());
        {
            // The status file's message is what a provisioner shows (CAPH's condition message),
            // so it names the stage too.
            let mut s = self.status.lock().expect("status lock");
            s.stage = stage;
            s.message = format!("{}: {message}", stage.name());
        }
        self.log_line(stage, &message);
        self.emit(self.event(stage, "start", message, None));
        self.save();
    }

    /// Progress of a long step; draws the bar on a terminal.
    pub fn progress(&self, stage: Stage, layer: &str, bytes: u64, total: u64) {
        let percent = if total == 0 {
            100.0
        } else {
            (bytes as f64 * 100.0 / total as f64 * 10.0).round() / 10.0
        };
        let mut e = self.event(
            stage,
            "progress",
            format!("{layer}: {bytes} of {total} bytes"),
            Some(layer),
        );
        e.bytes = Some(bytes);
        e.total = Some(total);
        e.percent = Some(percent);
        self.emit(e);
        let t = now();
        let due = {
            let mut last = self.last_progress_save.lock().expect("save lock");
            let due = t - *last >= 1.0 || bytes >= total;
            if due {
                *last = t;
            }
            due
        };
        if due {
            self.status.lock().expect("status lock").message = format!(
                "{}: {layer}: {percent}% ({} of {} MiB)",
                stage.name(),
                bytes >> 20,
                total >> 20
            );
            self.save();
        }
        if self.show_bar {
            let mut bar = self.bar.lock().expect("bar lock");
            let b = bar.get_or_insert_with(|| {
                let b = ProgressBar::new(total);
                b.set_style(
                    ProgressStyle::with_template(
                        "{msg:>16} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                    )
                    .expect("template")
                    .progress_chars("=> "),
                );
                b
            });
            b.set_length(total);
            b.set_message(layer.to_string());
            b.set_position(bytes);
        }
    }

    /// A layer finished writing (or the bar is done).
    pub fn finish_bar(&self) {
        if let Some(b) = self.bar.lock().expect("bar lock").take() {
            b.finish_and_clear();
        }
    }

    pub fn add_written(&self, bytes: u64) {
        self.status.lock().expect("status lock").bytes_written += bytes;
    }

    pub fn set_layers(&self, layers: Vec<String>) {
        self.status.lock().expect("status lock").layers = layers;
        self.save();
    }

    /// Something that does not stop the run but must not go unseen.
    pub fn warning(&self, stage: Stage, message: impl Into<String>) {
        let message = message.into();
        tracing::warn!("[{}] {message}", stage.name());
        self.status
            .lock()
            .expect("status lock")
            .warnings
            .push(message.clone());
        self.log_line(stage, &format!("warning: {message}"));
        self.emit(self.event(stage, "warning", message, None));
        self.save();
    }

    /// Records a structured result under `key` in the status file.
    pub fn detail(&self, key: &str, value: impl Serialize) {
        if let Ok(v) = serde_json::to_value(value) {
            self.status
                .lock()
                .expect("status lock")
                .details
                .insert(key.to_string(), v);
            self.save();
        }
    }

    /// The record the registry client fills for this run (`resolve` opens the source with it).
    pub fn source_log(&self) -> SourceLog {
        self.sources.clone()
    }

    /// What each registry source (mirrors, the origin) served and how each failed, recorded as
    /// the status file's `sources` (location, mirror, bytes, blobs, failures, errors, down) and
    /// said on a line, with a line per source that failed. Called at the end of every run.
    fn record_sources(&self) {
        let served = self.sources.served();
        if served.is_empty() {
            return;
        }
        let stage = self.status.lock().expect("status lock").stage;
        let line = served
            .iter()
            .map(served_text)
            .collect::<Vec<_>>()
            .join("; ");
        tracing::info!("[{}] served by {line}", stage.name());
        self.log_line(stage, &format!("served by {line}"));
        for s in served.iter().filter(|s| !s.errors.is_empty()) {
            let line = format!("{} failed: {}", source_name(s), s.errors.join("; "));
            tracing::info!("[{}] {line}", stage.name());
            self.log_line(stage, &line);
        }
        self.detail("sources", served);
    }

    /// A range failed its read-back check and is written again.
    pub fn rewrite(&self, r: Rewrite) {
        let msg = format!(
            "layer {}: {} bytes at offset {} read back wrong; rewriting (attempt {})",
            r.layer, r.length, r.offset, r.attempt
        );
        tracing::warn!("{msg}");
        let mut e = self.event(Stage::Write, "rewrite", msg, Some(&r.layer));
        e.bytes = Some(r.length);
        self.emit(e);
        self.status.lock().expect("status lock").rewrites.push(r);
        self.save();
    }

    pub fn done(&self, message: impl Into<String>) {
        self.finish_bar();
        self.record_sources();
        let message = message.into();
        {
            let mut s = self.status.lock().expect("status lock");
            s.state = "done";
            s.status = "Succeeded";
            s.stage = Stage::Finish;
            s.message = message.clone();
        }
        self.emit(self.event(Stage::Finish, "done", message, None));
        self.save();
    }

    /// A dry run passed every step up to the plan; nothing was written.
    pub fn dry_run_done(&self, message: impl Into<String>) {
        self.finish_bar();
        self.record_sources();
        let message = message.into();
        {
            let mut s = self.status.lock().expect("status lock");
            s.state = "dry-run";
            s.status = "Succeeded";
            s.message = message.clone();
        }
        self.emit(self.event(Stage::Plan, "done", message, None));
        self.save();
    }

    /// The run failed with `error`, leaving the disks as `disks` says.
    pub fn failed(&self, error: &str, disks: DiskState) {
        self.finish_bar();
        self.record_sources();
        let stage = {
            let mut s = self.status.lock().expect("status lock");
            s.state = "failed";
            s.status = "Failed";
            s.disks = Some(disks);
            s.error = Some(error.to_string());
            s.message = format!("failed in {}: {error}", s.stage.name());
            s.stage
        };
        self.emit(self.event(stage, "failed", error.to_string(), None));
        self.save();
    }

    pub fn status(&self) -> Status {
        self.status.lock().expect("status lock").clone()
    }
}

/// `mirror HOST/REPO` or `origin HOST/REPO`.
fn source_name(s: &Served) -> String {
    let kind = if s.mirror { "mirror" } else { "origin" };
    format!("{kind} {}", s.location)
}

/// One source's line: what it served, and how often it failed.
fn served_text(s: &Served) -> String {
    let mut text = format!("{}: {} bytes, {} blobs", source_name(s), s.bytes, s.blobs);
    if s.failures > 0 {
        text.push_str(&format!(", {} failed", s.failures));
    }
    if s.down {
        text.push_str(", skipped as unreachable");
    }
    text
}
