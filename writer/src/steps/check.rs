//! `check`: reads the machine (below the sysroot) and the bootstrap data, and decides the role
//! and what the layer rules see of this machine.
//!
//! Reads the sysroot, the bootstrap data file, the machine name and a role override; returns
//! [`Checked`]: the machine's facts, the parsed bootstrap data, the role and the [`Machine`].

use std::path::Path;

use ingot_bootstrap::Bootstrap;
use ingot_layers::select::{GpuVendor, Machine, Role};
use ingot_machine::{Facts, Sysroot};

use std::path::PathBuf;

use crate::report::{Reporter, Stage};

/// Why the machine or the bootstrap data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("reading the machine")]
    Machine(#[from] ingot_machine::MachineError),
    #[error("{path}: reading the bootstrap data")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the bootstrap data {path}")]
    Bootstrap {
        path: PathBuf,
        #[source]
        source: ingot_bootstrap::ParseError,
    },
}

/// The machine and the bootstrap data, read and checked.
pub struct Checked {
    pub facts: Facts,
    pub bootstrap: Bootstrap,
    pub role: Role,
    pub machine: Machine,
}

pub fn run(
    sysroot: &Sysroot,
    bootstrap_path: &Path,
    machine_name: &str,
    role: Option<Role>,
    reporter: &Reporter,
) -> Result<Checked, CheckError> {
    reporter.stage(
        Stage::Check,
        format!(
            "reading the machine ({}) and the bootstrap data",
            sysroot.root().display()
        ),
    );
    let facts = ingot_machine::detect(sysroot)?;
    reporter.detail("machine", &facts);
    // A regular file only, read to its limit and no further (`/dev/zero` or a FIFO is refused).
    let raw = ingot_verity::input::read_bounded(
        bootstrap_path,
        ingot_bootstrap::MAX_INPUT_SIZE as u64,
        ingot_verity::input::Symlinks::Follow,
    )
    .map_err(|source| CheckError::Read {
        path: bootstrap_path.to_path_buf(),
        source,
    })?;
    let bootstrap = ingot_bootstrap::parse(&raw).map_err(|source| CheckError::Bootstrap {
        path: bootstrap_path.to_path_buf(),
        source,
    })?;
    drop(raw);
    let role = role.unwrap_or(bootstrap.role());
    let machine = machine_of(&facts, role);
    reporter.detail("selection", &machine);
    reporter.stage(
        Stage::Check,
        format!(
            "{machine_name}: {} (bootstrap data: {}), GPU: {}, virtualization: {}, UEFI: {}, \
             TPM: {}",
            role.as_str(),
            match bootstrap.format {
                ingot_bootstrap::Format::Ignition { .. } => "Ignition",
                _ => "cloud-config",
            },
            if facts.nvidia_gpu { "nvidia" } else { "none" },
            facts.virtualization,
            facts.uefi,
            facts.tpm.map_or("none".to_string(), |v| format!("{v}.0"))
        ),
    );
    Ok(Checked {
        facts,
        bootstrap,
        role,
        machine,
    })
}

/// What the layer rules see of this machine.
fn machine_of(facts: &Facts, role: Role) -> Machine {
    let mut m = Machine::new(role);
    if facts.nvidia_gpu {
        m.gpus.push(GpuVendor::Nvidia);
    }
    m.virt = facts.virtualization;
    m.uefi = facts.uefi;
    m
}
