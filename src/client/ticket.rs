//! Request kinds and tickets: what a queued request gives when it is waited for.

use std::marker::PhantomData;
use std::time::Duration;

use super::{sealed, Client, Mode};
use crate::error::Error;
use crate::session::Completion;
use crate::tensor::Tensor;
use crate::wire::Status;

/// A request kind: [`Ping`], [`Pull`], [`Push`] or [`Recv`], with the result its
/// [`Ticket`] gives. Sealed.
pub trait Kind: sealed::Sealed {
    /// What a finished request of this kind gives.
    type Output;
    /// The typed result held by `completion`; [`ErrorKind::OtherKind`](crate::ErrorKind::OtherKind) when it is the
    /// completion of another kind of request.
    fn output(completion: Completion) -> Result<Self::Output, Error>;
}

/// A ping: its result is the round-trip time.
#[derive(Debug)]
pub enum Ping {}
/// A pull: its result is, per id and in order, the tensor or why there is none.
#[derive(Debug)]
pub enum Pull {}
/// A push: its result is, per item and in order, how the service took it.
#[derive(Debug)]
pub enum Push {}
/// A recv (one key or many): its result is, per key and in order, the tensor or why there
/// is none.
#[derive(Debug)]
pub enum Recv {}
/// A rows pull: its result is, per table and in order, its block of rows.
#[derive(Debug)]
pub enum PullRows {}

/// A stats request: its result is the peer's JSON document of counters and latencies.
#[derive(Debug)]
pub enum RemoteStats {}

impl sealed::Sealed for RemoteStats {}
impl Kind for RemoteStats {
    type Output = String;
    fn output(c: Completion) -> Result<String, Error> {
        c.into_stats_document()
    }
}

impl sealed::Sealed for PullRows {}
impl sealed::Sealed for Ping {}
impl sealed::Sealed for Pull {}
impl sealed::Sealed for Push {}
impl sealed::Sealed for Recv {}

impl Kind for Ping {
    type Output = Duration;
    fn output(c: Completion) -> Result<Duration, Error> {
        c.into_pong()
    }
}
impl Kind for Pull {
    type Output = Vec<Result<Tensor, Status>>;
    fn output(c: Completion) -> Result<Self::Output, Error> {
        c.into_pulled()
    }
}
impl Kind for Push {
    type Output = Vec<Status>;
    fn output(c: Completion) -> Result<Self::Output, Error> {
        c.into_pushed()
    }
}
impl Kind for PullRows {
    type Output = crate::session::PulledRows;
    fn output(c: Completion) -> Result<Self::Output, Error> {
        c.into_rows()
    }
}
impl Kind for Recv {
    type Output = Vec<Result<Tensor, Status>>;
    fn output(c: Completion) -> Result<Self::Output, Error> {
        c.into_received()
    }
}

/// A queued request of kind `K`: give it to [`Client::wait`] for the typed result. Its
/// [`tag`](Self::tag) is also carried by the request's [`Completion`].
#[must_use = "a request's result is only had by waiting on its ticket (or its tag)"]
pub struct Ticket<K> {
    pub(super) tag: u64,
    pub(super) kind: PhantomData<fn() -> K>,
}

impl<K> Ticket<K> {
    /// The tag the request's [`Completion`] carries.
    pub fn tag(&self) -> u64 {
        self.tag
    }
}

impl<K: Kind> Ticket<K> {
    /// [`client.wait(ticket)`](Client::wait), for a request and its wait in one line:
    /// `let pulled = h.pull(peer, ids, None)?.wait(&mut h)?;`.
    pub fn wait<M: Mode>(self, client: &mut Client<M>) -> Result<K::Output, Error> {
        client.wait(self)
    }
}

impl<K> std::fmt::Debug for Ticket<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ticket({})", self.tag)
    }
}
