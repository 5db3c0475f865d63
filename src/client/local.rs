//! The mode of an [`Embedded`](super::Embedded) client: one loop, run by the caller's own
//! thread.

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::event_loop::{Loop, LoopShared};
use crate::runtime::{self, Options, StartError, StartReport};
use crate::session::{Budget, Completion};
use crate::stats::Stats;
use crate::sys::{socket, Backend};

use super::api::{Client, LOCAL_SPARES_KEPT};
use super::mode::sealed::{Drive, Outgoing};
use super::mode::Mode;
use super::wait_spin::WaitSpin;

/// Longest an [`Embedded`](crate::Embedded) loop parks in the kernel at once, so that a condition of
/// [`Client::run_until`] set by another thread is seen soon.
const LOCAL_PARK_MAX: Duration = Duration::from_millis(10);

/// The mode of a [`Embedded`](crate::Embedded) client: one loop, run by the caller's thread.
pub struct Local {
    pub(super) lp: Loop,
    pub(super) shared: Arc<LoopShared>,
    pub(super) cfg: Arc<Config>,
    pub(super) report: StartReport,
    pub(super) budget: Arc<Budget>,
    /// Addresses of tasks that moved or left the cluster (`update_cluster`).
    pub(super) retired: crate::cluster::Retirements,
    /// How long its waits spin before they park (see [`WaitSpin`]).
    pub(super) spin: WaitSpin,
    /// A wait is under way and has not parked yet: it spins the [`WaitSpin`] budget; after
    /// a park, and outside waits (a loop that serves), the spin setting.
    pub(super) fresh_wait: bool,
    /// The served tables' upkeep and checkpoints, when the service serves tables.
    pub(super) _upkeep: Option<crate::upkeep::Upkeep>,
}

impl Drive for Local {
    fn send(&mut self, req: Outgoing) -> Result<(), Outgoing> {
        self.lp.submit_local(req.0);
        Ok(())
    }

    fn next(&mut self) -> Option<Completion> {
        self.lp.take_local()
    }

    fn turn(&mut self) {
        self.lp.poll_local(Some(Duration::ZERO));
    }

    fn idle(&mut self, idle_since: &mut Instant) {
        // As the loop threads run themselves: busy-poll when polling, else spin for the
        // spin budget while nothing happens, then park in the kernel. A wait that has not
        // parked yet spins as long as this client's waits have been taking.
        if self.lp.poll_local(Some(Duration::ZERO)) {
            *idle_since = Instant::now();
            return;
        }
        let budget = if self.fresh_wait {
            self.spin.budget(self.cfg.spin)
        } else {
            self.cfg.spin
        };
        if self.cfg.polling || idle_since.elapsed() < budget {
            core::hint::spin_loop();
            return;
        }
        self.fresh_wait = false;
        self.lp.poll_local(Some(LOCAL_PARK_MAX));
        *idle_since = Instant::now();
    }

    fn wait_begins(&mut self) {
        self.fresh_wait = true;
    }

    fn waited(&mut self, took: Duration) {
        self.fresh_wait = false;
        self.spin.observe(took);
    }

    fn stopped(&self) -> bool {
        false
    }
}

impl Client<Local> {
    /// A loop for the calling thread, listening on `listen` if given. Nothing runs until
    /// the caller waits, polls or drives it.
    pub fn new(config: Config, listen: Option<SocketAddr>) -> Result<Client<Local>, StartError> {
        Self::with_options(
            config,
            Options {
                listen,
                ..Options::default()
            },
        )
    }

    /// A loop for the calling thread with a service, an allocator, or other [`Options`].
    pub fn with_options(config: Config, options: Options) -> Result<Client<Local>, StartError> {
        let (backend, fallback) = runtime::select_backend(&config)?;
        let listener = match options.listen {
            Some(addr) => Some(
                socket::listen_tcp_exclusive(addr, runtime::BACKLOG, false)
                    .map_err(|source| StartError::Listen { addr, source })?,
            ),
            None => None,
        };
        let loop_err = |source| StartError::Loop { index: 0, source };
        let shared = Arc::new(LoopShared::new().map_err(loop_err)?);
        if let Some(r) = &options.rendezvous {
            r.attach(vec![shared.clone()]);
        }
        let cfg = Arc::new(config);
        let budget = Budget::of(&cfg);
        let (upkeep, checkpoints) =
            runtime::start_upkeep(&cfg, &options, std::slice::from_ref(&shared))?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let lp = Loop::new(
            cfg.clone(),
            shared.clone(),
            backend,
            listener,
            options.parts(&cfg, 0, None, checkpoints, &accepted, &budget),
        )
        .map_err(loop_err)?;
        // The fallback was logged where it was decided.
        let report = StartReport::new(backend, 1, fallback)
            .with_features(lp.io_features())
            .with_tables(options.service.as_deref().map(runtime::table_reports));
        let local = Local {
            lp,
            shared,
            cfg: cfg.clone(),
            report,
            budget,
            retired: Default::default(),
            spin: WaitSpin::default(),
            fresh_wait: false,
            _upkeep: upkeep,
        };
        Ok(Client::with_mode(
            local,
            &cfg,
            usize::MAX,
            false,
            LOCAL_SPARES_KEPT,
        ))
    }

    /// The address this loop listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.mode.lp.local_addr()
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.mode.lp.backend()
    }

    /// What start-up chose: the backend and the kernel features in use, and in its
    /// [`notes`](StartReport::notes) what it did differently from what was asked (a
    /// backend fallback), empty when nothing. `Display` prints a line of what runs, then
    /// one per note, as [`Runtime::report`](crate::Runtime::report).
    pub fn report(&self) -> &StartReport {
        &self.mode.report
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.mode.cfg
    }

    /// Runs the loop once: everything ready now, or, when nothing is, waits up to `timeout`
    /// for I/O or a timer (`None`: no limit). Returns whether anything happened. Waits
    /// drive the loop themselves; this is for a loop that serves, or several loops on one
    /// thread.
    pub fn drive(&mut self, timeout: Option<Duration>) -> bool {
        self.mode.lp.poll_local(timeout)
    }

    /// Runs the loop — spinning, then parking, as the configured spin and polling settings
    /// say — until `stop` returns true; `stop` is asked after every step (at least every
    /// few milliseconds). For a loop that serves: `run_until(|_| flag.load(..))`.
    pub fn run_until(&mut self, mut stop: impl FnMut(&mut Client<Local>) -> bool) {
        // Not a wait: the spin setting, whatever this client's waits have been taking.
        self.mode.fresh_wait = false;
        let mut idle_since = Instant::now();
        while !stop(self) {
            Drive::idle(&mut self.mode, &mut idle_since);
        }
    }

    /// This loop's counters.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        s.add_loop(&self.mode.shared.counters);
        s.add_budget(self.mode.budget.used(), self.mode.budget.refused());
        s
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.lp.stop_local();
    }
}

impl Mode for Local {}
