//! The request trace through the client layer: a runtime's or an embedded loop's trace
//! written as a Chrome trace file, and the step ids of sharded steps.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Client, Local, Mode};
use crate::config::Config;
use crate::stats::trace::{chrome_json, LoopTrace, TraceInput};

/// How long a dump waits for a loop to hand its records over (a loop answers on its next
/// turn; a parked one is woken).
const HAND_OVER_PATIENCE: Duration = Duration::from_secs(2);

/// Source of sharded step ids (0 is "no step"), unique in the process.
static NEXT_STEP: AtomicU64 = AtomicU64::new(1);

/// The trace document of `loops` for the task of `cfg`.
fn document(cfg: &Config, loops: &[LoopTrace], missing_loops: usize) -> String {
    let task = format!("{}:{}", cfg.job, cfg.task_index);
    chrome_json(&TraceInput {
        task: &task,
        loops,
        missing_loops,
    })
}

fn off() -> std::io::Error {
    std::io::Error::other(
        "the request trace is off (STARWIRE_TRACE=1 or ConfigBuilder::trace(true))",
    )
}

impl crate::Runtime {
    /// The request trace as a Chrome trace document (JSON for Perfetto or
    /// `chrome://tracing`; `docs/deploying.md` says how to read it): the requests every
    /// loop recorded since the last dump, which this one takes (each loop starts again
    /// empty). Each loop hands its records over on its next turn; the loops' request path
    /// takes no lock for it. With tracing off: a document without requests.
    pub fn trace_json(&self) -> String {
        let inner = self.inner();
        let mut loops = Vec::new();
        let mut missing = 0;
        if inner.cfg.trace {
            for l in &inner.loops {
                match l.counters.trace.collect(HAND_OVER_PATIENCE, || l.wake()) {
                    Some(t) => loops.push(t),
                    None => missing += 1,
                }
            }
        }
        document(&inner.cfg, &loops, missing)
    }

    /// Writes [`trace_json`](Self::trace_json) to `path`. With tracing off: an error,
    /// and no file.
    pub fn write_trace(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        if !self.config().trace {
            return Err(off());
        }
        std::fs::write(path, self.trace_json())
    }
}

impl Client<Local> {
    /// This loop's request trace, as [`Runtime::trace_json`](crate::Runtime::trace_json).
    pub fn trace_json(&mut self) -> String {
        let mut loops = Vec::new();
        if self.mode.cfg.trace {
            let shared = &self.mode.shared.counters.trace;
            shared.ask();
            // The turn hands the records over.
            self.mode.lp.poll_local(Some(Duration::ZERO));
            loops.extend(shared.take());
        }
        let missing = usize::from(self.mode.cfg.trace && loops.is_empty());
        document(&self.mode.cfg, &loops, missing)
    }

    /// Writes [`trace_json`](Self::trace_json) to `path`, as
    /// [`Runtime::write_trace`](crate::Runtime::write_trace).
    pub fn write_trace(&mut self, path: impl AsRef<Path>) -> std::io::Result<()> {
        if !self.mode.cfg.trace {
            return Err(off());
        }
        std::fs::write(path, self.trace_json())
    }
}

impl<M: Mode> Client<M> {
    /// Starts a sharded step: the requests submitted until [`end_step`](Self::end_step)
    /// are its parts in the trace. Nothing when tracing is off.
    #[inline]
    pub(crate) fn begin_step(&mut self) {
        if self.trace {
            self.trace_step = NEXT_STEP.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ends the step [`begin_step`](Self::begin_step) started.
    #[inline]
    pub(crate) fn end_step(&mut self) {
        self.trace_step = 0;
    }
}
