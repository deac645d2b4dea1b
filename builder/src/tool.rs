//! Running an outside tool (openssl, efitools, objcopy, sbsign): one error type that names the
//! tool, and the package to install when it is missing.

use std::process::{Command, ExitStatus, Stdio};

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
    output(tool, package, cmd).map(drop)
}

/// Runs `cmd` as [`run`] does, with no input, and returns what it printed on stdout.
pub fn output(
    tool: &'static str,
    package: &'static str,
    cmd: &mut Command,
) -> Result<Vec<u8>, ToolError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ToolError::Spawn {
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
    Ok(out.stdout)
}
