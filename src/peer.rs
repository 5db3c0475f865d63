//! Where a request goes: a [`Peer`], made once from an address or a task name and reused
//! for every request at no cost.

use std::fmt;
use std::net::SocketAddr;

/// A resolved peer: the data address of a task. Cheap to copy; requests take
/// `impl Into<Peer>`, so a [`SocketAddr`] works too.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    addr: SocketAddr,
}

impl Peer {
    /// The peer listening at `addr`.
    pub fn new(addr: SocketAddr) -> Peer {
        Peer { addr }
    }

    /// Its data address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl From<SocketAddr> for Peer {
    fn from(addr: SocketAddr) -> Peer {
        Peer { addr }
    }
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Peer({})", self.addr)
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.addr)
    }
}
