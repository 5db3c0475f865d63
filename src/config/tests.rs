//! Unit tests of the config: every variable, every range end, every error message.

use super::*;
use std::collections::HashMap;
use std::os::unix::ffi::OsStringExt;

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

#[test]
fn defaults() {
    let c = Config::builder("ps", 3).build().unwrap();
    assert_eq!(c.job, "ps");
    assert_eq!(c.task_index, 3);
    assert_defaults(&c);
    assert_defaults(&config("worker", &[]).unwrap());
    // The documented values.
    assert_eq!(DEFAULT_SPIN, Duration::from_micros(50));
    assert_eq!(DEFAULT_CHUNK_SIZE, 4 * 1024 * 1024);
    assert_eq!(DEFAULT_ACC_SIZE, 256 * 1024);
    assert_eq!(DEFAULT_BUF_SIZE, 0);
    assert_eq!(DEFAULT_RECV_BUFFER, 64 * 1024);
    assert_eq!(
        (DEFAULT_POLLING, DEFAULT_PIN, DEFAULT_TENSOR_FUSE),
        (false, false, false)
    );
}

#[test]
fn every_variable_parsed() {
    let c = config(
        "ps",
        &[
            ("STARWIRE_CLUSTER_ID", "18446744073709551615"),
            ("NETWORK_PS_CORE_NUMBER", "8"),
            ("PS_ENABLE_POLLING", "True"),
            ("PS_DISABLE_PIN_CORES", "False"),
            ("STARWIRE_SPIN_US", "0"),
            ("STARWIRE_BACKEND", "epoll"),
            ("STARWIRE_MAX_FRAME", "1073741824"),
            ("STARWIRE_MAX_KEY", "65535"),
            ("STARWIRE_MAX_TENSORS", "16777216"),
            ("STARWIRE_MAX_RANK", "0"),
            ("STARWIRE_MAX_TENSOR_BYTES", "9223372036854775807"),
            ("STARWIRE_CHUNK_SIZE", "1073741760"),
            ("STARWIRE_ACC_SIZE", "4096"),
            ("STARWIRE_BUF_SIZE", "0"),
            ("STARWIRE_TENSOR_FUSE", "yes"),
            ("STARWIRE_RECV_BUFFER", "67108864"),
            ("STARWIRE_MAX_INFLIGHT", "4194304"),
            ("STARWIRE_CONNECT_RETRIES", "0"),
            ("STARWIRE_CONNECT_BACKOFF_MS", "60000"),
            ("STARWIRE_CONNECTIONS_PER_PEER", "4096"),
            ("STARWIRE_CLUSTER_TOKEN", "s3cret"),
            ("STARWIRE_HANDSHAKE_TIMEOUT_MS", "250"),
            ("STARWIRE_FRAME_TIMEOUT_MS", "1500"),
            ("STARWIRE_MAX_CONNECTIONS", "10"),
        ],
    )
    .unwrap();
    assert_eq!(c.cluster_id, u64::MAX);
    assert_eq!(c.loops, Some(8));
    assert!(c.polling);
    assert!(c.pin, "DISABLE_PIN_CORES=False pins");
    assert_eq!(c.spin, Duration::ZERO);
    assert_eq!(c.backend, BackendChoice::Epoll);
    assert_eq!(
        c.limits,
        Limits {
            max_frame: 1 << 30,
            max_key: u16::MAX,
            max_tensors: 1 << 24,
            max_rank: 0,
            max_tensor_bytes: i64::MAX as u64,
        }
    );
    assert_eq!(c.chunk_size, (1 << 30) - 64);
    assert_eq!(c.acc_size, 4096);
    assert_eq!(c.buf_size, 0);
    assert!(c.tensor_fuse);
    assert_eq!(c.recv_buffer, 64 << 20);
    assert_eq!(c.max_inflight, 1 << 22);
    assert_eq!(c.connect_retries, 0);
    assert_eq!(c.connect_backoff, Duration::from_secs(60));
    assert_eq!(c.connections_per_peer, 4096);
    assert_eq!(c.cluster_token.as_deref(), Some(&b"s3cret"[..]));
    assert_eq!(c.handshake_timeout, Duration::from_millis(250));
    assert_eq!(c.frame_timeout, Duration::from_millis(1500));
    assert_eq!(c.max_connections, 10);

    // The other ends of the ranges, and the other spellings.
    let c = config(
        "worker",
        &[
            ("NETWORK_WORKER_CORE_NUMBER", "1"),
            ("WORKER_ENABLE_POLLING", "0"),
            ("WORKER_DISABLE_PIN_CORES", "YES"),
            ("STARWIRE_SPIN_US", "10000000"),
            ("STARWIRE_BACKEND", "URING"),
            ("STARWIRE_MAX_FRAME", "65536"),
            ("STARWIRE_MAX_RANK", "32"),
            ("STARWIRE_CHUNK_SIZE", "4096"),
            ("STARWIRE_ACC_SIZE", "67108864"),
            ("STARWIRE_BUF_SIZE", "4096"),
            ("STARWIRE_TENSOR_FUSE", "no"),
            ("STARWIRE_RECV_BUFFER", "4096"),
            ("STARWIRE_MAX_INFLIGHT", "1"),
            ("STARWIRE_CONNECT_BACKOFF_MS", "1"),
            ("STARWIRE_CONNECTIONS_PER_PEER", "1"),
            ("STARWIRE_CLUSTER_ID", "007"),
        ],
    )
    .unwrap();
    assert_eq!(c.loops, Some(1));
    assert!(!c.polling && !c.pin && !c.tensor_fuse);
    assert_eq!(c.spin, MAX_SPIN);
    assert_eq!(c.backend, BackendChoice::Uring);
    assert_eq!(c.limits.max_frame, 65536);
    assert_eq!(c.limits.max_rank, 32);
    assert_eq!(c.chunk_size, 4096);
    assert_eq!(c.acc_size, 64 << 20);
    assert_eq!(c.buf_size, 4096);
    assert_eq!(c.recv_buffer, 4096);
    assert_eq!(c.max_inflight, 1);
    assert_eq!(c.connect_backoff, Duration::from_millis(1));
    assert_eq!(c.cluster_id, 7);

    for (value, expected) in [
        ("true", true),
        ("TRUE", true),
        ("1", true),
        ("Yes", true),
        ("false", false),
        ("fAlSe", false),
        ("0", false),
        ("NO", false),
    ] {
        let c = config("ps", &[("STARWIRE_TENSOR_FUSE", value)]).unwrap();
        assert_eq!(c.tensor_fuse, expected, "{value}");
    }
    let c = config("ps", &[("STARWIRE_BACKEND", "auto")]).unwrap();
    assert_eq!(c.backend, BackendChoice::Auto);
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

#[test]
fn every_bool_variable_rejects_bad_values() {
    for (job, var) in [
        ("worker", "WORKER_ENABLE_POLLING"),
        ("worker", "WORKER_DISABLE_PIN_CORES"),
        ("ps", "PS_ENABLE_POLLING"),
        ("ps", "PS_DISABLE_PIN_CORES"),
        ("ps", ENV_TENSOR_FUSE),
    ] {
        for bad in BAD_BOOLS {
            assert_rejected(job, var, bad);
        }
    }
    assert_eq!(
        error("ps", &[("PS_ENABLE_POLLING", "maybe")]).to_string(),
        "PS_ENABLE_POLLING=\"maybe\": expected true or false (or 1/0, yes/no)"
    );
}

#[test]
fn every_number_variable_rejects_bad_and_out_of_range_values() {
    // (job, variable, values out of range)
    let cases: &[(&str, &str, &[&str])] = &[
        ("ps", ENV_CLUSTER_ID, &[]),
        ("ps", "NETWORK_PS_CORE_NUMBER", &["0", "1025"]),
        ("chief", "NETWORK_WORKER_CORE_NUMBER", &["0", "100000"]),
        ("ps", ENV_SPIN_US, &["10000001"]),
        ("ps", ENV_MAX_FRAME, &["0", "65535", "1073741825"]),
        ("ps", ENV_MAX_KEY, &["0", "65536"]),
        ("ps", ENV_MAX_TENSORS, &["0", "16777217"]),
        ("ps", ENV_MAX_RANK, &["33", "256"]),
        ("ps", ENV_MAX_TENSOR_BYTES, &["9223372036854775808"]),
        ("ps", ENV_CHUNK_SIZE, &["0", "4095", "1073741761"]),
        ("ps", ENV_ACC_SIZE, &["0", "4095", "67108865"]),
        ("ps", ENV_BUF_SIZE, &["1", "4095"]),
        ("ps", ENV_RECV_BUFFER, &["0", "4095", "67108865"]),
        ("ps", ENV_MAX_INFLIGHT, &["0", "4194305"]),
        ("ps", ENV_CONNECT_RETRIES, &["4294967296"]),
        ("ps", ENV_CONNECT_BACKOFF_MS, &["0", "60001"]),
        ("ps", ENV_CONNECTIONS_PER_PEER, &["0", "4097"]),
        ("ps", ENV_HANDSHAKE_TIMEOUT_MS, &["0", "600001"]),
        ("ps", ENV_FRAME_TIMEOUT_MS, &["0", "3600001"]),
        ("ps", ENV_MAX_CONNECTIONS, &["0", "1048577"]),
        ("ps", ENV_MAX_SERVED, &["0", "1048577"]),
        ("ps", ENV_CLOSE_LINGER_MS, &["0", "60001"]),
        ("ps", ENV_ZERO_COPY_MIN, &[]),
        ("ps", ENV_HANDLER_THREADS, &["1025"]),
    ];
    for &(job, var, out_of_range) in cases {
        for bad in BAD_NUMBERS.iter().chain(out_of_range) {
            assert_rejected(job, var, bad);
        }
    }
    assert_eq!(
        error("ps", &[(ENV_RECV_BUFFER, "1k")]).to_string(),
        "STARWIRE_RECV_BUFFER=\"1k\": expected a decimal number of bytes from 4096 to 67108864"
    );
}

#[test]
fn backend_and_token_reject_bad_values() {
    for bad in ["", " ", "io-uring", "kqueue", "epoll2"] {
        assert_rejected("ps", ENV_BACKEND, bad);
    }
    let long = "x".repeat(MAX_CLUSTER_TOKEN + 1);
    for bad in ["", long.as_str()] {
        let err = error("ps", &[(ENV_CLUSTER_TOKEN, bad)]);
        assert_eq!(err.name(), ENV_CLUSTER_TOKEN);
        assert!(
            !err.to_string().contains("xxx"),
            "the token is not shown: {err}"
        );
    }
    let max = "y".repeat(MAX_CLUSTER_TOKEN);
    let c = config("ps", &[(ENV_CLUSTER_TOKEN, &max)]).unwrap();
    assert_eq!(c.cluster_token.unwrap().len(), MAX_CLUSTER_TOKEN);
}

#[test]
fn non_utf8_is_rejected_naming_the_variable() {
    let vars = [
        ENV_CLUSTER_ID,
        "NETWORK_PS_CORE_NUMBER",
        "PS_ENABLE_POLLING",
        "PS_DISABLE_PIN_CORES",
        ENV_SPIN_US,
        ENV_BACKEND,
        ENV_MAX_FRAME,
        ENV_MAX_KEY,
        ENV_MAX_TENSORS,
        ENV_MAX_RANK,
        ENV_MAX_TENSOR_BYTES,
        ENV_CHUNK_SIZE,
        ENV_ACC_SIZE,
        ENV_BUF_SIZE,
        ENV_TENSOR_FUSE,
        ENV_RECV_BUFFER,
        ENV_MAX_INFLIGHT,
        ENV_CONNECT_RETRIES,
        ENV_CONNECT_BACKOFF_MS,
        ENV_CONNECTIONS_PER_PEER,
        ENV_HANDSHAKE_TIMEOUT_MS,
        ENV_FRAME_TIMEOUT_MS,
        ENV_MAX_CONNECTIONS,
        ENV_MAX_SERVED,
        ENV_CLOSE_LINGER_MS,
        ENV_ZERO_COPY_MIN,
        ENV_HANDLER_THREADS,
    ];
    // Every variable of the table is in the list.
    let table: Vec<&str> = table::rows()
        .iter()
        .map(|row| row.env.of(Role::Ps))
        .chain(LIMIT_FIELDS.iter().map(|f| f.env))
        .filter(|&name| name != ENV_CLUSTER_TOKEN)
        .collect();
    assert_eq!(
        sorted(table),
        sorted(vars.to_vec()),
        "variables of the table"
    );
    for var in vars {
        let bad = move |name: &str| (name == var).then(|| OsString::from_vec(vec![b'1', 0xff]));
        let err = ConfigBuilder::from_lookup("ps", 0, bad).unwrap_err();
        assert_eq!(err.name(), var);
        assert!(err.expected().starts_with("valid UTF-8"), "{err}");
    }
    // A token is bytes: any bytes.
    let token =
        |name: &str| (name == ENV_CLUSTER_TOKEN).then(|| OsString::from_vec(vec![0xff, 0, 0xfe]));
    let c = ConfigBuilder::from_lookup("ps", 0, token)
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(c.cluster_token, Some(vec![0xff, 0, 0xfe]));
}

#[test]
fn role_prefix() {
    for job in ["worker", "chief"] {
        assert_eq!(Role::of_job(job), Role::Worker);
        let c = config(
            job,
            &[
                ("WORKER_ENABLE_POLLING", "true"),
                ("NETWORK_WORKER_CORE_NUMBER", "3"),
                ("WORKER_DISABLE_PIN_CORES", "false"),
                // The other family is not read.
                ("PS_ENABLE_POLLING", "garbage"),
                ("NETWORK_PS_CORE_NUMBER", "garbage"),
                ("PS_DISABLE_PIN_CORES", "garbage"),
            ],
        )
        .unwrap();
        assert_eq!(c.role_prefix(), "WORKER");
        assert!(c.polling && c.pin);
        assert_eq!(c.loops, Some(3));
    }
    for job in ["ps", "evaluator", "Worker", "workers", "chief-0"] {
        assert_eq!(Role::of_job(job), Role::Ps, "{job}");
        let c = config(
            job,
            &[
                ("PS_ENABLE_POLLING", "1"),
                ("NETWORK_PS_CORE_NUMBER", "5"),
                ("PS_DISABLE_PIN_CORES", "0"),
                ("WORKER_ENABLE_POLLING", "garbage"),
                ("NETWORK_WORKER_CORE_NUMBER", "garbage"),
                ("WORKER_DISABLE_PIN_CORES", "garbage"),
            ],
        )
        .unwrap();
        assert_eq!(c.role_prefix(), "PS");
        assert!(c.polling && c.pin);
        assert_eq!(c.loops, Some(5));
    }
    assert_eq!(Role::Worker.loops_env(), "NETWORK_WORKER_CORE_NUMBER");
    assert_eq!(Role::Ps.disable_pin_env(), "PS_DISABLE_PIN_CORES");
}

#[test]
fn builder_overrides_env() {
    let env = lookup(&[
        ("PS_ENABLE_POLLING", "true"),
        ("NETWORK_PS_CORE_NUMBER", "4"),
        ("PS_DISABLE_PIN_CORES", "false"),
        ("STARWIRE_SPIN_US", "7"),
        ("STARWIRE_BACKEND", "uring"),
        ("STARWIRE_MAX_FRAME", "1048576"),
        ("STARWIRE_CHUNK_SIZE", "8192"),
        ("STARWIRE_CLUSTER_TOKEN", "from-env"),
        ("STARWIRE_CLUSTER_ID", "5"),
        ("STARWIRE_HANDSHAKE_TIMEOUT_MS", "10"),
    ]);
    let c = ConfigBuilder::from_lookup("ps", 1, env)
        .unwrap()
        .polling(false)
        .loops(None)
        .pin(false)
        .spin(Duration::from_micros(1))
        .backend(BackendChoice::Epoll)
        .limits(Limits::default())
        .chunk_size(1 << 20)
        .cluster_token(None)
        .cluster_id(9)
        .handshake_timeout(Duration::from_secs(1))
        .acc_size(8192)
        .buf_size(0)
        .tensor_fuse(true)
        .recv_buffer(1 << 20)
        .max_inflight(10)
        .connect_retries(1)
        .connect_backoff(Duration::from_millis(3))
        .connections_per_peer(2)
        .build()
        .unwrap();
    assert!(!c.polling && !c.pin && c.tensor_fuse);
    assert_eq!(c.loops, None);
    assert_eq!(c.spin, Duration::from_micros(1));
    assert_eq!(c.backend, BackendChoice::Epoll);
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.chunk_size, 1 << 20);
    assert_eq!(c.cluster_token, None);
    assert_eq!(c.cluster_id, 9);
    assert_eq!(c.handshake_timeout, Duration::from_secs(1));
    assert_eq!(
        (c.acc_size, c.buf_size, c.recv_buffer, c.max_inflight),
        (8192, 0, 1 << 20, 10)
    );
    assert_eq!(c.connect_retries, 1);
    assert_eq!(c.connect_backoff, Duration::from_millis(3));
    assert_eq!(c.connections_per_peer, 2);

    // Fields the builder leaves alone keep the environment's value.
    let c = ConfigBuilder::from_lookup("ps", 1, lookup(&[("STARWIRE_SPIN_US", "7")]))
        .unwrap()
        .polling(true)
        .build()
        .unwrap();
    assert_eq!(c.spin, Duration::from_micros(7));
}

#[test]
fn buf_size_must_hold_one_receive_buffer() {
    let e = error("ps", &[("STARWIRE_BUF_SIZE", "8192")]);
    let msg = e.to_string();
    assert!(msg.contains("STARWIRE_BUF_SIZE"), "{msg}");
    assert!(msg.contains("\"8192\""), "{msg}");
    assert!(msg.contains("65536 bytes"), "{msg}");
    let e = error("ps", &[("STARWIRE_BUF_SIZE", "1073741825")]);
    assert!(e.to_string().contains("1073741824"), "{e}");
    let c = config(
        "ps",
        &[
            ("STARWIRE_BUF_SIZE", "8192"),
            ("STARWIRE_RECV_BUFFER", "8192"),
        ],
    )
    .unwrap();
    assert_eq!((c.buf_size, c.recv_buffer), (8192, 8192));
    assert_eq!(config("ps", &[]).unwrap().buf_size, 0, "off by default");
}

#[test]
fn builder_values_are_validated_and_named() {
    let b = || Config::builder("ps", 0);
    let cases: Vec<(ConfigBuilder, &str)> = vec![
        (b().loops(0), "ConfigBuilder::loops"),
        (b().loops(MAX_LOOPS + 1), "ConfigBuilder::loops"),
        (
            b().spin(MAX_SPIN + Duration::from_nanos(1)),
            "ConfigBuilder::spin",
        ),
        (b().chunk_size(4095), "ConfigBuilder::chunk_size"),
        (b().acc_size(MAX_ACC_SIZE + 1), "ConfigBuilder::acc_size"),
        (b().buf_size(1), "ConfigBuilder::buf_size"),
        (b().buf_size(MAX_BUF_SIZE + 1), "ConfigBuilder::buf_size"),
        (b().buf_size(32 << 10), "ConfigBuilder::buf_size"),
        (b().recv_buffer(0), "ConfigBuilder::recv_buffer"),
        (b().max_inflight(0), "ConfigBuilder::max_inflight"),
        (
            b().connect_backoff(Duration::from_micros(999)),
            "ConfigBuilder::connect_backoff",
        ),
        (
            b().connections_per_peer(0),
            "ConfigBuilder::connections_per_peer",
        ),
        (
            b().cluster_token(Vec::new()),
            "ConfigBuilder::cluster_token",
        ),
        (
            b().cluster_token(vec![7; MAX_CLUSTER_TOKEN + 1]),
            "ConfigBuilder::cluster_token",
        ),
        (
            b().handshake_timeout(Duration::ZERO),
            "ConfigBuilder::handshake_timeout",
        ),
        (
            b().limits(Limits {
                max_frame: 1000,
                ..Limits::default()
            }),
            "ConfigBuilder::limits.max_frame",
        ),
        (
            b().limits(Limits {
                max_rank: 33,
                ..Limits::default()
            }),
            "ConfigBuilder::limits.max_rank",
        ),
        (Config::builder("", 0), "job"),
        (Config::builder("p s", 0), "job"),
        (Config::builder(&"j".repeat(MAX_JOB_LEN + 1), 0), "job"),
    ];
    for (builder, name) in cases {
        let err = builder.build().unwrap_err();
        assert_eq!(err.name(), name, "{err}");
    }
    assert_eq!(
        b().connect_backoff(Duration::ZERO)
            .build()
            .unwrap_err()
            .to_string(),
        "ConfigBuilder::connect_backoff=0ns: expected a duration from 1ms to 60s"
    );
    assert!(Config::builder(&"j".repeat(MAX_JOB_LEN), 0).build().is_ok());
    assert!(Config::builder("Worker_2-b", 0).build().is_ok());
}

#[test]
fn chunk_size_must_fit_max_frame() {
    // From the environment: the chunk variable is named, with the frame it must fit.
    let err = error(
        "ps",
        &[(ENV_MAX_FRAME, "1048576"), (ENV_CHUNK_SIZE, "1048576")],
    );
    assert_eq!(err.name(), ENV_CHUNK_SIZE);
    assert_eq!(err.value(), "\"1048576\"");
    assert!(err.expected().contains("1048512"), "{err}");
    assert!(err.expected().contains(ENV_MAX_FRAME), "{err}");
    assert!(config(
        "ps",
        &[(ENV_MAX_FRAME, "1048576"), (ENV_CHUNK_SIZE, "1048512")]
    )
    .is_ok());

    // From code.
    let small = Limits {
        max_frame: 1 << 20,
        ..Limits::default()
    };
    let err = Config::builder("ps", 0)
        .limits(small)
        .chunk_size(2 << 20)
        .build()
        .unwrap_err();
    assert_eq!(err.name(), "ConfigBuilder::chunk_size");
    // Against the default max_frame.
    let err = Config::builder("ps", 0)
        .chunk_size(1 << 30)
        .build()
        .unwrap_err();
    assert!(err.expected().contains("default max_frame"), "{err}");

    // An unset chunk size follows a small max_frame down, to a multiple of 4 KiB.
    let c = Config::builder("ps", 0).limits(small).build().unwrap();
    assert_eq!(c.chunk_size, (1 << 20) - 4096);
    let c = config("ps", &[(ENV_MAX_FRAME, "65536")]).unwrap();
    assert_eq!(c.chunk_size, 61440);
    let c = config("ps", &[(ENV_MAX_FRAME, "1073741824")]).unwrap();
    assert_eq!(c.chunk_size, DEFAULT_CHUNK_SIZE);
}

fn with_loops(loops: Option<usize>) -> Config {
    Config::builder("ps", 0).loops(loops).build().unwrap()
}

#[test]
fn loop_count_explicit_and_clamped() {
    assert_eq!(with_loops(Some(4)).loop_count(100, 64), 4);
    assert_eq!(
        with_loops(Some(4)).loop_count(1, 64),
        4,
        "explicit ignores connections"
    );
    assert_eq!(
        with_loops(Some(32)).loop_count(100, 64),
        32,
        "explicit may exceed 16"
    );
    assert_eq!(
        with_loops(Some(8)).loop_count(100, 2),
        2,
        "clamped to the CPUs"
    );
    assert_eq!(with_loops(Some(8)).loop_count(100, 0), 1);
}

#[test]
fn loop_count_default_is_min_16_connections_cpus() {
    let c = with_loops(None);
    for (connections, cpus, expected) in [
        (1, 2, 1),
        (8, 2, 2),
        (100, 2, 2),
        (1, 64, 1),
        (8, 64, 8),
        (100, 64, 16),
        (0, 64, 1),
        (100, 0, 1),
    ] {
        assert_eq!(
            c.loop_count(connections, cpus),
            expected,
            "{connections} connections, {cpus} CPUs"
        );
    }
}

#[test]
fn connect_delay_doubles_up_to_the_cap() {
    let c = Config::builder("ps", 0).build().unwrap();
    let ms = |n| Duration::from_millis(n);
    assert_eq!(c.connect_delay(0), ms(10));
    assert_eq!(c.connect_delay(1), ms(20));
    assert_eq!(c.connect_delay(7), ms(1280));
    assert_eq!(c.connect_delay(8), CONNECT_BACKOFF_CAP);
    assert_eq!(c.connect_delay(u32::MAX), CONNECT_BACKOFF_CAP);
    let slow = Config::builder("ps", 0)
        .connect_backoff(ms(5000))
        .build()
        .unwrap();
    assert_eq!(slow.connect_delay(0), ms(5000));
    assert_eq!(slow.connect_delay(3), ms(5000));
}

#[test]
fn debug_hides_the_token() {
    let b = Config::builder("ps", 0).cluster_token(b"hunter2".to_vec());
    assert!(!format!("{b:?}").contains("104"), "{b:?}");
    let c = b.build().unwrap();
    let shown = format!("{c:?}");
    assert!(shown.contains("<7 bytes, not shown>"), "{shown}");
    assert!(!shown.contains("104, 117"), "{shown}");
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v
}

#[test]
fn new_settings_parse_check_and_build() {
    let c = config(
        "ps",
        &[
            (ENV_MAX_SERVED, "1"),
            (ENV_CLOSE_LINGER_MS, "60000"),
            (ENV_ZERO_COPY_MIN, "18446744073709551615"),
            (ENV_HANDLER_THREADS, "1024"),
        ],
    )
    .unwrap();
    assert_eq!(c.max_served(), 1);
    assert_eq!(c.close_linger(), Duration::from_secs(60));
    assert_eq!(c.zero_copy_min(), u64::MAX);
    assert_eq!(c.handler_threads(), 1024);
    let c = config(
        "ps",
        &[
            (ENV_MAX_SERVED, "1048576"),
            (ENV_CLOSE_LINGER_MS, "1"),
            (ENV_ZERO_COPY_MIN, "0"),
            (ENV_HANDLER_THREADS, "0"),
        ],
    )
    .unwrap();
    assert_eq!(
        (
            c.max_served,
            c.close_linger,
            c.zero_copy_min,
            c.handler_threads
        ),
        (1 << 20, Duration::from_millis(1), 0, 0)
    );

    // The builder overrides the environment and is checked.
    let c = ConfigBuilder::from_lookup("ps", 0, lookup(&[(ENV_HANDLER_THREADS, "3")]))
        .unwrap()
        .handler_threads(2)
        .zero_copy_min(4096)
        .max_served(10)
        .close_linger(Duration::from_millis(250))
        .build()
        .unwrap();
    assert_eq!(
        (
            c.handler_threads,
            c.zero_copy_min,
            c.max_served,
            c.close_linger
        ),
        (2, 4096, 10, Duration::from_millis(250))
    );
    let b = || Config::builder("ps", 0);
    for (builder, name) in [
        (b().max_served(0), "ConfigBuilder::max_served"),
        (
            b().close_linger(Duration::ZERO),
            "ConfigBuilder::close_linger",
        ),
        (
            b().handler_threads(MAX_HANDLER_THREADS + 1),
            "ConfigBuilder::handler_threads",
        ),
    ] {
        assert_eq!(builder.build().unwrap_err().name(), name);
    }
    assert_eq!(
        b().close_linger(Duration::from_secs(61))
            .build()
            .unwrap_err()
            .to_string(),
        "ConfigBuilder::close_linger=61s: expected a duration from 1ms to 60s"
    );
    assert_eq!(
        error("ps", &[(ENV_MAX_SERVED, "0")]).to_string(),
        "STARWIRE_MAX_SERVED=\"0\": expected a decimal number of requests from 1 to 1048576"
    );
}

#[test]
fn accessors_return_the_built_values() {
    let c = Config::builder("worker", 7)
        .cluster_id(5)
        .loops(3)
        .polling(true)
        .pin(true)
        .spin(Duration::from_micros(9))
        .backend(BackendChoice::Epoll)
        .chunk_size(8192)
        .acc_size(8192)
        .buf_size(1 << 20)
        .tensor_fuse(true)
        .recv_buffer(8192)
        .max_inflight(11)
        .connect_retries(2)
        .connect_backoff(Duration::from_millis(4))
        .connections_per_peer(3)
        .cluster_token(b"tok".to_vec())
        .handshake_timeout(Duration::from_millis(6))
        .frame_timeout(Duration::from_millis(7))
        .max_connections(12)
        .build()
        .unwrap();
    assert_eq!(
        (c.job(), c.task_index(), c.role()),
        ("worker", 7, Role::Worker)
    );
    assert_eq!((c.cluster_id(), c.loops()), (5, Some(3)));
    assert!(c.polling() && c.pin() && c.tensor_fuse());
    assert_eq!(c.spin(), Duration::from_micros(9));
    assert_eq!(c.backend(), BackendChoice::Epoll);
    assert_eq!(c.limits(), Limits::default());
    assert_eq!(
        (c.chunk_size(), c.acc_size(), c.buf_size(), c.recv_buffer()),
        (8192, 8192, 1 << 20, 8192)
    );
    assert_eq!((c.max_inflight(), c.connect_retries()), (11, 2));
    assert_eq!(c.connect_backoff(), Duration::from_millis(4));
    assert_eq!(c.connections_per_peer(), 3);
    assert_eq!(c.cluster_token(), Some(&b"tok"[..]));
    assert_eq!(c.handshake_timeout(), Duration::from_millis(6));
    assert_eq!(c.frame_timeout(), Duration::from_millis(7));
    assert_eq!(c.max_connections(), 12);
}

#[test]
fn table_names_agree_with_the_rest_of_the_crate() {
    assert_eq!(ENV_BACKEND, crate::sys::BACKEND_ENV);
    for role in [Role::Worker, Role::Ps] {
        let p = role.prefix();
        assert_eq!(role.polling_env(), format!("{p}_ENABLE_POLLING"));
        assert_eq!(role.loops_env(), format!("NETWORK_{p}_CORE_NUMBER"));
        assert_eq!(role.disable_pin_env(), format!("{p}_DISABLE_PIN_CORES"));
    }
    // No variable is read by two settings.
    for role in [Role::Worker, Role::Ps] {
        let mut names: Vec<&str> = table::rows()
            .iter()
            .map(|row| row.env.of(role))
            .chain(LIMIT_FIELDS.iter().map(|f| f.env))
            .collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "{names:?}");
    }
    // Each limit's getter and setter address the same field.
    for (i, f) in LIMIT_FIELDS.iter().enumerate() {
        let mut l = Limits::default();
        (f.set)(&mut l, f.lo + 1);
        assert_eq!((f.get)(&l), f.lo + 1, "{}", f.field);
        for (j, other) in LIMIT_FIELDS.iter().enumerate() {
            if i != j {
                assert_eq!(
                    (other.get)(&l),
                    (other.get)(&Limits::default()),
                    "{}",
                    other.field
                );
            }
        }
    }
}

#[test]
fn debug_shows_every_setting() {
    let c = Config::builder("ps", 0).build().unwrap();
    let shown = format!("{c:?}");
    for row in table::rows() {
        let name = row.method[1..].split('(').next().unwrap();
        assert!(shown.contains(&format!("{name}: ")), "{name} in {shown}");
    }
    assert!(shown.contains("close_linger: 1s"), "{shown}");
    assert!(shown.contains("cluster_token: None"), "{shown}");
}
