//! The last resort against a run that does not stop: a write stuck in the kernel must not hold
//! the provisioner forever.

use std::time::{Duration, Instant};

/// After `deadline` and a grace period for the run to stop on its own (it checks the deadline
/// between writes), calls `on_expiry` and exits with status 1. The partition table is written
/// last, so a run stopped here has none.
pub fn start(deadline: Instant, on_expiry: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let grace = Duration::from_secs(60);
        std::thread::sleep((deadline + grace).saturating_duration_since(Instant::now()));
        on_expiry();
        std::process::exit(1);
    });
}
