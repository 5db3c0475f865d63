//! `commctl checkpoint`: asks a running task to save its tables (a `CHECKPOINT` request,
//! `docs/wire-format.md` section 4.12) and shows the manifest it answers with: per table
//! its file, rows, bytes, time and speed, and the directory they went to.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, Instant};

use serde::Deserialize;
use starwire::{Error, ErrorKind, Status};

use crate::cli::CheckpointArgs;
use crate::exit::{self, Failure};
use crate::ping::{client_config, fatal, start_client};
use crate::stats::fmt_bytes;
use crate::target::{self, Target};

/// The manifest a task answers a checkpoint request with (version 1), as it also writes it
/// next to the tables (`checkpoint.json`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Manifest {
    /// `"starwire-checkpoint"`.
    pub format: String,
    /// Layout version.
    pub version: u32,
    /// The task that saved, `job:index`.
    pub task: String,
    /// Its checkpoint directory, on its host.
    pub dir: String,
    /// When the manifest was written, seconds since the Unix epoch.
    pub written_unix_s: u64,
    /// From the request taken to the manifest written.
    pub seconds: f64,
    /// One entry per table saved.
    pub tables: Vec<SavedTable>,
}

/// One table of a [`Manifest`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SavedTable {
    /// The table's id.
    pub table: u32,
    /// Its file in the directory.
    pub file: String,
    /// Rows saved.
    pub rows: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// From start to the file in place.
    pub seconds: f64,
    /// Whether rows went to the disk around the page cache (`O_DIRECT`).
    pub direct_io: bool,
}

impl SavedTable {
    /// GB per second from start to the file in place.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9) / 1e9
    }
}

/// Parses a manifest.
pub fn parse(text: &str) -> Result<Manifest, String> {
    let m: Manifest =
        serde_json::from_str(text).map_err(|e| format!("bad checkpoint manifest: {e}"))?;
    if m.format != "starwire-checkpoint" {
        return Err(format!("not a checkpoint manifest (format {:?})", m.format));
    }
    Ok(m)
}

/// Runs `commctl checkpoint`.
pub fn run(args: &CheckpointArgs) -> Result<i32, Failure> {
    let target = target::resolve(&args.target, &args.cluster_opts())?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let rt = start_client(client_config("checkpoint", 1, 1, 0)?)?;
    let mut h = rt.handle(4);
    let deadline = Some(Instant::now() + timeout);
    let text = h
        .checkpoint(target.addr, deadline)
        .and_then(|t| t.wait(&mut h))
        .map_err(|e| failure(&e, &target, timeout))?;
    let shown = if args.json {
        format!("{}\n", text.trim_end())
    } else {
        let m = parse(&text).map_err(|m| Failure {
            code: exit::TRANSPORT,
            message: format!("{}: {m}", target.label),
        })?;
        table(&m, &target.label)
    };
    let mut out = crate::out::stdout();
    let _ = out.write_all(shown.as_bytes());
    let _ = out.flush();
    Ok(exit::OK)
}

/// The failure of a checkpoint request: the task's answer in words a user can act on (exit
/// status 1, the task was reached and did not save), or a transport failure as for every
/// command.
pub fn failure(e: &Error, target: &Target, timeout: Duration) -> Failure {
    let label = &target.label;
    let said = e.remote_message().filter(|m| !m.is_empty());
    let quoted = |m: Option<&str>| {
        m.map(|m| format!(" (the task said: {m})"))
            .unwrap_or_default()
    };
    let message = match e.kind() {
        ErrorKind::Remote(Status::Unimplemented) => match said {
            // The task has a directory, and nothing it can save.
            Some(m) if !m.contains("STARWIRE_CHECKPOINT_DIR") => {
                format!("{label} has nothing to save: {m}")
            }
            // The task's words say the same (they name the variable).
            _ => format!(
                "{label} takes no checkpoints: it has no checkpoint directory; start it with \
                 STARWIRE_CHECKPOINT_DIR=DIR (commctl serve: --checkpoint-dir DIR)"
            ),
        },
        ErrorKind::Remote(Status::Unavailable) => format!(
            "{label} is already saving, with more checkpoints queued: retry once they are \
             done{}",
            quoted(said)
        ),
        ErrorKind::Remote(Status::Internal) => match said {
            Some(m) => format!("{label} could not save its tables: {m}"),
            None => format!("{label} could not save its tables (INTERNAL)"),
        },
        _ => return fatal(e, label, target.addr, timeout),
    };
    Failure {
        code: exit::FAILED,
        message,
    }
}

/// The manifest in words: what was saved where, and a line per table.
pub fn table(m: &Manifest, label: &str) -> String {
    let mut s = String::new();
    let rows: u64 = m.tables.iter().map(|t| t.rows).sum();
    let bytes: u64 = m.tables.iter().map(|t| t.bytes).sum();
    let n = m.tables.len();
    let _ = writeln!(
        s,
        "checkpoint of {label}: task {} saved {n} table{}, {rows} rows, {} in {:.3} s",
        m.task,
        if n == 1 { "" } else { "s" },
        fmt_bytes(bytes as f64),
        m.seconds
    );
    let dir = m.dir.trim_end_matches('/');
    let _ = writeln!(
        s,
        "directory {dir} (on the task's host), manifest {dir}/{}",
        starwire::CHECKPOINT_MANIFEST
    );
    let _ = writeln!(
        s,
        "\n{:>8} {:<24} {:>12} {:>9} {:>9} {:>7}  DIRECT I/O",
        "TABLE", "FILE", "ROWS", "BYTES", "SECONDS", "GB/s"
    );
    for t in &m.tables {
        let _ = writeln!(
            s,
            "{:>8} {:<24} {:>12} {:>9} {:>9.3} {:>7.2}  {}",
            t.table,
            t.file,
            t.rows,
            fmt_bytes(t.bytes as f64),
            t.seconds,
            t.gb_per_s(),
            if t.direct_io {
                "yes"
            } else {
                "no (page cache)"
            }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"{"format":"starwire-checkpoint","version":1,"task":"ps:0",
        "dir":"/ckpt/ps0","written_unix_s":1700000000,"seconds":0.5,"tables":[
        {"table":1,"file":"table-1.swrows","rows":1000,"bytes":2000000000,"seconds":0.25,
        "direct_io":true},{"table":7,"file":"table-7.swrows","rows":5,"bytes":500,
        "seconds":0.001,"direct_io":false}]}"#;

    #[test]
    fn a_manifest_is_shown_per_table_with_its_speed() {
        let m = parse(MANIFEST).unwrap();
        let t = table(&m, "ps:0 (127.0.0.1:5555)");
        assert!(
            t.starts_with(
                "checkpoint of ps:0 (127.0.0.1:5555): task ps:0 saved 2 tables, 1005 rows, \
                 2.0GB in 0.500 s\ndirectory /ckpt/ps0 (on the task's host), manifest \
                 /ckpt/ps0/checkpoint.json\n"
            ),
            "{t}"
        );
        let line = t.lines().find(|l| l.contains("table-1.swrows")).unwrap();
        // 2 GB in 0.25 s.
        assert!(line.contains(" 8.00  yes"), "{line}");
        let line = t.lines().find(|l| l.contains("table-7.swrows")).unwrap();
        assert!(line.ends_with("no (page cache)"), "{line}");
        assert!(parse(r#"{"format":"starwire-stats"}"#).is_err());
        assert!(parse("{").is_err());
    }

    #[test]
    fn refusals_say_what_to_do() {
        let target = Target {
            label: "ps:0".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            task: None,
        };
        let t = Duration::from_secs(1);
        let remote = |s: Status, m: &str| Error::new(ErrorKind::Remote(s)).with_message(m);
        let f = failure(
            &remote(
                Status::Unimplemented,
                "checkpoints are off on this task: it has no checkpoint directory \
                 (STARWIRE_CHECKPOINT_DIR)",
            ),
            &target,
            t,
        );
        assert_eq!(f.code, exit::FAILED);
        assert_eq!(
            f.message,
            "ps:0 takes no checkpoints: it has no checkpoint directory; start it with \
             STARWIRE_CHECKPOINT_DIR=DIR (commctl serve: --checkpoint-dir DIR)"
        );
        let f = failure(
            &remote(Status::Unimplemented, "ps:0 serves no tables to save"),
            &target,
            t,
        );
        assert_eq!(
            f.message,
            "ps:0 has nothing to save: ps:0 serves no tables to save"
        );
        let f = failure(&remote(Status::Unavailable, ""), &target, t);
        assert!(
            f.message.contains("retry once they are done"),
            "{}",
            f.message
        );
        let f = failure(
            &remote(
                Status::Internal,
                "checkpoint into /x failed: table 1: disk full",
            ),
            &target,
            t,
        );
        assert_eq!(
            f.message,
            "ps:0 could not save its tables: checkpoint into /x failed: table 1: disk full"
        );
        // Not an answer of the task's: the transport's exit codes.
        let f = failure(&Error::new(ErrorKind::Timeout), &target, t);
        assert_eq!(f.code, exit::TIMEOUT);
    }
}
