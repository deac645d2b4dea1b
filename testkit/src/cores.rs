//! The host's cores, handed out to TCG guests, first come first served, within one test process.
//!
//! A TCG vCPU keeps one host core busy. More guests than cores do not finish sooner in sum; they
//! only slow every one of them down: seven Debian guests on two cores stalled their kernels for
//! tens of seconds (soft lockups, RCU stalls) and one of them ran past its 40-minute limit, which
//! then measured the load and not the boot. A guest holds as many cores as it has vCPUs (at most
//! all of them) from its start to its end, so a boot's time limit counts from when it runs.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Pool {
    total: usize,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    free: usize,
    /// Tickets of the waiters, oldest first: the oldest is served first, so a guest that wants
    /// two cores is not passed over forever by guests that want one.
    queue: VecDeque<u64>,
    next: u64,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let total = std::thread::available_parallelism().map_or(1, |n| n.get());
        Pool {
            total,
            state: Mutex::new(State {
                free: total,
                queue: VecDeque::new(),
                next: 0,
            }),
            changed: Condvar::new(),
        }
    })
}

/// Cores held by one guest; given back on drop.
#[must_use = "the cores are given back when this is dropped"]
pub struct Held {
    cores: usize,
    /// How long the guest waited for them.
    pub waited: Duration,
}

impl Drop for Held {
    fn drop(&mut self) {
        let p = pool();
        p.state.lock().unwrap_or_else(|e| e.into_inner()).free += self.cores;
        p.changed.notify_all();
    }
}

/// Waits until `vcpus` cores (at least one, at most all the host has) are free and every earlier
/// caller has been served; holds them until the returned value is dropped.
pub fn hold(vcpus: usize) -> Held {
    let p = pool();
    let cores = vcpus.clamp(1, p.total);
    let since = Instant::now();
    // A panicking holder still gives its cores back (Drop); its poisoned lock is still sound.
    let mut s = p.state.lock().unwrap_or_else(|e| e.into_inner());
    let ticket = s.next;
    s.next += 1;
    s.queue.push_back(ticket);
    while s.queue.front() != Some(&ticket) || s.free < cores {
        s = p.changed.wait(s).unwrap_or_else(|e| e.into_inner());
    }
    s.queue.pop_front();
    s.free -= cores;
    drop(s);
    // The next in line may fit in what is left.
    p.changed.notify_all();
    Held {
        cores,
        waited: since.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn never_more_cores_held_than_the_host_has() {
        let total = pool().total;
        let busy = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for i in 0..3 * total + 2 {
                let (busy, peak) = (busy.clone(), peak.clone());
                s.spawn(move || {
                    let want = 1 + i % 2;
                    let held = hold(want);
                    let n = busy.fetch_add(held.cores, Ordering::SeqCst) + held.cores;
                    peak.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    busy.fetch_sub(held.cores, Ordering::SeqCst);
                });
            }
        });
        assert!(peak.load(Ordering::SeqCst) <= total);
        assert!(peak.load(Ordering::SeqCst) >= 1);
    }

    #[test]
    fn more_than_the_host_has_is_all_of_it() {
        let held = hold(usize::MAX);
        assert_eq!(held.cores, pool().total);
    }
}
