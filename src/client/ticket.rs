//! Request kinds and tickets: what a queued request gives when it is waited for.

use std::marker::PhantomData;
use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::session::{Completion, Reply};
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

/// A ping: its result is the round-trip time. For the payload size the peer echoed too,
/// take the completion: `client.wait_tag(ticket.tag())?.pong()?` gives a [`Pong`].
#[derive(Debug)]
pub enum Ping {}

/// A ping's answer, from [`Completion::pong`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pong {
    /// The round-trip time, measured by the loop from the ping being queued on the
    /// connection to its pong being decoded.
    pub rtt: Duration,
    /// Payload bytes the peer echoed (the ping's own payload size, from a sound peer).
    pub payload: u32,
}
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

/// A checkpoint request: its result is the peer's manifest of what it saved (JSON).
#[derive(Debug)]
pub enum Checkpoint {}

impl sealed::Sealed for Checkpoint {}
impl Kind for Checkpoint {
    type Output = String;
    fn output(c: Completion) -> Result<String, Error> {
        c.into_checkpoint_manifest()
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

/// A queued request of kind `K`: give it to [`Client::wait`](super::Client::wait) for the typed result. Its
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

impl<K> std::fmt::Debug for Ticket<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ticket({})", self.tag)
    }
}

mod sealed {
    /// Marks the request kinds a [`Ticket`](super::Ticket) can name.
    pub trait Sealed {}
}

/// A copy of a completion's error for the lending accessors: an error that names its peer
/// and carries the remote message is not `Copy` (its message is shared, not copied).
fn owned(e: &Error) -> Error {
    e.clone()
}

/// Typed results of a finished request, for completions taken with
/// [`Client::wait_any`](super::Client::wait_any), [`Client::poll`](super::Client::poll), [`Client::wait_tag`](super::Client::wait_tag) or given to a
/// [`Callback`](crate::Callback). Each fails with the request's error, or with
/// [`ErrorKind::OtherKind`] when the completion is of another kind of request.
impl Completion {
    /// A pull's tensors: per id, in order, the tensor or why there is none.
    pub fn into_pulled(self) -> Result<Vec<Result<Tensor, Status>>, Error> {
        match self.result? {
            Reply::Pulled(items) => Ok(items),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A recv's tensors: per key, in order, the tensor (possibly dead) or why there is
    /// none.
    pub fn into_received(self) -> Result<Vec<Result<Tensor, Status>>, Error> {
        match self.result? {
            Reply::Received(items) => Ok(items),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A rows pull's blocks: per table, in order.
    pub fn into_rows(self) -> Result<crate::session::PulledRows, Error> {
        match self.result? {
            Reply::Rows(rows) => Ok(rows),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A rows pull's blocks, lent, as [`pulled`](Self::pulled).
    pub fn rows(&self) -> Result<&crate::session::PulledRows, Error> {
        match &self.result {
            Ok(Reply::Rows(rows)) => Ok(rows),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }

    /// A push's statuses: per item, in order, how the service took it.
    pub fn into_pushed(self) -> Result<Vec<Status>, Error> {
        match self.result? {
            Reply::Pushed(statuses) => Ok(statuses),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A ping's round-trip time, measured by the loop from the request being queued on
    /// the connection to the pong being decoded. [`pong`](Self::pong) gives the echoed
    /// payload size too.
    pub fn into_pong(self) -> Result<Duration, Error> {
        self.pong().map(|p| p.rtt)
    }

    /// A ping's answer: its round-trip time and the payload size the peer echoed. (A
    /// [`Pong`] is small: given by value, the completion stays whole, for
    /// [`Client::recycle`](super::Client::recycle).)
    pub fn pong(&self) -> Result<Pong, Error> {
        match &self.result {
            Ok(Reply::Pong { rtt, payload }) => Ok(Pong {
                rtt: *rtt,
                payload: *payload,
            }),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }

    /// A pull's tensors, lent: the completion can then go back through
    /// [`Client::recycle`](super::Client::recycle), so that a steady stream of pulls allocates nothing.
    pub fn pulled(&self) -> Result<&[Result<Tensor, Status>], Error> {
        match &self.result {
            Ok(Reply::Pulled(items)) => Ok(items),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }

    /// A recv's tensors, lent, as [`pulled`](Self::pulled).
    pub fn received(&self) -> Result<&[Result<Tensor, Status>], Error> {
        match &self.result {
            Ok(Reply::Received(items)) => Ok(items),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }

    /// A push's statuses, lent, as [`pulled`](Self::pulled).
    pub fn pushed(&self) -> Result<&[Status], Error> {
        match &self.result {
            Ok(Reply::Pushed(statuses)) => Ok(statuses),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }
}
