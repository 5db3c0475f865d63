//! The tables' upkeep thread: it calls each served table's [`Table::maintain`] every
//! [`Config::table_upkeep`](crate::Config::table_upkeep), and saves the tables when a peer
//! asks for a checkpoint (a `CHECKPOINT` request), so that neither stalls a loop.
//!
//! A checkpoint writes one file per table into the task's checkpoint directory (each table's
//! [`Table::save`]: written atomically, a fuzzy snapshot taken while the table serves), then
//! a manifest, `checkpoint.json`, written the same way: the document the requester gets,
//! naming each table's file, rows and bytes. A checkpoint whose tables did not all save
//! leaves the previous manifest in place and is answered with an error naming each table
//! that failed and why.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::pool::{Answer, AnswerSink, ReplyTo};
use crate::service::{SaveError, SaveReport, SharedService};
use crate::wire::Status;

/// Checkpoint requests queued behind the one being written, at most; more are refused with
/// `UNAVAILABLE`.
const QUEUED: usize = 2;

/// The file a checkpoint's manifest is written to, in the checkpoint directory.
pub const CHECKPOINT_MANIFEST: &str = "checkpoint.json";

/// Version of the manifest's layout.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;

/// What a checkpoint request is answered with: the manifest (JSON), or a status and why.
pub(crate) type CheckpointResult = Result<Vec<u8>, (Status, String)>;

/// A loop's way to ask the upkeep thread for a checkpoint.
#[derive(Clone)]
pub(crate) struct Checkpoints {
    tx: SyncSender<ReplyTo>,
}

impl Checkpoints {
    /// Checkpoints asked through a channel of `queued` places, and its receiving end (for
    /// tests that play the upkeep thread).
    #[cfg(test)]
    pub(crate) fn channel(queued: usize) -> (Checkpoints, Receiver<ReplyTo>) {
        let (tx, rx) = sync_channel(queued);
        (Checkpoints { tx }, rx)
    }

    /// Queues a checkpoint answered to `to`; `Err` with the status and message to refuse the
    /// request with.
    pub(crate) fn ask(&self, to: ReplyTo) -> Result<(), (Status, &'static str)> {
        match self.tx.try_send(to) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err((
                Status::Unavailable,
                "checkpoints of this task are already in progress; retry once they are done",
            )),
            Err(TrySendError::Disconnected(_)) => {
                Err((Status::Shutdown, "the task is shutting down"))
            }
        }
    }
}

/// The upkeep thread.
pub(crate) struct Upkeep {
    tx: Option<SyncSender<ReplyTo>>,
    thread: Option<JoinHandle<()>>,
}

impl Upkeep {
    /// Starts the thread for `service`'s tables: maintained every `period`, saved into `dir`
    /// on request (`None`: checkpoints are refused before they reach the thread), answers
    /// posted to `loops`.
    pub(crate) fn start<S: AnswerSink + 'static>(
        service: SharedService,
        period: Duration,
        dir: Option<PathBuf>,
        task: String,
        loops: Vec<Arc<S>>,
    ) -> io::Result<Upkeep> {
        let loops: Vec<Arc<dyn AnswerSink>> = loops
            .into_iter()
            .map(|l| l as Arc<dyn AnswerSink>)
            .collect();
        let (tx, rx) = sync_channel::<ReplyTo>(QUEUED);
        let thread = std::thread::Builder::new()
            .name("starwire-upkeep".into())
            .spawn(move || run(&rx, &*service, period, dir.as_deref(), &task, &loops))?;
        Ok(Upkeep {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// A handle for the loops to ask for checkpoints.
    pub(crate) fn checkpoints(&self) -> Option<Checkpoints> {
        self.tx.clone().map(|tx| Checkpoints { tx })
    }

    /// Stops the thread once the checkpoint it is writing, if any, is done.
    pub(crate) fn stop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("the starwire upkeep thread panicked");
            }
        }
    }
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    rx: &Receiver<ReplyTo>,
    service: &dyn crate::service::Service,
    period: Duration,
    dir: Option<&Path>,
    task: &str,
    loops: &[Arc<dyn AnswerSink>],
) {
    let mut next = Instant::now() + period;
    // The tables maintained are those listed at start: listing them again each period
    // would allocate, and a service's tables are given when it starts.
    let tables = service.table_ids();
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(to) => {
                let result = match dir {
                    Some(dir) => checkpoint(service, dir, task),
                    None => Err((Status::Unimplemented, "no checkpoint directory".into())),
                };
                match loops.get(to.loop_index) {
                    Some(l) => l.post_answer(Answer::Checkpoint { to, result }),
                    None => log::error!("upkeep: no loop {}", to.loop_index),
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if Instant::now() >= next {
            maintain(service, &tables);
            next = Instant::now() + period;
        }
    }
}

/// Calls the `maintain` of every table of `ids`, a panic in one contained.
fn maintain(service: &dyn crate::service::Service, ids: &[u32]) {
    for &id in ids {
        if let Some(table) = service.table(id) {
            if crate::panic::guarded("Table::maintain", || table.maintain()).is_none() {
                log::error!("table {id}: maintain panicked");
            }
        }
    }
}

/// Saves every table of `service` into `dir`, then the manifest; the manifest's bytes, or
/// why not.
pub(crate) fn checkpoint(
    service: &dyn crate::service::Service,
    dir: &Path,
    task: &str,
) -> CheckpointResult {
    let start = Instant::now();
    let ids = service.table_ids();
    if ids.is_empty() {
        return Err((
            Status::Unimplemented,
            format!("{task} serves no tables to save"),
        ));
    }
    if let Err(e) = fs::create_dir_all(dir) {
        let why = format!("checkpoint directory {}: {e}", dir.display());
        return Err((Status::Internal, why));
    }
    let mut saved: Vec<(u32, SaveReport)> = Vec::with_capacity(ids.len());
    let mut failed: Vec<(u32, String)> = Vec::new();
    for id in ids {
        let Some(table) = service.table(id) else {
            failed.push((id, "listed by the service but not served".into()));
            continue;
        };
        match crate::panic::guarded("Table::save", || table.save(dir)) {
            Some(Ok(report)) => saved.push((id, report)),
            Some(Err(SaveError::Unsupported)) => {
                failed.push((id, "this table cannot be saved".into()))
            }
            Some(Err(e)) => failed.push((id, e.to_string())),
            None => failed.push((id, "save panicked".into())),
        }
    }
    // Two tables saved into one file: the second replaced the first.
    for (i, (id, r)) in saved.iter().enumerate() {
        if let Some((other, _)) = saved[..i].iter().find(|(_, o)| o.path == r.path) {
            failed.push((
                *id,
                format!(
                    "saved into {}, the file of table {other} too (each table needs its own \
                     table id)",
                    r.path.display()
                ),
            ));
        }
    }
    if !failed.is_empty() {
        let mut why = format!("checkpoint into {} failed:", dir.display());
        for (id, e) in &failed {
            let _ = write!(why, " table {id}: {e};");
        }
        why.pop();
        log::error!("{why}");
        let status = if failed.len() == saved.len() + failed.len()
            && failed
                .iter()
                .all(|(_, e)| e == "this table cannot be saved")
        {
            Status::Unimplemented
        } else {
            Status::Internal
        };
        return Err((status, why));
    }
    let doc = manifest(task, dir, &saved, start.elapsed());
    if let Err(e) = write_atomically(&dir.join(CHECKPOINT_MANIFEST), doc.as_bytes()) {
        let why = format!(
            "checkpoint manifest {}: {e}",
            dir.join(CHECKPOINT_MANIFEST).display()
        );
        log::error!("{why}");
        return Err((Status::Internal, why));
    }
    log::info!(
        "checkpoint of {} tables into {} in {:?}",
        saved.len(),
        dir.display(),
        start.elapsed()
    );
    Ok(doc.into_bytes())
}

/// The manifest: what was saved where.
fn manifest(task: &str, dir: &Path, saved: &[(u32, SaveReport)], took: Duration) -> String {
    let mut out = String::with_capacity(256 + 256 * saved.len());
    let _ = write!(
        out,
        "{{\"format\":\"starwire-checkpoint\",\"version\":{CHECKPOINT_FORMAT_VERSION},\"task\":"
    );
    crate::stats::trace::json_str(&mut out, task);
    out.push_str(",\"dir\":");
    crate::stats::trace::json_str(&mut out, &dir.display().to_string());
    let written = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let _ = write!(
        out,
        ",\"written_unix_s\":{written},\"seconds\":{:.6},\"tables\":[",
        took.as_secs_f64()
    );
    for (i, (id, r)) in saved.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let file = r
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = write!(out, "{{\"table\":{id},\"file\":");
        crate::stats::trace::json_str(&mut out, &file);
        let _ = write!(
            out,
            ",\"rows\":{},\"bytes\":{},\"seconds\":{:.6},\"direct_io\":{}}}",
            r.rows,
            r.bytes,
            r.elapsed.as_secs_f64(),
            r.direct_io
        );
    }
    out.push_str("]}");
    out
}

/// Writes `bytes` to `path` through a temporary file in the same directory, synced and
/// renamed into place, the directory synced after.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("json.tmp");
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
