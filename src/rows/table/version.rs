//! Row versions: where a table's version clock starts.
//!
//! A table gives each row a version, the value its clock had when the row last changed (a
//! push, its creation, a load over it): a worker that holds a row at some version asks
//! only whether the version changed. Versions must never repeat for a row with other
//! contents, across evictions and across restarts of the table.

/// Where a table's version clock starts: 4 × the nanoseconds since the Unix epoch (at least
/// 1). Every change of a row (a push, a creation, a load) takes the clock's next value, so
/// a version is never given twice in a table's life; and a table built later starts above
/// every version an earlier one gave, unless that one took more than 4 versions per
/// nanosecond of its life (four row updates a nanosecond, which no table does) or the
/// host's clock went back across the restart. So a version a worker holds never names a
/// row of a table built after it (restarted from a checkpoint or from empty).
pub(super) fn version_clock_start() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    now.saturating_mul(4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_clock_starts_above_what_an_earlier_one_could_give() {
        let first = version_clock_start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = version_clock_start();
        // 2 ms later: 8 million versions of headroom (4 a nanosecond).
        assert!(second >= first + 8_000_000, "{first} {second}");
        assert_ne!(first, 0);
    }
}
