//! `commctl wait`: until every target answers, or the names of those that do not.

use std::io::Write;
use std::time::Duration;

use crate::cli::WaitArgs;
use crate::exit::{Failure, OK, UNREACHABLE};
use crate::ping::{client_config, start_client};
use crate::target;

/// Runs `commctl wait`.
pub fn run(args: &WaitArgs) -> Result<i32, Failure> {
    if args.targets.is_empty() {
        return Err(Failure::usage("wait: name at least one target"));
    }
    let opts = args.cluster_opts();
    let targets = args
        .targets
        .iter()
        .map(|t| target::resolve(t, &opts))
        .collect::<Result<Vec<_>, _>>()?;
    // A few connect retries per round; the rounds go on until the time is up.
    let rt = start_client(client_config("wait", 1, 1, 2)?)?;
    let mut h = rt.handle(targets.len().max(1));
    let timeout = Duration::from_secs_f64(args.timeout);
    let result = h.wait_for_peers(targets.iter().map(|t| t.addr), timeout);
    let mut out = crate::out::stdout();
    let code = match result {
        Ok(()) => {
            let _ = writeln!(out, "all {} targets answered", targets.len());
            OK
        }
        Err(e) => {
            let _ = writeln!(
                out,
                "{} of {} targets did not answer within {:?}:",
                e.peers.len(),
                targets.len(),
                e.waited
            );
            for (peer, why) in &e.peers {
                let label = targets
                    .iter()
                    .find(|t| starwire::Peer::from(t.addr) == *peer)
                    .map_or_else(|| peer.to_string(), |t| t.label.clone());
                let _ = writeln!(out, "  {label}: {why}");
            }
            UNREACHABLE
        }
    };
    drop(out);
    rt.shutdown();
    Ok(code)
}
