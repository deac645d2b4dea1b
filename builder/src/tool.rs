//! Running an outside tool (openssl, efitools, objcopy, sbsign): one error type that names the
//! tool, and the package to install when it is missing.

use std::process::{Command, ExitStatus};

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("running {tool} (is {package} installed?)")]
    Spawn {
        tool: &'static str,
        package: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} failed ({status}): {stderr}")]
    Failed {
        tool: &'static str,
        status: ExitStatus,
        stderr: String,
    },
}

/// Runs `cmd` (the program `tool`, from `package`) to its end; a failure carries its stderr.
pub fn run(tool: &'static str, package: &'static str, cmd: &mut Command) -> Result<(), ToolError> {
    let out = cmd.output().map_err(|source| ToolError::Spawn {
        tool,
        package,
        source,
    })?;
    if !out.status.success() {
        return Err(ToolError::Failed {
            tool,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}
