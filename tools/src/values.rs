//! Values of the command line that are more than a number: durations, seconds, and the
//! port rule of `endpoint-map`. Each parser's error names what it expected.

use std::time::Duration;

/// How a task's data port follows from its control address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortRule {
    /// The same port on every host.
    Fixed(u16),
    /// The control port plus this much.
    Offset(u16),
}

impl PortRule {
    /// The data port of a task with this control port; `None` past 65535.
    pub fn data_port(self, control: u16) -> Option<u16> {
        match self {
            PortRule::Fixed(p) => Some(p),
            PortRule::Offset(n) => control.checked_add(n),
        }
    }
}

impl std::fmt::Display for PortRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortRule::Fixed(p) => write!(f, "data port {p} on every host"),
            PortRule::Offset(n) => write!(f, "data port = control port + {n}"),
        }
    }
}

/// `PORT` (1 to 65535) or `+OFFSET` (1 to 65534).
pub fn parse_port_rule(text: &str) -> Result<PortRule, String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let bad = || {
        format!(
            "{text:?}: expected PORT (the same data port on every host, 1 to 65535) or \
             +OFFSET (the control port plus OFFSET, 1 to 65534)"
        )
    };
    match text.strip_prefix('+') {
        Some(n) if digits(n) => match n.parse::<u16>() {
            Ok(n) if (1..=65534).contains(&n) => Ok(PortRule::Offset(n)),
            _ => Err(bad()),
        },
        None if digits(text) => match text.parse::<u16>() {
            Ok(p) if p >= 1 => Ok(PortRule::Fixed(p)),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// Seconds as a decimal number, 0 or more (at most a day).
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "{text:?}: expected seconds, a number from 0 to 86400"
        )),
    }
}

/// Seconds as a decimal number, more than 0 (at most a day).
pub fn parse_positive_seconds(text: &str) -> Result<f64, String> {
    match parse_seconds(text) {
        Ok(s) if s >= 0.001 => Ok(s),
        _ => Err(format!(
            "{text:?}: expected seconds, a number from 0.001 to 86400"
        )),
    }
}

/// A duration: a number with an optional unit `ms`, `s`, `m` or `h` (seconds without one).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?}: expected a duration such as 500ms, 10s, 2m or 1h");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    if !(0.001..=7.0 * 86_400.0).contains(&secs) {
        return Err(format!("{text:?}: expected a duration from 1ms to 7 days"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "10x", "-1s", "0", "1e3", "8000000s", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn port_rules() {
        assert_eq!(parse_port_rule("5555"), Ok(PortRule::Fixed(5555)));
        assert_eq!(parse_port_rule("+1000"), Ok(PortRule::Offset(1000)));
        for bad in [
            "", "0", "+0", "65536", "+65535", "-1", "+", "5555x", " 5555", "++1",
        ] {
            assert!(parse_port_rule(bad).is_err(), "{bad}");
        }
        assert_eq!(PortRule::Offset(1000).data_port(2222), Some(3222));
        assert_eq!(PortRule::Offset(1000).data_port(65000), None);
        assert_eq!(PortRule::Fixed(5555).data_port(2222), Some(5555));
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("0.2"), Ok(0.2));
        assert_eq!(parse_seconds("0"), Ok(0.0));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("inf").is_err());
        assert!(parse_positive_seconds("0").is_err());
        assert_eq!(parse_positive_seconds("1"), Ok(1.0));
    }
}
