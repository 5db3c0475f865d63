//! `commctl ping`: one line per reply, a ping(8)-style summary.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use starwire::cluster::TaskId;
use starwire::config::{
    ConfigBuilder, ENV_CONNECT_RETRIES, ENV_HANDSHAKE_TIMEOUT_MS, MAX_HANDSHAKE_TIMEOUT,
};
use starwire::{Config, Error, ErrorKind, Reply, Runtime};

use crate::cli::PingArgs;
use crate::exit::{self, Failure};
use crate::signals::{self, Watcher};
use crate::target;

/// Most pings in flight at once (with a short interval and a long timeout).
const MAX_OUTSTANDING: usize = 1024;

/// The task a commctl client calls itself in its handshake: job `commctl-COMMAND`, index
/// the process id (`commctl-bench:4242`), so that a task's stats keep each command and
/// each run on a row of its own.
pub fn client_task(command: &str) -> TaskId {
    TaskId::new(&format!("commctl-{command}"), std::process::id())
}

/// The configuration of a client of `command`: the environment as for any task, as
/// [`client_task`], with `retries` connect retries (a tool should say "nothing listening"
/// at once) and no handshake timeout of its own, unless the environment sets those: the
/// deadline of each request is the one timeout, so a peer that accepts and never answers
/// reads as "no reply within the timeout", request after request, as in ping(8).
pub fn client_config(
    command: &str,
    loops: usize,
    connections: usize,
    retries: u32,
) -> Result<Config, Failure> {
    let bad = |e: starwire::config::ConfigError| Failure::usage(e.to_string());
    let task = client_task(command);
    let mut b = ConfigBuilder::from_env(&task.job, task.index)
        .map_err(bad)?
        .loops(loops)
        .connections_per_peer(connections);
    if std::env::var_os(ENV_CONNECT_RETRIES).is_none() {
        b = b.connect_retries(retries);
    }
    if std::env::var_os(ENV_HANDSHAKE_TIMEOUT_MS).is_none() {
        b = b.handshake_timeout(MAX_HANDSHAKE_TIMEOUT);
    }
    b.build().map_err(bad)
}

/// Starts a client runtime.
pub fn start_client(cfg: Config) -> Result<Runtime, Failure> {
    let rt = Runtime::start(cfg, None)
        .map_err(|e| Failure::usage(format!("cannot start the starwire client: {e}")))?;
    // What start-up did differently from what was asked (fewer loops, a fallback).
    for note in rt.report().notes() {
        crate::out::errln!("commctl: {note}");
    }
    Ok(rt)
}

/// The failure for a request error that ends the command.
pub fn fatal(e: &Error, label: &str, addr: SocketAddr, timeout: Duration) -> Failure {
    let message = match e.kind() {
        ErrorKind::ConnectFailed => {
            // Why the last attempt failed (refused, unreachable, timed out); an error
            // without it gets one plain connect attempt to tell.
            let why = match e.os_error() {
                Some(os) => format!(": {os}"),
                None => {
                    match TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(3))) {
                        Err(e) => format!(": {}", os_error(&e)),
                        Ok(_) => String::new(),
                    }
                }
            };
            format!("{label}: could not connect{why} (is a starwire server listening there?)")
        }
        _ => exit::describe(e, label),
    };
    Failure {
        code: exit::code_of(e),
        message,
    }
}

/// An I/O error without the "(os error N)" suffix, lower-cased like the rest of a line.
fn os_error(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = match s.find(" (os error") {
        Some(i) => s[..i].to_owned(),
        None => s,
    };
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_lowercase().chain(c).collect(),
        None => s,
    }
}

/// Milliseconds with ping(8)'s precision: 3 decimals below 1 ms, fewer above.
pub fn fmt_ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 1.0 {
        format!("{ms:.3}")
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 100.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

/// A percentage without a useless `.0`.
pub fn fmt_pct(x: f64) -> String {
    let s = format!("{x:.1}");
    s.strip_suffix(".0").map(str::to_owned).unwrap_or(s)
}

/// Runs `commctl ping`.
pub fn run(args: &PingArgs) -> Result<i32, Failure> {
    let signals = signals::take()?;
    let target = target::resolve(&args.target, &args.cluster_opts())?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let interval = Duration::from_secs_f64(args.interval);
    if args.count == Some(0) {
        return Err(Failure::usage("-c: the count must be at least 1"));
    }
    let rt = start_client(client_config("ping", 1, 1, 0)?)?;
    let watcher = Watcher::start(signals, std::thread::current());
    let mut h = rt.handle(MAX_OUTSTANDING);
    let mut out = crate::out::stdout();
    let _ = writeln!(out, "PING {}: {} payload bytes", target.label, args.size);
    let _ = out.flush();

    let start = Instant::now();
    let mut next = start;
    let mut sent: u64 = 0;
    let mut pending: HashMap<u64, u64> = HashMap::new();
    // Every round-trip time, for exact percentiles.
    let mut rtts: Vec<Duration> = Vec::new();
    let mut first_error: Option<Error> = None;
    let mut failure: Option<Failure> = None;
    let who = target.task.as_ref().map_or_else(
        || target.label.clone(),
        |t| format!("{t} ({})", target.addr),
    );
    'run: loop {
        // Interrupted, or nobody reads the replies any more (`commctl ping ... | head`).
        if watcher.stopped() || crate::out::closed() {
            break;
        }
        let now = Instant::now();
        let more = args.count.map_or(true, |c| sent < c);
        if more && now >= next && pending.len() < MAX_OUTSTANDING {
            match h.ping(target.addr, args.size, Some(now + timeout)) {
                Ok(ticket) => {
                    sent += 1;
                    pending.insert(ticket.tag(), sent);
                }
                Err(e) if e.kind() == ErrorKind::Backpressure => {}
                Err(e) => {
                    failure = Some(fatal(&e, &target.label, target.addr, timeout));
                    break;
                }
            }
            next += interval;
            if next < now {
                next = now;
            }
        }
        while let Some(c) = h.poll() {
            let seq = pending.remove(&c.tag).unwrap_or(0);
            match c.result {
                Ok(Reply::Pong { rtt, payload }) => {
                    rtts.push(rtt);
                    if !args.quiet {
                        let _ = writeln!(
                            out,
                            "{payload} bytes from {who}: seq={seq} time={} ms",
                            fmt_ms(rtt)
                        );
                        let _ = out.flush();
                    }
                }
                Ok(other) => {
                    log::warn!("unexpected reply to a ping: {other:?}");
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectFailed
                            | ErrorKind::Refused(_)
                            | ErrorKind::InvalidArgument
                    ) =>
                {
                    failure = Some(match e.kind() {
                        ErrorKind::InvalidArgument => Failure::usage(format!(
                            "-s {}: the payload is too large for a ping",
                            args.size
                        )),
                        _ => fatal(&e, &target.label, target.addr, timeout),
                    });
                    break 'run;
                }
                Err(e) if e.kind() == ErrorKind::Shutdown => break 'run,
                Err(e) => {
                    if !args.quiet {
                        let why = match e.kind() {
                            ErrorKind::Timeout => {
                                format!("no reply within {} s", fmt_secs(timeout))
                            }
                            _ => e.to_string(),
                        };
                        let _ = writeln!(out, "from {who}: seq={seq} {why}");
                        let _ = out.flush();
                    }
                    first_error = first_error.or(Some(e));
                }
            }
        }
        if !more && pending.is_empty() {
            break;
        }
        let now = Instant::now();
        let wait = if more {
            next.saturating_duration_since(now)
        } else {
            Duration::from_millis(1)
        };
        if !wait.is_zero() {
            std::thread::park_timeout(wait.min(Duration::from_millis(1)));
        }
    }
    let elapsed = start.elapsed();
    drop(h);
    rt.shutdown();

    let received = rtts.len() as u64;
    if failure.is_none() || sent > 1 {
        let _ = writeln!(out, "\n--- {} ping statistics ---", target.label);
        let loss = if sent == 0 {
            0.0
        } else {
            (sent - received) as f64 * 100.0 / sent as f64
        };
        let _ = writeln!(
            out,
            "{sent} pings sent, {received} replies received, {}% loss, time {} ms",
            fmt_pct(loss),
            elapsed.as_millis()
        );
        if received > 0 {
            rtts.sort();
            let q = |p: f64| {
                let rank = ((p * rtts.len() as f64).ceil() as usize).clamp(1, rtts.len());
                rtts[rank - 1]
            };
            let mean = rtts.iter().sum::<Duration>().div_f64(received as f64);
            let _ = writeln!(
                out,
                "rtt min/avg/p50/p99/max = {}/{}/{}/{}/{} ms",
                fmt_ms(q(0.0)),
                fmt_ms(mean),
                fmt_ms(q(0.5)),
                fmt_ms(q(0.99)),
                fmt_ms(q(1.0))
            );
        }
        let _ = out.flush();
    }
    if let Some(f) = failure {
        return Err(f);
    }
    Ok(if received == sent {
        exit::OK
    } else if received > 0 {
        exit::FAILED
    } else {
        // The first failure is the cause; later ones often follow from it.
        first_error.as_ref().map_or(exit::FAILED, exit::code_of)
    })
}

/// Seconds without trailing zeros: `5`, `0.5`.
pub fn fmt_secs(d: Duration) -> String {
    let s = format!("{:.3}", d.as_secs_f64());
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_ms(Duration::from_micros(45)), "0.045");
        assert_eq!(fmt_ms(Duration::from_micros(4_567)), "4.57");
        assert_eq!(fmt_ms(Duration::from_micros(45_670)), "45.7");
        assert_eq!(fmt_ms(Duration::from_millis(456)), "456");
        assert_eq!(fmt_pct(0.0), "0");
        assert_eq!(fmt_pct(100.0 / 3.0), "33.3");
        assert_eq!(fmt_secs(Duration::from_secs(5)), "5");
        assert_eq!(fmt_secs(Duration::from_millis(500)), "0.5");
        let e = std::io::Error::from_raw_os_error(111);
        assert_eq!(os_error(&e), "connection refused");
    }
}
