//! A small stderr logger for the library's `log` records.

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record<'_>) {
        if self.enabled(r.metadata()) {
            let level = match r.level() {
                Level::Error => "error",
                Level::Warn => "warning",
                Level::Info => "info",
                Level::Debug => "debug",
                Level::Trace => "trace",
            };
            crate::out::errln!("commctl: {level}: {}", r.args());
        }
    }

    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

/// Installs the logger. `RUST_LOG` (`off`, `error`, `warn`, `info`, `debug`, `trace`) sets
/// the level; else each `-v` raises it one step from `error` (`warn` when `quiet` is false).
pub fn init(verbose: u8, quiet: bool) {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.trim().parse::<LevelFilter>().ok())
        .unwrap_or_else(|| level_for(verbose, quiet));
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

/// The level for `verbose` `-v` flags.
pub fn level_for(verbose: u8, quiet: bool) -> LevelFilter {
    const LEVELS: [LevelFilter; 5] = [
        LevelFilter::Error,
        LevelFilter::Warn,
        LevelFilter::Info,
        LevelFilter::Debug,
        LevelFilter::Trace,
    ];
    let base = if quiet { 0 } else { 1 };
    LEVELS[(base + verbose as usize).min(LEVELS.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(level_for(0, true), LevelFilter::Error);
        assert_eq!(level_for(0, false), LevelFilter::Warn);
        assert_eq!(level_for(2, true), LevelFilter::Info);
        assert_eq!(level_for(200, false), LevelFilter::Trace);
    }
}
