//! starwire: a tensor transport for parameter-server training.
//!
//! A PS task answers pulls (variables by id) and pushes (gradients) through a [`Service`]
//! it implements; a worker sends them, and recvs of tensors another task publishes in its
//! [`Rendezvous`], through a [`Handle`]. Per-core event loops (io_uring, or epoll where
//! io_uring is unavailable) carry the requests over TCP, fused and zero-copy where they
//! can.
//!
//! # Quick start
//!
//! A PS and a worker in one process, on loopback:
//!
//! ```
//! use starwire::config::ConfigBuilder;
//! use starwire::Status;
//! use starwire::{Options, Runtime, Service, Tensor};
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//!
//! /// A PS shard: variables by id; a push adds its gradient to the variable.
//! #[derive(Default)]
//! struct Shard {
//!     vars: Mutex<HashMap<u64, Vec<f32>>>,
//! }
//!
//! impl Service for Shard {
//!     fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
//!         let vars = self.vars.lock().unwrap();
//!         for id in ids {
//!             out.push(match vars.get(id) {
//!                 Some(v) => Tensor::from_f32(&[v.len() as u64], v)
//!                     .map(Arc::new)
//!                     .map_err(|_| Status::Internal),
//!                 None => Err(Status::NotFound),
//!             });
//!         }
//!     }
//!
//!     fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
//!         let mut vars = self.vars.lock().unwrap();
//!         for (id, grad) in items.iter() {
//!             let grad = grad.to_f32();
//!             let v = vars.entry(*id).or_insert_with(|| vec![0.0; grad.len()]);
//!             v.iter_mut().zip(&grad).for_each(|(v, g)| *v += g);
//!             statuses.push(Status::Ok);
//!         }
//!     }
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // The PS: loops that listen, and answer with the service.
//!     let ps = Runtime::start_with(
//!         ConfigBuilder::from_env("ps", 0)?.build()?,
//!         Options {
//!             service: Some(Arc::new(Shard::default())),
//!             ..Options::listen("127.0.0.1:0".parse()?)
//!         },
//!     )?;
//!     let ps_addr = ps.local_addr().ok_or("the PS listens")?;
//!
//!     // A worker: one handle per trainer thread. Its report says what runs (backend,
//!     // loops) and what start-up changed (fewer loops than asked, a backend fallback).
//!     let worker = Runtime::start(ConfigBuilder::from_env("worker", 0)?.build()?, None)?;
//!     eprintln!("{}", worker.report());
//!     let mut h = worker.handle(64);
//!
//!     // A request gives a ticket; waiting on it gives the request's own result.
//!     let grad = Arc::new(Tensor::from_f32(&[2], &[0.5, -1.0])?);
//!     let ticket = h.push(ps_addr, vec![(7, grad)], None)?;
//!     let statuses: Vec<Status> = h.wait(ticket)?;
//!     assert_eq!(statuses, [Status::Ok]);
//!
//!     let ticket = h.pull(ps_addr, vec![7, 8], None)?;
//!     let pulled = h.wait(ticket)?; // per id: its tensor, or why there is none
//!     assert_eq!(pulled[0].as_ref().map(|t| t.to_f32()), Ok(vec![0.5, -1.0]));
//!     assert_eq!(pulled[1].as_ref().err(), Some(&Status::NotFound));
//!     Ok(())
//! }
//! ```
//!
//! A request fails as a whole with an [`Error`] (deadline, lost connection, a refusal);
//! each item of a pull, push or recv has its own [`Status`] besides. With
//! several requests in flight, wait on their tickets in any order, or take completions as
//! they come with [`Client::wait_any`] and read them with the typed accessors
//! ([`Completion::into_pulled`], [`Completion::pulled`], ...). No wait drops another
//! request's completion, and waiting on a request that is not outstanding is an error at
//! once. The `_slice` calls with [`Client::recycle`] allocate nothing in steady state.
//!
//! # Which mode
//!
//! - **[`Runtime`] + [`Handle`]** (the default): loop threads of their own, one per core
//!   given (see [`Config::loop_count`]), pinned if asked; any number of trainer threads,
//!   one `Handle` each, submit without locks. Use it for a PS, and for a worker with
//!   several trainer threads or many peers.
//! - **[`Embedded`]**: one loop run by the caller's own thread — no loop thread, no
//!   cross-thread hop, the lowest latency for a single-threaded trainer. Its waits drive
//!   the loop (spin, then park, by the `spin` and `polling` settings); a serving one runs
//!   with [`Embedded::run_until`](Client::run_until).
//!
//! Both are a [`Client`] with the same request methods, so code can serve both:
//!
//! ```
//! use starwire::client::Mode;
//! use starwire::config::ConfigBuilder;
//! use starwire::{Client, Embedded, Error, Runtime};
//! use std::net::SocketAddr;
//! use std::time::Duration;
//!
//! /// A round trip, whichever thread drives the loop.
//! fn round_trip<M: Mode>(c: &mut Client<M>, peer: SocketAddr) -> Result<Duration, Error> {
//!     let ticket = c.ping(peer, 64, None)?;
//!     c.wait(ticket)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = |job| ConfigBuilder::from_env(job, 0)?.build();
//! let ps = Runtime::start(config("ps")?, Some("127.0.0.1:0".parse()?))?;
//! let peer = ps.local_addr().ok_or("the PS listens")?;
//!
//! let worker = Runtime::start(config("worker")?, None)?;
//! round_trip(&mut worker.handle(8), peer)?;
//! // No loop thread: this thread's waits run the loop.
//! let mut embedded = Embedded::new(config("worker")?, None)?;
//! round_trip(&mut embedded, peer)?;
//! # Ok(())
//! # }
//! ```
//!
//! Handlers of a [`Service`] run **inline** on the loop that received the request (the
//! default, `handler_threads: 0`): no thread hop, right for short handlers (lookups, a
//! small add). Give them a **pool** ([`Options::handler_threads`] > 0) when one may take
//! long (a large optimizer step, I/O), so it does not hold up the other connections of its
//! loop. `docs/tuning.md` has the measurements.
//!
//! # Start-up
//!
//! [`Runtime::start`] and [`Embedded::new`](Client::new) fail with a [`StartError`] that
//! names what failed (the listen address, the backend, a loop's setup). What they started
//! (backend, loops) and what they did differently from what was asked (its
//! [`notes`](StartReport::notes), empty when nothing) is in [`Runtime::report`]: print it.
//!
//! # Layers
//!
//! Raw bytes, protocol state and syscalls never mix, and modules import one way:
//! `wire` (views and reprs of the wire format: the only code that touches the bytes of a
//! frame) <- `proto` (the sans-IO stream decoder and encoder) <- `session` (the sans-IO
//! protocol state of a loop: requests and their matching, fusion, serving, timers) <-
//! `event_loop` (I/O only) -> `sys` (syscalls and the `unsafe` that touches the kernel),
//! with [`client`] and the [`Runtime`] on top. `wire`, `proto`, `ctx` (the slab of request
//! contexts whose handle travels in frame headers) and `spsc` are public with the
//! `internals` feature, for fuzzing and tests; `README.md` shows the layout.
#![deny(unsafe_code)]
#![warn(missing_docs)]

/// Declares a module public with the `internals` feature (for the fuzz targets, the tests and
/// the tools; not a stable interface) and crate-private without it.
macro_rules! internal {
    (mod $name:ident;) => {
        #[cfg(feature = "internals")]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        #[allow(dead_code, unused_imports)]
        pub(crate) mod $name;
    };
}

pub mod client;
pub mod cluster;
pub mod config;
internal!(
    mod ctx;
);
mod error;
pub(crate) mod event_loop;
internal!(
    mod float;
);
mod hash;
mod panic;
mod pool;
mod upkeep;
internal!(
    mod proto;
);
pub mod rendezvous;
pub mod rows;
mod runtime;
pub mod service;
pub(crate) mod session;
internal!(
    mod spsc;
);
pub mod stats;
#[allow(dead_code)]
pub(crate) mod sys;
pub mod tensor;
internal!(
    mod wire;
);

pub use crate::session::{Callback, Completion, Reply};
pub use client::{Client, Embedded, Handle, Ticket};
pub use cluster::{ClusterChange, Peer, ResolveError, Resolver};
pub use config::{Config, ConfigBuilder, IoFeatures};
pub use error::{Error, ErrorKind, OsError};
pub use rendezvous::Rendezvous;
pub use rows::{Pipeline, PipelineReport, PipelineSettings, Sharded, StepReport};
pub use runtime::{Options, Runtime, StartError, StartNote, StartReport, DEFAULT_ZERO_COPY_MIN};
pub use service::{SaveError, SaveReport, Service, Table};
pub use stats::Stats;
pub use tensor::{HeapAllocator, Tensor, TensorAllocator, TensorDesc, TensorMemory};
pub use upkeep::{CHECKPOINT_FORMAT_VERSION, CHECKPOINT_MANIFEST};
pub use wire::{DType, Limits, LossScale, Status, WireFeatures};

/// The README's code, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
