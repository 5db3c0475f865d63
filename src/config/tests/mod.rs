//! Unit tests of the config: every variable, every range end, every error message.

mod build;
mod env;

use super::*;
use std::collections::HashMap;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs
        .iter()
        .map(|&(k, v)| (k.to_owned(), OsString::from(v)))
        .collect();
    move |name| map.get(name).cloned()
}

fn config(job: &str, pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    ConfigBuilder::from_lookup(job, 0, lookup(pairs))?.build()
}

fn error(job: &str, pairs: &[(&str, &str)]) -> ConfigError {
    match config(job, pairs) {
        Ok(c) => panic!("{pairs:?} accepted: {c:?}"),
        Err(e) => e,
    }
}

fn assert_defaults(c: &Config) {
    assert_eq!(c.cluster_id, DEFAULT_CLUSTER_ID);
    assert_eq!(c.loops, None);
    assert_eq!(c.polling, DEFAULT_POLLING);
    assert_eq!(c.pin, DEFAULT_PIN);
    assert_eq!(c.spin, DEFAULT_SPIN);
    assert_eq!(c.backend, BackendChoice::Auto);
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.chunk_size, DEFAULT_CHUNK_SIZE);
    assert_eq!(c.acc_size, DEFAULT_ACC_SIZE);
    assert_eq!(c.buf_size, DEFAULT_BUF_SIZE);
    assert_eq!(c.tensor_fuse, DEFAULT_TENSOR_FUSE);
    assert_eq!(c.recv_buffer, DEFAULT_RECV_BUFFER);
    assert_eq!(c.max_inflight, DEFAULT_MAX_INFLIGHT);
    assert_eq!(c.connect_retries, DEFAULT_CONNECT_RETRIES);
    assert_eq!(c.connect_backoff, DEFAULT_CONNECT_BACKOFF);
    assert_eq!(c.connections_per_peer, DEFAULT_CONNECTIONS_PER_PEER);
    assert_eq!(c.cluster_token, None);
    assert_eq!(c.handshake_timeout, DEFAULT_HANDSHAKE_TIMEOUT);
    assert_eq!(c.frame_timeout, DEFAULT_FRAME_TIMEOUT);
    assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
    assert_eq!(c.max_served, DEFAULT_MAX_SERVED);
    assert_eq!(c.close_linger, DEFAULT_CLOSE_LINGER);
    assert_eq!(c.zero_copy_min, DEFAULT_ZERO_COPY_MIN);
    assert_eq!(c.handler_threads, DEFAULT_HANDLER_THREADS);
}

/// Values every variable of the kind rejects.
const BAD_BOOLS: &[&str] = &["", "maybe", "2", "-1", " true", "true ", "t", "on", "yes!"];
const BAD_NUMBERS: &[&str] = &[
    "",
    " ",
    "-1",
    "+1",
    "1.5",
    "12x",
    "0x10",
    "1_000",
    " 8",
    "8 ",
    "abc",
    "18446744073709551616",
    "99999999999999999999999999",
];

fn assert_rejected(job: &str, var: &str, value: &str) {
    let err = error(job, &[(var, value)]);
    assert_eq!(err.name(), var, "{var}={value:?}: {err}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("{var}=")), "{text}");
    assert!(text.contains(": expected "), "{text}");
    if var != ENV_CLUSTER_TOKEN {
        assert_eq!(err.value(), format!("{value:?}"), "{text}");
    }
}

fn with_loops(loops: Option<usize>) -> Config {
    Config::builder("ps", 0).loops(loops).build().unwrap()
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v
}
