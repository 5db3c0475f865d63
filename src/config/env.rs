//! Reading and parsing environment variables.
//!
//! An unset variable is `None` (the default stays); a set one must parse, or it is an error
//! naming the variable. Nothing is trimmed: a value with blanks is a typo to report, not to
//! guess at.

use std::ffi::OsString;

use super::error::ConfigError;

pub(crate) const BOOL_EXPECTED: &str = "true or false (or 1/0, yes/no)";

/// Reads variables through a lookup function (`None` = unset), so tests need not mutate the
/// process environment.
pub(crate) struct Env<'a>(pub(crate) &'a dyn Fn(&str) -> Option<OsString>);

impl Env<'_> {
    /// The raw value of `name`, `None` when unset.
    pub(crate) fn raw(&self, name: &str) -> Option<OsString> {
        (self.0)(name)
    }

    /// The value of `name` parsed with `parse`, `None` when unset. Not UTF-8, or not
    /// accepted by `parse`: an error saying what was `expected`.
    pub(crate) fn parse<T>(
        &self,
        name: &'static str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        let Some(raw) = self.raw(name) else {
            return Ok(None);
        };
        let text = match raw.into_string() {
            Ok(text) => text,
            Err(raw) => {
                return Err(ConfigError::new(
                    name,
                    format!("{:?}", raw.as_os_str()),
                    format!("valid UTF-8: {expected}"),
                ))
            }
        };
        match parse(&text) {
            Some(v) => Ok(Some(v)),
            None => Err(ConfigError::new(
                name,
                format!("{text:?}"),
                expected.to_owned(),
            )),
        }
    }

    pub(crate) fn boolean(&self, name: &'static str) -> Result<Option<bool>, ConfigError> {
        self.parse(name, BOOL_EXPECTED, parse_bool)
    }

    /// A decimal integer in `lo..=hi`.
    pub(crate) fn number(
        &self,
        name: &'static str,
        lo: u64,
        hi: u64,
        unit: &str,
    ) -> Result<Option<u64>, ConfigError> {
        let expected = format!("a decimal number of {unit} from {lo} to {hi}");
        self.parse(name, &expected, |s| {
            parse_decimal(s).filter(|v| (lo..=hi).contains(v))
        })
    }
}

/// `true`/`false`/`1`/`0`/`yes`/`no`, ASCII case-insensitive, nothing else (no blanks).
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    const TRUE: [&str; 3] = ["true", "1", "yes"];
    const FALSE: [&str; 3] = ["false", "0", "no"];
    if TRUE.iter().any(|t| s.eq_ignore_ascii_case(t)) {
        Some(true)
    } else if FALSE.iter().any(|f| s.eq_ignore_ascii_case(f)) {
        Some(false)
    } else {
        None
    }
}

/// ASCII digits only (no sign, blanks or separators), fitting a `u64`.
pub(crate) fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
