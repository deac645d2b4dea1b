//! SIGTERM and SIGINT (CAPH or an operator stopping the writer) end the run as a passed
//! deadline does: the pipeline sees the stop flag where it checks the deadline, clears the
//! partition-table areas and reports `FAILED (interrupted)`. A second signal ends the process
//! at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use signal_hook::consts::{SIGINT, SIGTERM};

static STOP: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// Installs the handlers. The conditional exit is registered first, so it only fires when the
/// flag was already set by an earlier signal.
pub fn install() -> std::io::Result<()> {
    for sig in [SIGTERM, SIGINT] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, STOP.clone())?;
        signal_hook::flag::register(sig, STOP.clone())?;
    }
    Ok(())
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    STOP.load(Ordering::Relaxed)
}
