//! `finish`: the run's one-line summary, recorded as done.
//!
//! Reads what was written (or, for a dry run, planned); returns the summary (the caller prints
//! it as its protocol says).

use std::path::Path;

use serde_json::json;

use crate::layout::DiskPlan;
use crate::report::Reporter;
use crate::request::{Outcome, Planned, Provisioned};

fn layer_list(outcome: &Outcome) -> String {
    let names: Vec<&str> = outcome.layers.iter().map(|(n, _)| n.as_str()).collect();
    names.join(", ")
}

/// A stack written to a named target.
pub fn written(outcome: &Outcome, target: &Path, reporter: &Reporter) -> String {
    let msg = format!(
        "wrote {} ({}) to {}: layers {}; {} bytes written, {} zero bytes skipped, {} rewrites; \
         boots from {}",
        outcome.stack,
        outcome.manifest_digest,
        target.display(),
        layer_list(outcome),
        outcome.bytes_written,
        outcome.bytes_skipped,
        outcome.rewrites,
        outcome.boot_chain.describe()
    );
    reporter.done(&msg);
    msg
}

/// A machine provisioned.
pub fn provisioned(done: &Provisioned, reporter: &Reporter) -> String {
    let msg = format!(
        "wrote {} ({}) to {} for {} ({}): layers {}; {} bytes written, {} rewrites; boots from \
         {}; {}",
        done.outcome.stack,
        done.outcome.manifest_digest,
        done.disks.join(", "),
        done.hostname,
        done.role.as_str(),
        layer_list(&done.outcome),
        done.outcome.bytes_written,
        done.outcome.rewrites,
        done.outcome.boot_chain.describe(),
        done.secrets.message
    );
    reporter.done(&msg);
    msg
}

/// A dry run that passed: the plan of every disk as lines of text (also recorded under `plan`
/// in the status file), then the summary, recorded as the run's `dry-run` result.
pub fn planned(planned: &Planned, reporter: &Reporter) -> String {
    let mut lines = Vec::new();
    for cmd in &planned.teardown {
        lines.push(format!("would first run: {cmd}"));
    }
    for (disk, plan) in &planned.disks {
        lines.push(format!(
            "{}: {} bytes, {}-byte sectors, GPT disk GUID {}",
            disk.display(),
            plan.disk_size,
            plan.sector_size,
            plan.disk_guid
        ));
        for (i, p) in plan.partitions.iter().enumerate() {
            lines.push(format!(
                "  {:>2} {:<24} offset {:>14} size {:>14} type {} uuid {}",
                i + 1,
                p.label,
                p.offset,
                p.size,
                p.type_guid,
                p.part_guid
            ));
        }
    }
    reporter.detail("plan", plan_json(planned));
    let node = planned
        .node
        .as_ref()
        .map(|(host, role)| format!(" for {host} ({})", role.as_str()))
        .unwrap_or_default();
    let disks: Vec<String> = planned
        .disks
        .iter()
        .map(|(d, _)| d.display().to_string())
        .collect();
    let names: Vec<&str> = planned.layers.iter().map(|(n, _)| n.as_str()).collect();
    let msg = format!(
        "dry run: every check passed; a real run would write {} ({}) to {}{node}: layers {}; \
         nothing was written",
        planned.stack,
        planned.manifest_digest,
        disks.join(", "),
        names.join(", ")
    );
    reporter.dry_run_done(&msg);
    lines.push(msg);
    lines.join("\n")
}

fn plan_json(planned: &Planned) -> serde_json::Value {
    let disk = |(path, plan): &(std::path::PathBuf, DiskPlan)| {
        let partitions: Vec<_> = plan
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| {
                json!({
                    "number": i + 1,
                    "label": p.label,
                    "offset": p.offset,
                    "size": p.size,
                    "type_guid": p.type_guid.to_string(),
                    "part_guid": p.part_guid.to_string(),
                })
            })
            .collect();
        json!({
            "disk": path.display().to_string(),
            "size": plan.disk_size,
            "sector_size": plan.sector_size,
            "disk_guid": plan.disk_guid.to_string(),
            "partitions": partitions,
        })
    };
    let layers: Vec<_> = planned
        .layers
        .iter()
        .map(|(name, root)| json!({"name": name, "root_hash": root}))
        .collect();
    json!({
        "stack": planned.stack,
        "manifest_digest": planned.manifest_digest,
        "layers": layers,
        "teardown": planned.teardown,
        "disks": planned.disks.iter().map(disk).collect::<Vec<_>>(),
    })
}
