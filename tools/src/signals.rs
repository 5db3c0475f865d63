//! SIGINT and SIGTERM, through signal-hook.
//!
//! [`take`] installs signal-hook's handlers first thing in a command, so that from then on
//! the two signals no longer end the process but are queued for [`wait`] or a [`Watcher`].
//! A signal can land on any thread, the event loops too; their blocking calls treat the
//! interruption (EINTR) as a wake-up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::Thread;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::exit::Failure;

/// Takes SIGINT and SIGTERM over from their default action (ending the process).
pub fn take() -> Result<Signals, Failure> {
    Signals::new([SIGINT, SIGTERM])
        .map_err(|e| Failure::usage(format!("cannot handle SIGINT/SIGTERM: {e}")))
}

/// Waits for SIGINT or SIGTERM; returns its name.
pub fn wait(signals: &mut Signals) -> &'static str {
    let sig = signals.forever().next();
    sig.and_then(signal_hook::low_level::signal_name)
        .unwrap_or("a signal")
}

/// A thread that takes SIGINT/SIGTERM: the first sets a flag and unparks a thread, the
/// second ends the process (exit status 130), for a command stuck in a wait.
pub struct Watcher {
    stop: Arc<AtomicBool>,
}

impl Watcher {
    /// Starts the watcher over the signals [`take`] took; `main` is unparked on the first.
    pub fn start(mut signals: Signals, main: Thread) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("commctl-signals".into())
            .spawn(move || {
                wait(&mut signals);
                flag.store(true, Ordering::SeqCst);
                main.unpark();
                wait(&mut signals);
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
