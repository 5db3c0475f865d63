//! Membership changes for an embedded client (a runtime's are in `runtime.rs`).

use std::sync::Arc;

use super::{Client, Local};
use crate::cluster::{self, ClusterChange};
use crate::{ResolveError, Resolver};

impl Client<Local> {
    /// As [`Runtime::update_cluster`](crate::Runtime::update_cluster), for this embedded
    /// client's loop: tasks that moved or left between `old` and `new` have their old
    /// addresses retired (requests to them fail with
    /// [`ErrorKind::NotInCluster`](crate::ErrorKind::NotInCluster); connections to them are
    /// drained, then closed) from the next time the loop is driven.
    pub fn update_cluster(
        &mut self,
        old: &Resolver,
        new: &Resolver,
    ) -> Result<ClusterChange, ResolveError> {
        let change = ClusterChange::between(old, new)?;
        let tasks = new.tasks()?;
        let local = &mut self.mode;
        cluster::apply(&mut local.retired, &change, &tasks);
        local.shared.post_retired(Arc::new(local.retired.clone()));
        Ok(change)
    }
}
