//! The `.endpoint_map` file: which data address (where starwire listens) belongs to which
//! control address (the task's address in the cluster spec).
//!
//! Format, one entry per line, as in DeepRec's GRPC++:
//!
//! ```text
//! # control address = data address
//! 127.0.0.1:3333=127.0.0.1:5555
//! [fd00::1]:3333 = [fd00::1]:5555   # ps 0
//! ps-1.train.svc:3333=ps-1.train.svc:5555
//! ```
//!
//! Unlike the originals, blank lines and `#` comments (whole lines, or after an entry
//! following white space) are accepted. Everything else that is wrong is reported, all at
//! once, each [`Problem`] with its file and line: a malformed address, port 0 or above
//! 65535, the unspecified address (`0.0.0.0`, `[::]`), a control address listed twice, two
//! tasks on one data address, a data address that is also a control address, and text
//! after the data address.
//!
//! Addresses are compared as written, after normalisation (IP addresses by value, host
//! names case-insensitively); no name is resolved while checking, so `localhost:5555` and
//! `127.0.0.1:5555` are different addresses here.
//!
//! ```
//! use starwire::cluster::endpoint_map::{EndpointMap, HostPort};
//!
//! let text = b"# ps 0\n127.0.0.1:3333=127.0.0.1:5555\n127.0.0.1:4444=127.0.0.1:6666\n";
//! let map = EndpointMap::parse(".endpoint_map", text).unwrap();
//! let control: HostPort = "127.0.0.1:4444".parse().unwrap();
//! assert_eq!(map.data_addr(&control).unwrap().to_string(), "127.0.0.1:6666");
//!
//! let bad = EndpointMap::parse(".endpoint_map", b"127.0.0.1:3333=127.0.0.1:0\n").unwrap_err();
//! assert_eq!(bad[0].to_string(), ".endpoint_map:1: data address \"127.0.0.1:0\": port 0 is not allowed");
//! ```

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The file's name.
pub const FILE_NAME: &str = ".endpoint_map";
/// Environment variable naming the folder that holds [`FILE_NAME`] (the originals' name).
pub const ENV_PATH: &str = "TF_SEASTAR_ENDPOINT_MAP_PATH";
/// Largest file read, 16 MiB (a hundred thousand tasks fit in a tenth of that).
pub const MAX_FILE_BYTES: usize = 16 << 20;
/// Longest line, in bytes.
pub const MAX_LINE_BYTES: usize = 4096;
/// Longest host name (RFC 1035).
pub const MAX_HOST_NAME: usize = 253;
/// Longest label of a host name (RFC 1035).
const MAX_LABEL: usize = 63;

// ---------------------------------------------------------------------------------------
// Addresses.

/// The host part of a [`HostPort`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 address (written in brackets).
    V6(Ipv6Addr),
    /// A host name, lower-cased.
    Name(String),
}

impl Host {
    /// The IP address, when the host is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match *self {
            Host::V4(a) => Some(IpAddr::V4(a)),
            Host::V6(a) => Some(IpAddr::V6(a)),
            Host::Name(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::V4(a) => write!(f, "{a}"),
            Host::V6(a) => write!(f, "[{a}]"),
            Host::Name(n) => f.write_str(n),
        }
    }
}

/// A `host:port` address as written in an endpoint map or a cluster spec: an IPv4
/// address, a bracketed IPv6 address or a host name, and a port from 1 to 65535.
///
/// Parsing checks the syntax only; [`resolve`](HostPort::resolve) looks a name up.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    host: Host,
    port: u16,
}

impl HostPort {
    /// An address from its parts. Fails for port 0.
    pub fn new(host: Host, port: u16) -> Result<HostPort, AddrError> {
        if port == 0 {
            return Err(AddrError::PortZero);
        }
        Ok(HostPort { host, port })
    }

    /// Parses `host:port`, `a.b.c.d:port` or `[v6]:port`.
    pub fn parse(text: &str) -> Result<HostPort, AddrError> {
        if text.is_empty() {
            return Err(AddrError::Empty);
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let Some((inner, after)) = rest.split_once(']') else {
                return Err(AddrError::UnclosedBracket);
            };
            let Some(port) = after.strip_prefix(':') else {
                return Err(if after.is_empty() {
                    AddrError::MissingPort
                } else {
                    AddrError::AfterBracket
                });
            };
            if inner.contains('%') {
                return Err(AddrError::ZoneId);
            }
            let Ok(ip) = Ipv6Addr::from_str(inner) else {
                return Err(AddrError::BadIpv6);
            };
            (Host::V6(ip), port)
        } else {
            let Some((host, port)) = text.rsplit_once(':') else {
                return Err(AddrError::MissingPort);
            };
            if host.contains(':')
                && (Ipv6Addr::from_str(host).is_ok() || Ipv6Addr::from_str(text).is_ok())
            {
                return Err(AddrError::UnbracketedIpv6);
            }
            (parse_host(host)?, port)
        };
        let port = parse_port(port)?;
        Ok(HostPort { host, port })
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port, never 0.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address, without a lookup when the host is an IP address; a host name
    /// is resolved through the system resolver and its first address is taken.
    pub fn resolve(&self) -> io::Result<SocketAddr> {
        if let Some(ip) = self.host.ip() {
            return Ok(SocketAddr::new(ip, self.port));
        }
        let mut addrs = (self.host.to_string(), self.port).to_socket_addrs()?;
        addrs.next().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} has no address", self.host),
            )
        })
    }
}

impl FromStr for HostPort {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<HostPort, AddrError> {
        HostPort::parse(s)
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

fn parse_port(text: &str) -> Result<u16, AddrError> {
    if text.is_empty() {
        return Err(AddrError::MissingPort);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AddrError::BadPort);
    }
    let digits = text.trim_start_matches('0');
    if digits.is_empty() {
        return Err(AddrError::PortZero);
    }
    match digits.parse::<u16>() {
        Ok(port) => Ok(port),
        Err(_) => Err(AddrError::PortRange),
    }
}

fn parse_host(text: &str) -> Result<Host, AddrError> {
    if text.is_empty() {
        return Err(AddrError::MissingHost);
    }
    // A name's last label is never all digits; such a host is meant as an IPv4 address.
    let last = text.rsplit('.').next().unwrap_or(text);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return Ipv4Addr::from_str(text)
            .map(Host::V4)
            .map_err(|_| AddrError::BadIpv4);
    }
    if text.len() > MAX_HOST_NAME {
        return Err(AddrError::NameTooLong);
    }
    // One trailing dot (a fully qualified name) is allowed.
    let name = text.strip_suffix('.').unwrap_or(text);
    for label in name.split('.') {
        if label.is_empty() {
            return Err(AddrError::EmptyLabel);
        }
        if label.len() > MAX_LABEL {
            return Err(AddrError::LabelTooLong);
        }
        if let Some(c) = label
            .chars()
            .find(|&c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(AddrError::BadChar(c));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(AddrError::HyphenEdge);
        }
    }
    Ok(Host::Name(text.to_ascii_lowercase()))
}

/// What is wrong with a `host:port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddrError {
    /// Nothing was written.
    Empty,
    /// No host before the `:`.
    MissingHost,
    /// No `:port`.
    MissingPort,
    /// The port is not a decimal number.
    BadPort,
    /// Port 0.
    PortZero,
    /// A port above 65535.
    PortRange,
    /// `[` without `]`.
    UnclosedBracket,
    /// Something other than `:port` after `]`.
    AfterBracket,
    /// The text in brackets is not an IPv6 address.
    BadIpv6,
    /// An IPv6 zone id (`%eth0`).
    ZoneId,
    /// An IPv6 address without brackets.
    UnbracketedIpv6,
    /// Looks like an IPv4 address (digits and dots) but is not one.
    BadIpv4,
    /// A host name longer than [`MAX_HOST_NAME`].
    NameTooLong,
    /// A host name with an empty label (`a..b`, `.a`).
    EmptyLabel,
    /// A host name label longer than 63 bytes.
    LabelTooLong,
    /// A host name label that starts or ends with `-`.
    HyphenEdge,
    /// A character a host name cannot contain.
    BadChar(char),
}

impl fmt::Display for AddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddrError::Empty => f.write_str("empty; expected host:port"),
            AddrError::MissingHost => f.write_str("no host before ':'"),
            AddrError::MissingPort => f.write_str("no port; expected host:port"),
            AddrError::BadPort => f.write_str("the port is not a number"),
            AddrError::PortZero => f.write_str("port 0 is not allowed"),
            AddrError::PortRange => f.write_str("port out of range (1-65535)"),
            AddrError::UnclosedBracket => f.write_str("'[' without ']'"),
            AddrError::AfterBracket => f.write_str("expected ':port' after ']'"),
            AddrError::BadIpv6 => f.write_str("not a valid IPv6 address"),
            AddrError::ZoneId => f.write_str("IPv6 zone ids (%...) are not supported"),
            AddrError::UnbracketedIpv6 => {
                f.write_str("an IPv6 address must be in brackets, as in [::1]:5555")
            }
            AddrError::BadIpv4 => f.write_str("not a valid IPv4 address"),
            AddrError::NameTooLong => write!(f, "host name longer than {MAX_HOST_NAME} bytes"),
            AddrError::EmptyLabel => f.write_str("empty label in the host name"),
            AddrError::LabelTooLong => {
                write!(
                    f,
                    "a label of the host name is longer than {MAX_LABEL} bytes"
                )
            }
            AddrError::HyphenEdge => {
                f.write_str("a label of the host name starts or ends with '-'")
            }
            AddrError::BadChar(c) => {
                write!(f, "{:?} is not allowed in a host name", c)
            }
        }
    }
}

impl std::error::Error for AddrError {}

// ---------------------------------------------------------------------------------------
// The map.

/// One line of an endpoint map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The task's address in the cluster spec.
    pub control: HostPort,
    /// Where the task's starwire listens.
    pub data: HostPort,
    /// Line number, from 1.
    pub line: usize,
}

/// A parsed, valid endpoint map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointMap {
    source: String,
    entries: Vec<Entry>,
    by_control: HashMap<HostPort, usize>,
    /// Lines left out for a problem of their own, by their control address (lenient
    /// parsing; empty otherwise).
    rejected: HashMap<HostPort, usize>,
}

impl EndpointMap {
    /// Parses the text of a map; `source` names it in problems (usually the path).
    /// Returns every problem found, ordered by line, when there is any.
    pub fn parse(source: &str, text: &[u8]) -> Result<EndpointMap, Vec<Problem>> {
        let (map, problems) = EndpointMap::parse_lenient(source, text);
        if problems.is_empty() {
            Ok(map)
        } else {
            Err(problems)
        }
    }

    /// Parses the text of a map, keeping the entries that are sound beside the problems
    /// found (an entry with a problem of its own is left out; of two entries that clash,
    /// the first is kept). For tools that report everything, including what depends on
    /// the entries (see [`Cluster::resolve`](crate::cluster::Cluster::resolve)).
    pub fn parse_lenient(source: &str, text: &[u8]) -> (EndpointMap, Vec<Problem>) {
        let mut map = EndpointMap {
            source: source.to_owned(),
            ..EndpointMap::default()
        };
        let mut problems = Vec::new();
        let mut report = |line: Option<usize>, kind: ProblemKind| {
            problems.push(Problem {
                source: source.to_owned(),
                line,
                kind,
            })
        };
        if text.len() > MAX_FILE_BYTES {
            report(
                None,
                ProblemKind::TooLarge {
                    bytes: text.len(),
                    limit: MAX_FILE_BYTES,
                },
            );
            return (map, problems);
        }
        let mut by_data: HashMap<HostPort, usize> = HashMap::new();
        for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
            let line = i + 1;
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            if raw.len() > MAX_LINE_BYTES {
                report(Some(line), ProblemKind::LineTooLong);
                continue;
            }
            let Ok(raw) = std::str::from_utf8(raw) else {
                report(Some(line), ProblemKind::NotUtf8);
                continue;
            };
            let (control, data) = match split_line(raw) {
                Ok(Some(pair)) => pair,
                Ok(None) => continue,
                Err(kind) => {
                    report(Some(line), kind);
                    continue;
                }
            };
            let mut sound = true;
            let mut check = |side: AddrKind, text: &str| match HostPort::parse(text) {
                Ok(a) if a.host.ip().is_some_and(|ip| ip.is_unspecified()) => {
                    report(
                        Some(line),
                        ProblemKind::Unspecified {
                            side,
                            addr: a.clone(),
                        },
                    );
                    sound = false;
                    Some(a)
                }
                Ok(a) => Some(a),
                Err(error) => {
                    report(
                        Some(line),
                        ProblemKind::BadAddress {
                            side,
                            text: text.to_owned(),
                            error,
                        },
                    );
                    sound = false;
                    None
                }
            };
            let control = check(AddrKind::Control, control);
            let data = check(AddrKind::Data, data);
            let (control, data) = match (control, data, sound) {
                (Some(control), Some(data), true) => (control, data),
                (Some(control), _, _) => {
                    map.rejected.entry(control).or_insert(line);
                    continue;
                }
                _ => continue,
            };
            if let Some(&first) = map.by_control.get(&control) {
                let first_line = map.entries[first].line;
                report(
                    Some(line),
                    ProblemKind::DuplicateControl {
                        control,
                        first_line,
                    },
                );
                continue;
            }
            if let Some(&other) = by_data.get(&data) {
                let other = &map.entries[other];
                report(
                    Some(line),
                    ProblemKind::SharedData {
                        data,
                        other_control: other.control.clone(),
                        other_line: other.line,
                    },
                );
                map.rejected.entry(control).or_insert(line);
                continue;
            }
            by_data.insert(data.clone(), map.entries.len());
            map.by_control.insert(control.clone(), map.entries.len());
            map.entries.push(Entry {
                control,
                data,
                line,
            });
        }
        // A data address may clash with a control address on a later line: check after.
        let mut clashing = Vec::new();
        for (i, e) in map.entries.iter().enumerate() {
            if let Some(&j) = map.by_control.get(&e.data) {
                let other = &map.entries[j];
                problems.push(Problem {
                    source: source.to_owned(),
                    line: Some(e.line),
                    kind: ProblemKind::DataIsControl {
                        data: e.data.clone(),
                        control_line: other.line,
                    },
                });
                clashing.push(i);
            }
        }
        for &i in &clashing {
            let e = &map.entries[i];
            map.rejected.entry(e.control.clone()).or_insert(e.line);
        }
        if !clashing.is_empty() {
            let mut i = 0;
            map.entries.retain(|_| {
                i += 1;
                !clashing.contains(&(i - 1))
            });
            map.reindex();
        }
        problems.sort_by_key(|p| p.line);
        (map, problems)
    }

    /// Reads and parses the file at `path` (at most [`MAX_FILE_BYTES`]).
    pub fn load(path: &Path) -> Result<EndpointMap, LoadError> {
        EndpointMap::load_found(path, Found::Given)
    }

    /// Finds the map as [`locate`](EndpointMap::locate) does, reading the environment
    /// through `lookup`, and loads it; an error that it cannot be read says where it was
    /// looked for and how to point at it ([`ENV_PATH`]).
    pub(crate) fn locate_and_load(
        explicit: Option<&Path>,
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> Result<EndpointMap, LoadError> {
        let found = match (explicit, lookup(ENV_PATH)) {
            (Some(_), _) => Found::Given,
            (None, Some(dir)) if !dir.is_empty() => Found::Env,
            (None, _) => Found::CurrentFolder,
        };
        let path = EndpointMap::locate_with(explicit, lookup);
        EndpointMap::load_found(&path, found)
    }

    fn load_found(path: &Path, found: Found) -> Result<EndpointMap, LoadError> {
        let text = read_limited(path, found)?;
        EndpointMap::parse(&path.display().to_string(), &text).map_err(LoadError::Invalid)
    }

    /// Reads the file at `path` and parses it with
    /// [`parse_lenient`](EndpointMap::parse_lenient): the sound entries and every problem.
    /// Only a file that cannot be read is an error.
    pub fn load_lenient(path: &Path) -> Result<(EndpointMap, Vec<Problem>), LoadError> {
        let text = read_limited(path, Found::Given)?;
        Ok(EndpointMap::parse_lenient(
            &path.display().to_string(),
            &text,
        ))
    }

    /// Where the map is looked for: `explicit` if given (a folder means the
    /// [`FILE_NAME`] in it), else the folder named by [`ENV_PATH`], else the current
    /// folder.
    pub fn locate(explicit: Option<&Path>) -> PathBuf {
        EndpointMap::locate_with(explicit, |name| std::env::var_os(name))
    }

    /// [`locate`](EndpointMap::locate) reading the environment through `lookup`.
    pub fn locate_with(
        explicit: Option<&Path>,
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> PathBuf {
        match explicit {
            Some(p) if p.is_dir() => p.join(FILE_NAME),
            Some(p) => p.to_owned(),
            None => match lookup(ENV_PATH) {
                Some(dir) if !dir.is_empty() => PathBuf::from(dir).join(FILE_NAME),
                _ => PathBuf::from(FILE_NAME),
            },
        }
    }

    /// Where this map came from, as given to [`parse`](EndpointMap::parse).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The entries, in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for a control address.
    pub fn get(&self, control: &HostPort) -> Option<&Entry> {
        self.by_control.get(control).map(|&i| &self.entries[i])
    }

    /// The data address of a control address.
    pub fn data_addr(&self, control: &HostPort) -> Option<&HostPort> {
        self.get(control).map(|e| &e.data)
    }

    /// The line that names `control` but was left out for a problem of its own (a bad or
    /// unspecified data address, a data address another line has or that is a control
    /// address), when [`parse_lenient`](EndpointMap::parse_lenient) made this map: a
    /// task without an entry whose line is here has had that problem reported already.
    /// `None` for an address with an entry, or named on no line.
    pub fn rejected_line(&self, control: &HostPort) -> Option<usize> {
        match self.get(control) {
            Some(_) => None,
            None => self.rejected.get(control).copied(),
        }
    }

    fn reindex(&mut self) {
        self.by_control = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.control.clone(), i))
            .collect();
    }
}

impl fmt::Display for EndpointMap {
    /// The map in file form, one `control=data` line per entry.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.entries {
            writeln!(f, "{}={}", e.control, e.data)?;
        }
        Ok(())
    }
}

/// Splits a line into its control and data text; `None` for a blank or comment line.
fn split_line(line: &str) -> Result<Option<(&str, &str)>, ProblemKind> {
    let line = line.trim_matches(is_blank);
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let Some((control, rest)) = line.split_once('=') else {
        return Err(ProblemKind::MissingSeparator {
            text: line.to_owned(),
        });
    };
    let control = control.trim_matches(is_blank);
    let rest = rest.trim_start_matches(is_blank);
    let end = rest
        .find(|c: char| is_blank(c) || c == '=')
        .unwrap_or(rest.len());
    let (data, tail) = rest.split_at(end);
    let tail = tail.trim_start_matches(is_blank);
    if !tail.is_empty() && !tail.starts_with('#') {
        return Err(ProblemKind::TrailingText {
            text: tail.to_owned(),
        });
    }
    // `a=#b` leaves the data address empty, caught as such by the address check.
    Ok(Some((control, data)))
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn read_limited(path: &Path, found: Found) -> Result<Vec<u8>, LoadError> {
    let io_err = |error| LoadError::Io {
        path: path.to_owned(),
        error,
        found,
    };
    let file = std::fs::File::open(path).map_err(io_err)?;
    let mut text = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .map_err(io_err)?;
    Ok(text)
}

// ---------------------------------------------------------------------------------------
// Problems.

/// Which address of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrKind {
    /// The left one, the task's address in the cluster spec.
    Control,
    /// The right one, where starwire listens.
    Data,
}

impl fmt::Display for AddrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddrKind::Control => "control",
            AddrKind::Data => "data",
        })
    }
}

/// One thing wrong in an endpoint map, with where it is.
///
/// Displays as `FILE:LINE: what is wrong` (`FILE: ...` for the whole file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The map's source, as given to [`EndpointMap::parse`].
    pub source: String,
    /// Line number, from 1; `None` for the whole file.
    pub line: Option<usize>,
    /// What is wrong.
    pub kind: ProblemKind,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.source, self.kind),
            None => write!(f, "{}: {}", self.source, self.kind),
        }
    }
}

impl std::error::Error for Problem {}

/// What is wrong with a line (or the file).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The file is larger than [`MAX_FILE_BYTES`].
    TooLarge {
        /// Bytes read (at most the limit plus one).
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A line longer than [`MAX_LINE_BYTES`].
    LineTooLong,
    /// A line that is not UTF-8.
    NotUtf8,
    /// A line with no `=`.
    MissingSeparator {
        /// The line, trimmed.
        text: String,
    },
    /// Text after the data address that is not a comment.
    TrailingText {
        /// The text.
        text: String,
    },
    /// A malformed address.
    BadAddress {
        /// Which one.
        side: AddrKind,
        /// As written.
        text: String,
        /// What is wrong.
        error: AddrError,
    },
    /// `0.0.0.0` or `[::]`: nobody can connect to it.
    Unspecified {
        /// Which one.
        side: AddrKind,
        /// The address.
        addr: HostPort,
    },
    /// A control address listed before.
    DuplicateControl {
        /// The address.
        control: HostPort,
        /// Where it was first.
        first_line: usize,
    },
    /// A data address another task already has.
    SharedData {
        /// The address.
        data: HostPort,
        /// The other task's control address.
        other_control: HostPort,
        /// The other task's line.
        other_line: usize,
    },
    /// A data address that is a control address (of this entry or another).
    DataIsControl {
        /// The address.
        data: HostPort,
        /// The line that has it as control address.
        control_line: usize,
    },
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProblemKind::TooLarge { bytes, limit } => {
                write!(
                    f,
                    "file too large ({bytes} bytes or more; the limit is {limit})"
                )
            }
            ProblemKind::LineTooLong => {
                write!(f, "line longer than {MAX_LINE_BYTES} bytes")
            }
            ProblemKind::NotUtf8 => f.write_str("line is not valid UTF-8"),
            ProblemKind::MissingSeparator { text } => write!(
                f,
                "expected control_host:port=data_host:port, found {:?}",
                Shorten(text)
            ),
            ProblemKind::TrailingText { text } => write!(
                f,
                "unexpected {:?} after the data address (comments start with '#')",
                Shorten(text)
            ),
            ProblemKind::BadAddress { side, text, error } => {
                write!(f, "{side} address {:?}: {error}", Shorten(text))
            }
            ProblemKind::Unspecified { side, addr } => write!(
                f,
                "{side} address {addr} is the unspecified address; peers cannot connect to it"
            ),
            ProblemKind::DuplicateControl {
                control,
                first_line,
            } => write!(
                f,
                "control address {control} is already mapped on line {first_line}"
            ),
            ProblemKind::SharedData {
                data,
                other_control,
                other_line,
            } => write!(
                f,
                "data address {data} is already used by {other_control} (line {other_line})"
            ),
            ProblemKind::DataIsControl { data, control_line } => write!(
                f,
                "data address {data} is also a control address (line {control_line}); \
                 a task needs two ports"
            ),
        }
    }
}

/// Shows at most 80 characters of user text.
struct Shorten<'a>(&'a str);

impl fmt::Debug for Shorten<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 80;
        match self.0.char_indices().nth(MAX) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => write!(f, "{:?}...", &self.0[..end]),
        }
    }
}

/// How the path of a map that could not be read was found, for the error's hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Found {
    /// Given by the caller ([`EndpointMap::load`]).
    Given,
    /// In the folder [`ENV_PATH`] names.
    Env,
    /// In the current folder, [`ENV_PATH`] being unset.
    CurrentFolder,
}

/// Why a map could not be loaded.
///
/// `Debug` is the message (`Display`), so that `?` in `main` prints the path and, for a
/// map looked for by [`Resolver::from_env`](crate::cluster::Resolver::from_env) or
/// [`Resolver::load_map`](crate::cluster::Resolver::load_map), how it was found:
/// `.endpoint_map: No such file or directory (os error 2) (looked for in the current
/// folder: give its path, or set TF_SEASTAR_ENDPOINT_MAP_PATH to its folder)`.
pub enum LoadError {
    /// The file could not be read.
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        error: io::Error,
        /// How the path was found.
        found: Found,
    },
    /// The file was read and has problems.
    Invalid(Vec<Problem>),
}

impl fmt::Debug for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Io { path, error, found } => {
                write!(f, "{}: {error}", path.display())?;
                match found {
                    Found::Given => Ok(()),
                    Found::Env => write!(f, " (the endpoint map, found through {ENV_PATH})"),
                    Found::CurrentFolder => write!(
                        f,
                        " (the endpoint map, looked for in the current folder: give its \
                         path, or set {ENV_PATH} to its folder)"
                    ),
                }
            }
            LoadError::Invalid(problems) => {
                for (i, p) in problems.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for LoadError {}

#[cfg(test)]
mod tests;
