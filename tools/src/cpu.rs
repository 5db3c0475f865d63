//! CPU time of this process and of another one.

use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};

/// User plus system CPU time of this process (all its threads) so far.
pub fn own() -> Duration {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::from_secs(tv.tv_sec().max(0) as u64)
                    + Duration::from_micros(tv.tv_usec().max(0) as u64)
            };
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// User plus system CPU time of process `pid`, from `/proc/PID/stat`; `None` when it
/// cannot be read.
pub fn of_pid(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text, clock_ticks()?)
}

fn clock_ticks() -> Option<u64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    u64::try_from(ticks).ok().filter(|&t| t > 0)
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command name (field
/// 2) is in parentheses and may hold spaces and parentheses, so fields are counted from
/// the last `)`.
fn parse_stat(text: &str, ticks_per_sec: u64) -> Option<Duration> {
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    // After the name come field 3 (state) onward; utime is field 14, the 12th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime.checked_add(stime)?;
    Some(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / ticks_per_sec,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line() {
        let line = "4242 (commctl (x) y) S 1 4242 4242 0 -1 4194560 300 0 0 0 150 25 0 0 \
                    20 0 3 0 100 1000 200 18446744073709551615";
        assert_eq!(parse_stat(line, 100), Some(Duration::from_millis(1750)));
        assert_eq!(parse_stat("garbage", 100), None);
    }

    #[test]
    fn own_and_self_by_pid() {
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(own() > Duration::ZERO);
        assert!(of_pid(std::process::id()).is_some());
        assert!(of_pid(u32::MAX).is_none());
    }
}
