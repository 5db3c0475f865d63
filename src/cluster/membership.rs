//! Membership changes at run time: which tasks of the cluster moved, were added or were
//! removed between two resolvers, and the addresses a runtime no longer sends to.
//!
//! A runtime resolves task names once ([`Resolver`]) and then sends to addresses. When the
//! cluster changes — a PS restarted on another host or port, tasks added or removed — the
//! caller builds a resolver from the new cluster spec or `.endpoint_map` and hands both to
//! [`Runtime::update_cluster`](crate::Runtime::update_cluster). The runtime then retires
//! the addresses of tasks that moved or left: a request to one fails at once with
//! [`ErrorKind::NotInCluster`], naming the task and where it
//! went; connections to one are drained (the requests on them finish, nothing new is
//! sent) and closed. Peers resolved from the new resolver reach the tasks at their new
//! addresses, over new connections. A sharded rows client is pointed at the new PS list
//! with [`Sharded::set_peers`](crate::Sharded::set_peers).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;

use super::peer::Peer;
use super::resolver::{ResolveError, Resolver};
use super::spec::TaskId;
use crate::error::{Error, ErrorKind};

/// What changed in the cluster between two resolvers, task by task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterChange {
    /// Tasks at another address now: the task, its old and its new peer.
    pub moved: Vec<(TaskId, Peer, Peer)>,
    /// Tasks that are new.
    pub added: Vec<(TaskId, Peer)>,
    /// Tasks that are gone, with their old peer.
    pub removed: Vec<(TaskId, Peer)>,
}

impl ClusterChange {
    /// The changes from `old` to `new`; an error when a task of either cannot be resolved.
    pub fn between(old: &Resolver, new: &Resolver) -> Result<ClusterChange, ResolveError> {
        let before: HashMap<TaskId, Peer> = old.tasks()?.into_iter().collect();
        let after = new.tasks()?;
        let mut change = ClusterChange::default();
        for (task, peer) in &after {
            match before.get(task) {
                Some(was) if was != peer => change.moved.push((task.clone(), *was, *peer)),
                Some(_) => {}
                None => change.added.push((task.clone(), *peer)),
            }
        }
        let now: HashSet<&TaskId> = after.iter().map(|(t, _)| t).collect();
        let mut removed: Vec<(TaskId, Peer)> = before
            .into_iter()
            .filter(|(task, _)| !now.contains(task))
            .collect();
        removed.sort_by_key(|(task, _)| task.to_string());
        change.removed = removed;
        Ok(change)
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.moved.is_empty() && self.added.is_empty() && self.removed.is_empty()
    }
}

impl fmt::Display for ClusterChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no change");
        }
        let mut sep = "";
        for (task, from, to) in &self.moved {
            write!(f, "{sep}{task} moved from {from} to {to}")?;
            sep = "; ";
        }
        for (task, peer) in &self.added {
            write!(f, "{sep}{task} added at {peer}")?;
            sep = "; ";
        }
        for (task, peer) in &self.removed {
            write!(f, "{sep}{task} removed (was at {peer})")?;
            sep = "; ";
        }
        Ok(())
    }
}

/// Why an address is no longer sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Retired {
    /// The task that was there.
    pub task: TaskId,
    /// Where it is now; `None` when it left the cluster.
    pub now_at: Option<Peer>,
}

impl Retired {
    /// The error of a request sent to the retired address `addr`.
    pub(crate) fn error(&self, addr: SocketAddr) -> Error {
        let message = match self.now_at {
            Some(p) => format!("{} moved from {addr} to {p}; resolve it again", self.task),
            None => format!("{} was removed from the cluster (was at {addr})", self.task),
        };
        Error::new(ErrorKind::NotInCluster)
            .with_peer(addr)
            .with_message(message)
    }
}

/// The addresses a runtime no longer sends to.
pub(crate) type Retirements = HashMap<SocketAddr, Retired>;

/// `retired` after `change`: the old addresses of tasks that moved or left join it, and any
/// address a task of the new cluster has leaves it (a task may come back to an address).
pub(crate) fn apply(retired: &mut Retirements, change: &ClusterChange, new: &[(TaskId, Peer)]) {
    for (task, from, to) in &change.moved {
        retired.insert(
            from.addr(),
            Retired {
                task: task.clone(),
                now_at: Some(*to),
            },
        );
    }
    for (task, peer) in &change.removed {
        retired.insert(
            peer.addr(),
            Retired {
                task: task.clone(),
                now_at: None,
            },
        );
    }
    for (_, peer) in new {
        retired.remove(&peer.addr());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterSpec;

    /// The spec names tasks by control address; the map gives each one's data address as
    /// the same port on 127.0.0.3.
    fn resolver(ps: &str, worker: &str) -> Resolver {
        let mut spec = ClusterSpec::new();
        spec.add_job("ps", ps).unwrap();
        spec.add_job("worker", worker).unwrap();
        let map: String = ps
            .split(',')
            .chain(worker.split(','))
            .map(|c| {
                let a: SocketAddr = c.parse().unwrap();
                format!("{a}=127.0.0.3:{}\n", a.port())
            })
            .collect();
        let map = crate::cluster::endpoint_map::EndpointMap::parse("map", map.as_bytes()).unwrap();
        Resolver::from_spec(&spec, &map)
    }

    #[test]
    fn moved_added_and_removed_tasks_are_found_and_their_old_addresses_retired() {
        let old = resolver("127.0.0.1:5000,127.0.0.1:5001", "127.0.0.1:6000");
        let new = resolver(
            "127.0.0.1:5000,127.0.0.1:5009,127.0.0.1:5002",
            "127.0.0.1:6000",
        );
        let change = ClusterChange::between(&old, &new).unwrap();
        let peer = |s: &str| Peer::new(s.parse().unwrap());
        assert_eq!(
            change.moved,
            [(
                TaskId::new("ps", 1),
                peer("127.0.0.3:5001"),
                peer("127.0.0.3:5009")
            )]
        );
        assert_eq!(
            change.added,
            [(TaskId::new("ps", 2), peer("127.0.0.3:5002"))]
        );
        assert!(change.removed.is_empty());
        let mut retired = Retirements::new();
        apply(&mut retired, &change, &new.tasks().unwrap());
        assert_eq!(retired.len(), 1);
        let e =
            retired[&"127.0.0.3:5001".parse().unwrap()].error("127.0.0.3:5001".parse().unwrap());
        assert_eq!(e.kind(), ErrorKind::NotInCluster);
        assert!(e.remote_message().unwrap().contains("ps:1 moved"), "{e:?}");

        // Back: ps:2 leaves, and ps:1 returns to its first address, which is retired no
        // more.
        let change = ClusterChange::between(&new, &old).unwrap();
        assert_eq!(
            change.removed,
            [(TaskId::new("ps", 2), peer("127.0.0.3:5002"))]
        );
        apply(&mut retired, &change, &old.tasks().unwrap());
        let addrs: Vec<_> = retired.keys().map(|a| a.to_string()).collect();
        assert_eq!(addrs.len(), 2, "{addrs:?}");
        assert!(!retired.contains_key(&"127.0.0.3:5001".parse().unwrap()));
        let e =
            retired[&"127.0.0.3:5002".parse().unwrap()].error("127.0.0.3:5002".parse().unwrap());
        assert!(e.remote_message().unwrap().contains("removed"), "{e:?}");
        assert_eq!(
            ClusterChange::between(&old, &old).unwrap().to_string(),
            "no change"
        );
    }
}
