//! `commctl`: check, reach and load starwire tasks.
//!
//! The binary is `src/bin/commctl.rs`; everything it does lives here so it can be unit
//! tested: the command line ([`cli`]), one module per subcommand, the rows table `serve`
//! serves ([`table`]), and the small helpers they share (exit codes, a stderr logger,
//! output that stops quietly when its reader went away, signal handling, CPU time and cache
//! sizes). JSON reports are serde_json, latency percentiles
//! hdrhistogram, signals signal-hook.

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod cpu;
pub mod endpoint_map;
pub mod exit;
pub mod logger;
pub mod out;
pub mod ping;
pub mod serve;
pub mod signals;
pub mod stats;
pub mod table;
pub mod target;
pub mod validate;
pub mod values;
pub mod wait;

use cli::{Command, Commctl};
use exit::Failure;

/// Runs commctl with `args` (without the program name); returns the exit code.
pub fn run(args: &[&str]) -> i32 {
    let cmd = match <Commctl as argh::FromArgs>::from_args(&["commctl"], args) {
        Ok(cmd) => cmd,
        Err(early) => {
            return match early.status {
                Ok(()) => {
                    crate::out::outln!("{}", early.output);
                    exit::OK
                }
                Err(()) => {
                    crate::out::errln!(
                        "{}\nRun commctl --help for more information.",
                        early.output
                    );
                    exit::USAGE
                }
            };
        }
    };
    if cmd.version {
        crate::out::outln!("commctl {}", env!("CARGO_PKG_VERSION"));
        return exit::OK;
    }
    let Some(command) = cmd.command else {
        crate::out::errln!("commctl: no command given\nRun commctl --help for more information.");
        return exit::USAGE;
    };
    let quiet_default = !matches!(command, Command::Serve(_));
    // `commctl -v serve` and `commctl serve -v` alike.
    let verbose = match &command {
        Command::Serve(a) => cmd.verbose.saturating_add(a.verbose),
        _ => cmd.verbose,
    };
    logger::init(verbose, quiet_default);
    let result = match command {
        Command::Validate(a) => validate::run(&a),
        Command::Ping(a) => ping::run(&a),
        Command::Serve(a) => serve::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::EndpointMap(a) => endpoint_map::run(&a),
        Command::Wait(a) => wait::run(&a),
        Command::Stats(a) => stats::run(&a),
        Command::Checkpoint(a) => checkpoint::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(Failure { code, message }) => {
            crate::out::errln!("commctl: {message}");
            code
        }
    }
}
