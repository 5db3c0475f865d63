//! The one way a trainer submits requests, whichever thread drives the loop.
//!
//! [`Client`] is one type over two modes:
//!
//! - [`Handle`] (`Client<Threads>`): the loops run on threads of a [`Runtime`]; requests
//!   travel over single-producer rings, completions come back the same way.
//! - [`Embedded`] (`Client<Local>`): one loop run by the caller's own thread; waiting for
//!   a completion is what drives it.
//!
//! One type rather than a trait the two implement: the bookkeeping a caller relies on
//! (tags, lanes over `connections_per_peer`, completions kept until taken, backpressure,
//! recycled vectors, typed waits) is written once, so the two modes cannot drift apart, and
//! calling a request method needs no trait import. Code for both modes is generic over the
//! mode: `fn step<M: Mode>(client: &mut Client<M>)`.
//!
//! Every request method takes the peer as `impl Into<Peer>` (a [`SocketAddr`](std::net::SocketAddr) works) and
//! returns a [`Ticket`] typed by the request, or the [`Error`](crate::Error) that kept it from being
//! queued. [`Client::wait`] turns a ticket into the request's typed result: the tensors of
//! a pull, the round-trip time of a ping, the statuses of a push. [`Client::wait_any`] and
//! [`Client::poll`] hand out [`Completion`](crate::Completion)s, whose typed accessors
//! ([`Completion::into_pulled`](crate::Completion::into_pulled) and the like) do the same for the callback and
//! any-order paths. No wait drops another request's completion: it stays for a later
//! `wait`, `wait_any` or `poll`.
//!
//! [`Runtime`]: crate::Runtime

mod api;
mod local;
mod members;
mod metrics;
mod mode;
mod rows;
mod startup;
mod threads;
mod ticket;
mod trace;
mod wait_spin;

pub use api::Client;
pub use local::Local;
pub use mode::Mode;
pub use startup::Unreachable;
pub use threads::Threads;
pub use ticket::{Checkpoint, Kind, Ping, Pong, Pull, PullRows, Push, Recv, RemoteStats, Ticket};

/// The requests of a [`Runtime`](crate::Runtime)'s loop threads: a `Client` over
/// [`Threads`]. `Send`, not `Sync`: it may move to another thread; the loops wake the
/// thread that submitted its first request, so use it there once it has been used
/// (elsewhere its waits look every 100 µs instead of being woken).
pub type Handle = Client<Threads>;

/// A loop driven by the caller's own thread: a `Client` over [`Local`]. No loop threads,
/// no rings, no cross-thread hop; nothing runs unless the caller waits, polls or drives.
///
/// Like a [`Handle`], it spreads requests over `connections_per_peer` connections to each
/// peer (`STARWIRE_CONNECTIONS_PER_PEER`, default 1), opened as requests first need them;
/// here all of them belong to its one loop, so more than one helps a large transfer share
/// the network with small requests, not use more CPUs.
pub type Embedded = Client<Local>;
