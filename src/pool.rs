//! A pool of threads for heavy service handlers.
//!
//! Inline handlers run on the loop that received the request: no hop, but a slow handler
//! stalls every other connection of that loop. With a pool, the loop hands the request to a
//! pool thread and goes on; the answer comes back through the loop's delivery queue and the
//! loop sends it. Use the pool when a handler does real work (an optimizer step over large
//! tensors, a lookup that may block); keep handlers inline when they take microseconds.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::service::SharedService;
use crate::tensor::Tensor;
use crate::wire::Status;

/// Jobs waiting for a handler thread, at most.
const QUEUE: usize = 4096;

/// Where an answer goes: loop, connection (slot and generation), request handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplyTo {
    pub loop_index: usize,
    pub conn: u32,
    pub generation: u32,
    pub handle: u64,
}

/// Work for a pool thread.
pub(crate) enum Job {
    Pull {
        to: ReplyTo,
        ids: Vec<u64>,
    },
    /// Received items (variable ids, and per item its tensor or the status of its failure
    /// to arrive).
    Push {
        to: ReplyTo,
        ids: Vec<u64>,
        results: Vec<Result<Tensor, Status>>,
    },
}

/// A handler's answer, on its way back to the loop.
pub(crate) enum Answer {
    Pull {
        to: ReplyTo,
        results: Vec<Result<Arc<Tensor>, Status>>,
    },
    Push {
        to: ReplyTo,
        statuses: Vec<Status>,
    },
}

/// Where handler threads hand answers back: the loop that serves the connection.
pub(crate) trait AnswerSink: Send + Sync {
    /// Hands `answer` to the loop and wakes it.
    fn post_answer(&self, answer: Answer);
}

/// The handler threads.
pub(crate) struct HandlerPool {
    jobs: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl HandlerPool {
    /// `n` threads running `service`, answering through `loops`.
    pub(crate) fn start<S: AnswerSink + 'static>(
        n: usize,
        service: SharedService,
        loops: Vec<Arc<S>>,
    ) -> std::io::Result<HandlerPool> {
        let loops: Vec<Arc<dyn AnswerSink>> = loops
            .into_iter()
            .map(|l| l as Arc<dyn AnswerSink>)
            .collect();
        // Bounded: when handlers fall behind, requests are refused (RESOURCE_EXHAUSTED)
        // instead of queueing without limit.
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx = rx.clone();
            let service = service.clone();
            let loops = loops.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("starwire-handler-{i}"))
                    .spawn(move || work(&rx, &*service, &loops))?,
            );
        }
        Ok(HandlerPool {
            jobs: Some(tx),
            threads,
        })
    }

    /// A sender for the loops.
    pub(crate) fn sender(&self) -> Option<SyncSender<Job>> {
        self.jobs.clone()
    }

    /// Stops the threads once the queued jobs are done.
    pub(crate) fn stop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("a starwire handler thread panicked");
            }
        }
    }
}

impl Drop for HandlerPool {
    fn drop(&mut self) {
        self.stop();
    }
}

fn work(
    rx: &Mutex<Receiver<Job>>,
    service: &dyn crate::service::Service,
    loops: &[Arc<dyn AnswerSink>],
) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(job) = job else {
            return; // every sender is gone: the runtime stopped
        };
        let answer = run(job, service);
        let to = match &answer {
            Answer::Pull { to, .. } | Answer::Push { to, .. } => *to,
        };
        match loops.get(to.loop_index) {
            Some(l) => l.post_answer(answer),
            None => log::error!("handler pool: no loop {}", to.loop_index),
        }
    }
}

/// Runs one job against the service.
pub(crate) fn run(job: Job, service: &dyn crate::service::Service) -> Answer {
    match job {
        Job::Pull { to, ids } => {
            let mut results = Vec::with_capacity(ids.len());
            crate::service::pull(service, &ids, &mut results);
            Answer::Pull { to, results }
        }
        Job::Push {
            to,
            ids,
            mut results,
        } => {
            let mut statuses = Vec::new();
            let scratch = &mut PushScratch::default();
            apply_push(service, &ids, &mut results, &mut statuses, scratch);
            Answer::Push { to, statuses }
        }
    }
}

/// Vectors a push is applied with, kept between pushes so that applying one allocates
/// nothing.
#[derive(Default)]
pub(crate) struct PushScratch {
    ok: Vec<(u64, Tensor)>,
    positions: Vec<usize>,
    got: Vec<Status>,
}

/// Hands the items that arrived (variable `ids[i]`, `results[i]`) to the service; items
/// that failed keep their status. One status per item goes into `statuses` (emptied
/// first); `results` is left empty.
pub(crate) fn apply_push(
    service: &dyn crate::service::Service,
    ids: &[u64],
    results: &mut Vec<Result<Tensor, Status>>,
    statuses: &mut Vec<Status>,
    scratch: &mut PushScratch,
) {
    let PushScratch { ok, positions, got } = scratch;
    statuses.clear();
    statuses.resize(results.len(), Status::Ok);
    ok.clear();
    positions.clear();
    got.clear();
    for (pos, (&id, item)) in ids.iter().zip(results.drain(..)).enumerate() {
        match item {
            Ok(t) => {
                ok.push((id, t));
                positions.push(pos);
            }
            Err(s) => statuses[pos] = s,
        }
    }
    if !ok.is_empty() {
        if crate::panic::guarded("Service::push", || service.push(ok, got)).is_none() {
            got.clear();
        }
        for (k, &pos) in positions.iter().enumerate() {
            statuses[pos] = got.get(k).copied().unwrap_or(Status::Internal);
        }
    }
    ok.clear();
}
