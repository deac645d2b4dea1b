//! [`MachineArgs`]: the command-line flags that describe a machine to the layer rules, one set
//! for every command that takes them (`ingot inspect`, `ingot-writer --target`). A command may
//! narrow them (`requires`, its own help) with clap's `mut_arg`; the names and meanings stay.

use clap::Args;

use crate::select::{GpuVendor, Machine, Role};

/// The machine a layer rule is evaluated against.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineArgs {
    /// The machine's role.
    #[arg(long, value_name = "ROLE")]
    pub role: Option<Role>,
    /// A GPU vendor the machine has (repeatable): nvidia.
    #[arg(long, value_name = "VENDOR")]
    pub gpu: Vec<GpuVendor>,
    /// The machine has hardware virtualization.
    #[arg(long)]
    pub virt: bool,
    /// The machine boots with UEFI firmware.
    #[arg(long)]
    pub uefi: bool,
}

impl MachineArgs {
    /// The machine these flags describe, of `default_role` when `--role` is not given.
    pub fn to_machine(&self, default_role: Role) -> Machine {
        Machine {
            role: self.role.unwrap_or(default_role),
            gpus: self.gpu.clone(),
            virt: self.virt,
            uefi: self.uefi,
        }
    }

    /// The machine these flags describe, when `--role` names one.
    pub fn given(&self) -> Option<Machine> {
        self.role.map(|role| self.to_machine(role))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        machine: MachineArgs,
    }

    #[test]
    fn flags_become_the_machine() {
        let cmd = Cmd::try_parse_from([
            "x",
            "--role",
            "control-plane",
            "--gpu",
            "nvidia",
            "--virt",
            "--uefi",
        ])
        .unwrap();
        let m = cmd.machine.given().unwrap();
        assert_eq!(m.role, Role::ControlPlane);
        assert_eq!(m.gpus, vec![GpuVendor::Nvidia]);
        assert!(m.virt && m.uefi);
        let none = Cmd::try_parse_from(["x"]).unwrap().machine;
        assert_eq!(none.given(), None);
        assert_eq!(none.to_machine(Role::Worker), Machine::new(Role::Worker));
        let bad = Cmd::try_parse_from(["x", "--gpu", "voodoo"]).err().unwrap();
        assert!(bad.to_string().contains("voodoo"), "{bad}");
    }
}
