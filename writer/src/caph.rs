//! CAPH's `imageURLCommand` contract, as the writer keeps it: the last stdout line says
//! `IMAGE_URL_DONE` on success and never otherwise; `/root/output.json`'s `message` says what is
//! happening (CAPH shows it) and its `status` how it ended; the exit status is non-zero on
//! failure; CAPH reboots the machine, the writer only when asked to.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::pipeline::{self, Failed};
use crate::reason::FailureReason;
use crate::report::{DiskState, Reporter};
use crate::request::ProvisionRequest;
use crate::steps;

/// The status file CAPH reads when `--report` does not name another.
pub const OUTPUT_JSON: &str = "/root/output.json";

/// After success: reboot, or not.
pub struct Reboot {
    pub enabled: bool,
    pub delay: u64,
}

/// Runs a provisioning request and answers as CAPH expects.
pub fn provision(
    req: &ProvisionRequest,
    reporter: &Reporter,
    deadline: Instant,
    grace: Duration,
    reboot: &Reboot,
) -> Result<ExitCode> {
    crate::watchdog::start(deadline, grace, || {
        println!("ingot-writer: FAILED (deadline): the run did not stop after its deadline");
    });
    match pipeline::provision(req, reporter) {
        Ok(done) => {
            let msg = steps::finish::provisioned(&done, reporter);
            if reboot.enabled {
                crate::reboot::schedule(req.host.as_ref(), reboot.delay)
                    .context("starting the delayed reboot")?;
                println!("rebooting in {} s", reboot.delay);
            }
            println!("IMAGE_URL_DONE {msg}");
            Ok(ExitCode::SUCCESS)
        }
        Err(Failed { error, disks }) => {
            let reason = error.reason();
            let text = format!("{:#}", anyhow::Error::new(*error));
            reporter.failed(&format!("{reason}: {text}"), disks);
            eprintln!("ingot-writer: error: {text}");
            println!("{}", failed_line(reason, &text, disks.describe()));
            Ok(ExitCode::from(reason.exit_code()))
        }
    }
}

/// A provisioning dry run: the plan on stdout and a last line that never says `IMAGE_URL_DONE`
/// (nothing was written); exit 0 when a real run would go on to write.
pub fn dry_run(
    req: &ProvisionRequest,
    reporter: &Reporter,
    deadline: Instant,
    grace: Duration,
) -> ExitCode {
    crate::watchdog::start(deadline, grace, || {
        println!("ingot-writer: FAILED (deadline): the dry run did not stop after its deadline");
    });
    match pipeline::provision_dry_run(req, reporter) {
        Ok(planned) => {
            let text = steps::finish::planned(&planned, reporter);
            println!("{}", text.replace("IMAGE_URL_DONE", "IMAGE_URL_[DONE]"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            let reason = e.reason();
            let text = format!("{:#}", anyhow::Error::new(e));
            reporter.failed(&format!("{reason}: {text}"), DiskState::Untouched);
            eprintln!("ingot-writer: error: {text}");
            println!(
                "{}",
                failed_line(reason, &text, "dry run: no disk was changed")
            );
            ExitCode::from(reason.exit_code())
        }
    }
}

/// The last stdout line of a failed run: never `IMAGE_URL_DONE`, whatever the message holds.
fn failed_line(reason: FailureReason, text: &str, state: &str) -> String {
    format!("ingot-writer: FAILED ({reason}): {text}; {state}")
        .replace("IMAGE_URL_DONE", "IMAGE_URL_[DONE]")
}
