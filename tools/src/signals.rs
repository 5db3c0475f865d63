//! SIGINT and SIGTERM, taken synchronously.
//!
//! [`block`] blocks both in the calling thread before any other thread exists, so every
//! thread started later (the event loops too) inherits the mask and none is interrupted;
//! the signals then wait to be taken with [`wait`] or by a [`Watcher`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::Thread;

use nix::sys::signal::{SigSet, Signal};

use crate::exit::Failure;

fn set() -> SigSet {
    let mut s = SigSet::empty();
    s.add(Signal::SIGINT);
    s.add(Signal::SIGTERM);
    s
}

/// Blocks SIGINT and SIGTERM in the calling thread (and the threads it starts later).
pub fn block() -> Result<(), Failure> {
    set()
        .thread_block()
        .map_err(|e| Failure::usage(format!("cannot block SIGINT/SIGTERM: {e}")))
}

/// Waits for SIGINT or SIGTERM; returns its name.
pub fn wait() -> &'static str {
    match set().wait() {
        Ok(sig) => sig.as_str(),
        Err(_) => "a signal",
    }
}

/// A thread that takes SIGINT/SIGTERM: the first sets a flag and unparks a thread, the
/// second ends the process (exit status 130), for a command stuck in a wait.
pub struct Watcher {
    stop: Arc<AtomicBool>,
}

impl Watcher {
    /// Starts the watcher; `main` is unparked on the first signal. Call [`block`] first.
    pub fn start(main: Thread) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("commctl-signals".into())
            .spawn(move || {
                wait();
                flag.store(true, Ordering::SeqCst);
                main.unpark();
                wait();
                std::process::exit(130);
            });
        if let Err(e) = spawned {
            log::warn!("no signal thread ({e}); Ctrl-C will not print a summary");
        }
        Watcher { stop }
    }

    /// Whether a signal arrived.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}
