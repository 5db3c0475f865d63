//! Standard output and standard error that never panic: `println!` panics when the reader
//! of a pipe went away (`commctl stats --help | head`), because Rust ignores `SIGPIPE` and a
//! write then fails with `EPIPE`. Here such a write ends the output quietly instead: what
//! follows is dropped, and the commands that print as they go (`ping`, `stats --watch`)
//! ask [`closed`] and stop.
//!
//! Every line commctl prints goes through `outln!` (stdout) or `errln!` (stderr), or through
//! [`stdout`] for a report written in parts.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to stdout met a reader that went away.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Standard output, locked while this lives; a write to a closed pipe marks it closed
/// ([`closed`]) and is dropped, as is every later one.
pub struct Stdout {
    inner: io::StdoutLock<'static>,
}

/// Locks standard output.
pub fn stdout() -> Stdout {
    Stdout {
        inner: io::stdout().lock(),
    }
}

/// Whether stdout's reader went away: nothing more will be shown, so a command that
/// prints as it goes may stop.
pub fn closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// Whether stdout is a terminal (not a file or a pipe): where screen-control codes
/// belong.
pub fn is_terminal() -> bool {
    io::stdout().is_terminal()
}

/// `result`, with a closed pipe taken as "written" and remembered.
fn quiet<T>(result: io::Result<T>, written: T) -> io::Result<T> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            Ok(written)
        }
        other => other,
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if closed() {
            return Ok(buf.len());
        }
        let result = self.inner.write(buf);
        quiet(result, buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if closed() {
            return Ok(());
        }
        let result = self.inner.flush();
        quiet(result, ())
    }
}

/// `println!` that stops quietly when stdout's reader went away (see the module docs).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let mut out = $crate::out::stdout();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// `eprintln!` that never panics: a line that cannot be written to stderr is dropped.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = writeln!(::std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics.
macro_rules! err {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = write!(::std::io::stderr(), $($arg)*);
    }};
}

pub(crate) use {err, errln, outln};
