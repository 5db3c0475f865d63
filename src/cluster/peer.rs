//! [`Peer`]: where a request goes, and the task it is, when known. Task names are kept
//! once each for the life of the process, so that a peer stays `Copy` and naming it costs
//! a request nothing.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

use super::spec::TaskId;

/// A resolved peer: the data address of a task, and the task's name (`ps:1`) when it was
/// resolved from one (or from an address the cluster has a task at). Cheap to copy;
/// requests take `impl Into<Peer>`, so a [`SocketAddr`] works too. Made by a
/// [`Resolver`](super::Resolver), or from an address.
///
/// Requests to a named peer name it in their errors and in the metrics before any
/// handshake has: `could not connect to ps:1 (10.0.0.2:5555) ...` rather than the address
/// alone. Two peers are equal when their addresses are: the name is a label, the address
/// is where requests go. `Display` is the address.
#[derive(Clone, Copy)]
pub struct Peer {
    addr: SocketAddr,
    /// `job:index`, one shared copy per name.
    task: Option<&'static str>,
}

impl Peer {
    /// The peer listening at `addr`.
    pub fn new(addr: SocketAddr) -> Peer {
        Peer { addr, task: None }
    }

    /// The same peer, named as task `task`. Each name is kept once for the life of the
    /// process (a peer stays `Copy`): name tasks, not one-off strings.
    pub fn with_task(self, task: &TaskId) -> Peer {
        Peer {
            task: Some(intern(&task.to_string())),
            ..self
        }
    }

    /// Its data address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its task's name (`ps:1`), when it was resolved from one or named with
    /// [`with_task`](Self::with_task). Names are kept for the life of the process.
    pub fn task(&self) -> Option<&'static str> {
        self.task
    }
}

impl PartialEq for Peer {
    fn eq(&self, other: &Peer) -> bool {
        self.addr == other.addr
    }
}

impl Eq for Peer {}

impl std::hash::Hash for Peer {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.addr.hash(state);
    }
}

impl From<SocketAddr> for Peer {
    fn from(addr: SocketAddr) -> Peer {
        Peer::new(addr)
    }
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.task {
            Some(task) => write!(f, "Peer({task} at {})", self.addr),
            None => write!(f, "Peer({})", self.addr),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.addr)
    }
}

/// Names kept so far. Names come from cluster specs and the caller (never from the
/// network), one per task a process talks to: a few hundred strings at most.
static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();

/// The one copy of `name`, made on first use. Takes a lock: for resolving, not for
/// requests.
fn intern(name: &str) -> &'static str {
    let names = NAMES.get_or_init(Default::default);
    let mut names = names.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&kept) = names.get(name) {
        return kept;
    }
    let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(kept);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_kept_once() {
        let a = intern("ps:7");
        let b = intern(&format!("ps:{}", 7));
        assert_eq!(a, "ps:7");
        assert!(std::ptr::eq(a, b));
        assert!(!std::ptr::eq(a, intern("ps:8")));
        let p = Peer::new("127.0.0.1:9".parse().unwrap()).with_task(&TaskId::new("ps", 7));
        assert!(std::ptr::eq(p.task().unwrap(), a));
    }
}
