//! CPU time of this process and of another one, and the CPU's cache sizes (what a table's
//! bytes are compared with: does a benchmark's working set fit in cache?).

use std::path::Path;
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

/// The sizes of CPU 0's level-2 cache and last-level cache, from
/// `/sys/devices/system/cpu/cpu0/cache/` (`None` where unreadable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caches {
    /// Bytes of the level-2 cache (data or unified).
    pub l2: Option<u64>,
    /// The last level's number (3 on most servers) and bytes.
    pub llc: Option<(u32, u64)>,
}

/// What [`fit`] found: the smallest cache that holds the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// They fit in the level-2 cache.
    L2,
    /// In the last-level cache, not in level 2.
    Llc,
    /// Not in the last-level cache: they come from memory.
    Memory,
    /// The cache sizes are unknown.
    Unknown,
}

impl Fit {
    /// `l2`, `llc`, `memory` or `unknown`, for JSON reports.
    pub fn name(self) -> &'static str {
        match self {
            Fit::L2 => "l2",
            Fit::Llc => "llc",
            Fit::Memory => "memory",
            Fit::Unknown => "unknown",
        }
    }
}

/// The caches of this machine's CPU 0.
pub fn caches() -> Caches {
    caches_in(Path::new("/sys/devices/system/cpu/cpu0/cache"))
}

/// The caches described under `dir` (`index0`, `index1`, ... each with `level`, `type` and
/// `size`).
fn caches_in(dir: &Path) -> Caches {
    let mut c = Caches::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return c;
    };
    for entry in entries.flatten() {
        let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let (Ok(level), Some(bytes)) = (level.trim().parse::<u32>(), parse_size(size.trim()))
        else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        if level == 2 {
            c.l2 = Some(c.l2.map_or(bytes, |b| b.max(bytes)));
        }
        if c.llc.map_or(true, |(l, _)| level > l) {
            c.llc = Some((level, bytes));
        }
    }
    c
}

/// A size as sysfs writes it: `32K`, `1024K`, `32M`, or bytes.
fn parse_size(text: &str) -> Option<u64> {
    let (num, unit) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 1 << 10),
        b'M' => (&text[..text.len() - 1], 1 << 20),
        b'G' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(unit)
}

/// Where `bytes` fit among `caches`.
pub fn fit(bytes: u64, caches: &Caches) -> Fit {
    match (caches.l2, caches.llc) {
        (Some(l2), _) if bytes <= l2 => Fit::L2,
        (_, Some((_, llc))) if bytes <= llc => Fit::Llc,
        (_, Some(_)) => Fit::Memory,
        _ => Fit::Unknown,
    }
}

/// Bytes as people read them: `512 B`, `1.5 KiB`, `64.0 MiB`, `1.2 GiB`.
pub fn fmt_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes < 1 << 10 {
        format!("{bytes} B")
    } else if bytes < 1 << 20 {
        format!("{:.1} KiB", b / 1024.0)
    } else if bytes < 1 << 30 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    }
}

/// A sentence on where `bytes` fit: `fits in L2 (1.0 MiB)`, `fits in the L3 cache (32.0
/// MiB), not in L2 (1.0 MiB)`, `does not fit in the L3 cache (32.0 MiB)`, or that the sizes
/// are unknown.
pub fn describe_fit(bytes: u64, caches: &Caches) -> String {
    let llc = |(level, size): (u32, u64)| format!("the L{level} cache ({})", fmt_bytes(size));
    match (fit(bytes, caches), caches.l2, caches.llc) {
        (Fit::L2, Some(l2), _) => format!("fits in L2 ({})", fmt_bytes(l2)),
        (Fit::Llc, l2, Some(last)) => match l2 {
            Some(l2) => format!("fits in {}, not in L2 ({})", llc(last), fmt_bytes(l2)),
            None => format!("fits in {}", llc(last)),
        },
        (Fit::Memory, _, Some(last)) => format!("does not fit in {}", llc(last)),
        _ => "cache sizes unknown (no /sys/devices/system/cpu/cpu0/cache)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_from_sysfs_files() {
        let dir = std::env::temp_dir().join(format!("commctl-caches-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (i, (level, kind, size)) in [
            ("1", "Data", "32K"),
            ("1", "Instruction", "32K"),
            ("2", "Unified", "1024K"),
            ("3", "Unified", "32M"),
        ]
        .into_iter()
        .enumerate()
        {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            for (name, text) in [("level", level), ("type", kind), ("size", size)] {
                std::fs::write(d.join(name), format!("{text}\n")).unwrap();
            }
        }
        let c = caches_in(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            c,
            Caches {
                l2: Some(1 << 20),
                llc: Some((3, 32 << 20))
            }
        );
        assert_eq!(fit(1 << 20, &c), Fit::L2);
        assert_eq!(fit((1 << 20) + 1, &c), Fit::Llc);
        assert_eq!(fit(33 << 20, &c), Fit::Memory);
        assert_eq!(fit(1, &Caches::default()), Fit::Unknown);
        assert_eq!(describe_fit(1000, &c), "fits in L2 (1.0 MiB)");
        assert_eq!(
            describe_fit(2 << 20, &c),
            "fits in the L3 cache (32.0 MiB), not in L2 (1.0 MiB)"
        );
        assert_eq!(
            describe_fit(1 << 30, &c),
            "does not fit in the L3 cache (32.0 MiB)"
        );
        assert_eq!(caches_in(Path::new("/nonexistent")), Caches::default());
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
    }

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
