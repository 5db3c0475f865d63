//! What kind of value a setting holds: how it is read from its environment variable, how it
//! is checked on its own, and how the settings table describes its range and default.
//!
//! Checks that involve two settings (a chunk must fit in a frame, a buffer pool must hold
//! one receive buffer) are in [`ConfigBuilder::build`](super::ConfigBuilder::build).

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::env::{parse_decimal, Env};
use super::error::{shown, ConfigError, Origin, Setting};
use super::BackendChoice;
use crate::wire::WireFeatures;

/// The behaviour of one kind of setting holding a `T`.
pub(crate) trait SettingType<T: fmt::Debug> {
    /// The value of the variable `name`, `None` when unset.
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<T>, ConfigError>;

    /// Checks a value on its own; `env` and `method` name it in the error.
    fn check(
        &self,
        _value: &Setting<T>,
        _env: &'static str,
        _method: &'static str,
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The valid values, for the settings table.
    fn range_doc(&self) -> String;

    /// A value as the settings table shows it.
    fn value_doc(&self, value: &T) -> String;

    /// A value as `Debug` of the config and the builder shows it.
    fn debug(&self, value: &T, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(value, f)
    }
}

/// `Debug` of a value through its kind (so a secret stays hidden).
pub(crate) struct Shown<'a, K, T>(pub(crate) &'a K, pub(crate) &'a T);

impl<K: SettingType<T>, T: fmt::Debug> fmt::Debug for Shown<'_, K, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.debug(self.1, f)
    }
}

/// The unsigned integer types settings use.
pub(crate) trait Int: Copy + PartialOrd + fmt::Display + fmt::Debug {
    const MAX: Self;
    const NAME: &'static str;
    fn to_u64(self) -> u64;
    fn from_u64(v: u64) -> Option<Self>;
}

macro_rules! int {
    ($($t:ident),*) => {$(
        impl Int for $t {
            const MAX: $t = $t::MAX;
            const NAME: &'static str = stringify!($t);
            fn to_u64(self) -> u64 {
                // Lossless: usize is at most 64 bits on every target this crate builds for.
                self as u64
            }
            fn from_u64(v: u64) -> Option<$t> {
                $t::try_from(v).ok()
            }
        }
    )*};
}
int!(u32, u64, usize);

/// An integer from `lo` to `hi`, in decimal in the environment.
#[derive(Clone, Copy)]
pub(crate) struct Num<T> {
    lo: T,
    hi: T,
    /// What is counted (`bytes`, `connections`, ...).
    unit: &'static str,
    /// What the environment error says is counted, when it differs from `unit`.
    env_unit: &'static str,
}

impl<T: Int> Num<T> {
    pub(crate) const fn new(lo: T, hi: T, unit: &'static str) -> Num<T> {
        Num {
            lo,
            hi,
            unit,
            env_unit: unit,
        }
    }

    /// Words the environment error uses for `unit` (kept as the originals' messages had them).
    pub(crate) const fn env_unit(self, env_unit: &'static str) -> Num<T> {
        Num { env_unit, ..self }
    }

    fn expected(&self) -> String {
        format!("a number of {} from {} to {}", self.unit, self.lo, self.hi)
    }
}

impl<T: Int> SettingType<T> for Num<T> {
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<T>, ConfigError> {
        let v = env.number(name, self.lo.to_u64(), self.hi.to_u64(), self.env_unit)?;
        // In range, so it fits `T`.
        Ok(v.and_then(T::from_u64))
    }

    fn check(
        &self,
        s: &Setting<T>,
        env: &'static str,
        method: &'static str,
    ) -> Result<(), ConfigError> {
        if (self.lo..=self.hi).contains(&s.value) {
            return Ok(());
        }
        Err(ConfigError::new(
            s.label(env, method),
            shown(s.origin, s.value, s.value),
            self.expected(),
        ))
    }

    fn range_doc(&self) -> String {
        if self.lo.to_u64() == 0 && self.hi.to_u64() == T::MAX.to_u64() {
            return format!("any `{}`", T::NAME);
        }
        format!(
            "{} – {} {}",
            grouped(self.lo.to_u64()),
            grouped(self.hi.to_u64()),
            self.unit
        )
    }

    fn value_doc(&self, v: &T) -> String {
        if self.unit == "bytes" {
            bytes(v.to_u64())
        } else {
            grouped(v.to_u64())
        }
    }
}

/// An optional integer: `None` when the environment does not say.
pub(crate) struct Opt<T> {
    pub(crate) some: Num<T>,
    /// What `None` means, for the settings table.
    pub(crate) none: &'static str,
}

impl<T: Int> SettingType<Option<T>> for Opt<T> {
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<Option<T>>, ConfigError> {
        Ok(self.some.read(env, name)?.map(Some))
    }

    fn check(
        &self,
        s: &Setting<Option<T>>,
        env: &'static str,
        method: &'static str,
    ) -> Result<(), ConfigError> {
        match s.value {
            Some(value) => self.some.check(
                &Setting {
                    value,
                    origin: s.origin,
                },
                env,
                method,
            ),
            None => Ok(()),
        }
    }

    fn range_doc(&self) -> String {
        self.some.range_doc()
    }

    fn value_doc(&self, v: &Option<T>) -> String {
        match v {
            Some(v) => self.some.value_doc(v),
            None => self.none.to_owned(),
        }
    }
}

/// 0 for "off", else an integer from `lo` to `hi`.
pub(crate) struct ZeroOr<T> {
    pub(crate) some: Num<T>,
    /// What 0 means.
    pub(crate) zero: &'static str,
}

impl<T: Int> ZeroOr<T> {
    fn expected(&self) -> String {
        format!("0 ({}) or {}", self.zero, self.some.expected())
    }

    fn valid(&self, v: T) -> bool {
        v.to_u64() == 0 || (self.some.lo..=self.some.hi).contains(&v)
    }
}

impl<T: Int> SettingType<T> for ZeroOr<T> {
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<T>, ConfigError> {
        env.parse(name, &self.expected(), |s| {
            parse_decimal(s)
                .and_then(T::from_u64)
                .filter(|&v| self.valid(v))
        })
    }

    fn check(
        &self,
        s: &Setting<T>,
        env: &'static str,
        method: &'static str,
    ) -> Result<(), ConfigError> {
        if self.valid(s.value) {
            return Ok(());
        }
        Err(ConfigError::new(
            s.label(env, method),
            shown(s.origin, s.value, s.value),
            self.expected(),
        ))
    }

    fn range_doc(&self) -> String {
        format!("0 ({}), or {}", self.zero, self.some.range_doc())
    }

    fn value_doc(&self, v: &T) -> String {
        if v.to_u64() == 0 {
            format!("0 ({})", self.zero)
        } else {
            self.some.value_doc(v)
        }
    }
}

/// The chunk size: an integer from `lo`, at most what fits in a frame beside the chunk's
/// header. The upper bound depends on `max_frame`, so `build` checks it.
pub(crate) struct FitsFrame {
    pub(crate) num: Num<u32>,
    /// Room kept in a frame beside a chunk.
    pub(crate) overhead: u32,
}

impl SettingType<u32> for FitsFrame {
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<u32>, ConfigError> {
        self.num.read(env, name)
    }

    fn range_doc(&self) -> String {
        format!(
            "{} – `max_frame` − {} bytes",
            grouped(self.num.lo.into()),
            self.overhead
        )
    }

    fn value_doc(&self, v: &u32) -> String {
        self.num.value_doc(v)
    }
}

/// How a duration is written in the environment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeUnit {
    Micros,
    Millis,
}

/// A duration from `lo` to `hi`, a decimal number of `unit` in the environment.
pub(crate) struct Time {
    pub(crate) lo: Duration,
    pub(crate) hi: Duration,
    pub(crate) unit: TimeUnit,
}

impl Time {
    fn count(&self, d: Duration) -> u64 {
        let n = match self.unit {
            TimeUnit::Micros => d.as_micros(),
            TimeUnit::Millis => d.as_millis(),
        };
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    fn duration(&self, n: u64) -> Duration {
        match self.unit {
            TimeUnit::Micros => Duration::from_micros(n),
            TimeUnit::Millis => Duration::from_millis(n),
        }
    }

    fn unit_words(&self) -> &'static str {
        match self.unit {
            TimeUnit::Micros => "microseconds",
            TimeUnit::Millis => "milliseconds",
        }
    }

    fn unit_symbol(&self) -> &'static str {
        match self.unit {
            TimeUnit::Micros => "µs",
            TimeUnit::Millis => "ms",
        }
    }
}

impl SettingType<Duration> for Time {
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<Duration>, ConfigError> {
        let (lo, hi) = (self.count(self.lo), self.count(self.hi));
        let n = env.number(name, lo, hi, self.unit_words())?;
        Ok(n.map(|n| self.duration(n)))
    }

    fn check(
        &self,
        s: &Setting<Duration>,
        env: &'static str,
        method: &'static str,
    ) -> Result<(), ConfigError> {
        if (self.lo..=self.hi).contains(&s.value) {
            return Ok(());
        }
        let expected = match s.origin {
            Origin::Env => format!(
                "{} from {} to {}",
                self.unit_words(),
                self.count(self.lo),
                self.count(self.hi)
            ),
            _ => format!("a duration from {:?} to {:?}", self.lo, self.hi),
        };
        Err(ConfigError::new(
            s.label(env, method),
            shown(s.origin, self.count(s.value), s.value),
            expected,
        ))
    }

    fn range_doc(&self) -> String {
        format!(
            "{} – {} {}",
            grouped(self.count(self.lo)),
            grouped(self.count(self.hi)),
            self.unit_symbol()
        )
    }

    fn value_doc(&self, v: &Duration) -> String {
        format!("{} {}", grouped(self.count(*v)), self.unit_symbol())
    }
}

/// A boolean; `inverted` when the variable says the opposite of the setting (`*_DISABLE_*`).
pub(crate) struct Flag {
    pub(crate) inverted: bool,
}

impl SettingType<bool> for Flag {
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<bool>, ConfigError> {
        Ok(env.boolean(name)?.map(|b| b != self.inverted))
    }

    fn range_doc(&self) -> String {
        if self.inverted {
            "boolean, **inverted**: the variable is `true` when the setting is `false`".into()
        } else {
            "boolean".into()
        }
    }

    fn value_doc(&self, v: &bool) -> String {
        if self.inverted {
            format!("{} (the variable: {})", v, !v)
        } else {
            v.to_string()
        }
    }
}

const BACKEND_EXPECTED: &str = "uring, epoll or auto";

/// The I/O backend.
pub(crate) struct BackendSetting;

impl SettingType<BackendChoice> for BackendSetting {
    fn read(
        &self,
        env: &Env<'_>,
        name: &'static str,
    ) -> Result<Option<BackendChoice>, ConfigError> {
        // `BackendChoice::parse` would read blanks as nothing; an empty value is an error
        // here, as for every variable.
        env.parse(name, BACKEND_EXPECTED, |s| {
            if s.trim().is_empty() {
                None
            } else {
                BackendChoice::parse(s).ok()
            }
        })
    }

    fn range_doc(&self) -> String {
        "`auto`, `uring` (or `io_uring`), `epoll`".into()
    }

    fn value_doc(&self, v: &BackendChoice) -> String {
        format!("`{}`", format!("{v:?}").to_ascii_lowercase())
    }
}

const FEATURES_EXPECTED: &str =
    "all, none, or feature names separated by commas (row_formats, row_versions)";

/// The optional wire features a task announces.
pub(crate) struct FeaturesSetting;

impl SettingType<WireFeatures> for FeaturesSetting {
    fn read(&self, env: &Env<'_>, name: &'static str) -> Result<Option<WireFeatures>, ConfigError> {
        env.parse(name, FEATURES_EXPECTED, WireFeatures::parse)
    }

    fn range_doc(&self) -> String {
        "`all`, `none`, or names separated by commas: `row_formats`, `row_versions`".into()
    }

    fn value_doc(&self, v: &WireFeatures) -> String {
        if *v == WireFeatures::ALL {
            "`all`".into()
        } else {
            format!("`{v}`")
        }
    }
}

/// A secret of 1 to `max` bytes, or none. Never shown: errors and `Debug` give its length.
pub(crate) struct Secret {
    pub(crate) max: usize,
}

impl Secret {
    pub(crate) fn check_bytes(
        &self,
        name: Cow<'static, str>,
        token: &[u8],
    ) -> Result<(), ConfigError> {
        if (1..=self.max).contains(&token.len()) {
            return Ok(());
        }
        // Never echo a secret, even a malformed one.
        Err(ConfigError::new(
            name,
            format!("<{} bytes, not shown>", token.len()),
            format!("1 to {} bytes (or no token at all)", self.max),
        ))
    }
}

impl SettingType<Option<Vec<u8>>> for Secret {
    /// The raw bytes: any bytes, not necessarily UTF-8.
    fn read(
        &self,
        env: &Env<'_>,
        name: &'static str,
    ) -> Result<Option<Option<Vec<u8>>>, ConfigError> {
        use std::os::unix::ffi::OsStringExt;
        let Some(raw) = env.raw(name) else {
            return Ok(None);
        };
        let bytes = raw.into_vec();
        self.check_bytes(Cow::Borrowed(name), &bytes)?;
        Ok(Some(Some(bytes)))
    }

    fn check(
        &self,
        s: &Setting<Option<Vec<u8>>>,
        env: &'static str,
        method: &'static str,
    ) -> Result<(), ConfigError> {
        match &s.value {
            Some(token) => self.check_bytes(s.label(env, method), token),
            None => Ok(()),
        }
    }

    fn range_doc(&self) -> String {
        format!("1 – {} bytes, any bytes", self.max)
    }

    fn value_doc(&self, v: &Option<Vec<u8>>) -> String {
        match v {
            None => "none".into(),
            Some(_) => "set".into(),
        }
    }

    fn debug(&self, v: &Option<Vec<u8>>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match v {
            None => f.write_str("None"),
            Some(token) => write!(f, "Some(<{} bytes, not shown>)", token.len()),
        }
    }
}

/// A directory or file path; unset is `None`. Read as the variable's raw bytes (any bytes a
/// path may hold); an empty value is refused (it names no path).
pub(crate) struct PathSetting {
    /// What the path is for, for the settings table (`a directory`).
    pub(crate) what: &'static str,
    /// What unset means, for the settings table.
    pub(crate) none: &'static str,
}

impl SettingType<Option<PathBuf>> for PathSetting {
    fn read(
        &self,
        env: &Env<'_>,
        name: &'static str,
    ) -> Result<Option<Option<PathBuf>>, ConfigError> {
        let Some(raw) = env.raw(name) else {
            return Ok(None);
        };
        let path = PathBuf::from(raw);
        self.check_path(Cow::Borrowed(name), &path)?;
        Ok(Some(Some(path)))
    }

    fn check(
        &self,
        s: &Setting<Option<PathBuf>>,
        env: &'static str,
        method: &'static str,
    ) -> Result<(), ConfigError> {
        match &s.value {
            Some(path) => self.check_path(s.label(env, method), path),
            None => Ok(()),
        }
    }

    fn range_doc(&self) -> String {
        self.what.to_owned()
    }

    fn value_doc(&self, v: &Option<PathBuf>) -> String {
        match v {
            None => self.none.to_owned(),
            Some(p) => p.display().to_string(),
        }
    }
}

impl PathSetting {
    fn check_path(&self, name: Cow<'static, str>, path: &Path) -> Result<(), ConfigError> {
        if path.as_os_str().is_empty() {
            return Err(ConfigError::new(
                name,
                "\"\"".to_owned(),
                self.what.to_owned(),
            ));
        }
        Ok(())
    }
}

/// `1234567` as `1,234,567`.
pub(crate) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count in the largest binary unit that divides it: `4 MiB`, `4,096` stays `4 KiB`,
/// `1500` stays `1,500 bytes`.
pub(crate) fn bytes(n: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{} {unit}", grouped(n >> shift));
        }
    }
    format!("{} bytes", grouped(n))
}
