//! Reading the environment: every variable, its spellings, its range ends and its errors.

use super::*;

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
            ("STARWIRE_STATS_ENDPOINT", "0"),
            ("STARWIRE_TRACE", "1"),
            ("STARWIRE_TRACE_EVENTS", "16777216"),
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
            ..Limits::default()
        }
    );
    assert_eq!(c.chunk_size, (1 << 30) - 64);
    assert_eq!(c.acc_size, 4096);
    assert_eq!(c.buf_size, 0);
    assert!(c.tensor_fuse);
    assert!(!c.stats_endpoint);
    assert!(c.trace);
    assert_eq!(c.trace_events, MAX_TRACE_EVENTS);
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
            ("STARWIRE_STATS_ENDPOINT", "1"),
            ("STARWIRE_TRACE", "no"),
            ("STARWIRE_TRACE_EVENTS", "1"),
            ("STARWIRE_RECV_BUFFER", "4096"),
            ("STARWIRE_MAX_INFLIGHT", "1"),
            ("STARWIRE_CONNECT_BACKOFF_MS", "1"),
            ("STARWIRE_CONNECTIONS_PER_PEER", "1"),
            ("STARWIRE_CLUSTER_ID", "007"),
        ],
    )
    .unwrap();
    assert_eq!(c.loops, Some(1));
    assert!(!c.polling && !c.pin && !c.tensor_fuse && c.stats_endpoint && !c.trace);
    assert_eq!(c.trace_events, 1);
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

#[test]
fn every_bool_variable_rejects_bad_values() {
    for (job, var) in [
        ("worker", "WORKER_ENABLE_POLLING"),
        ("worker", "WORKER_DISABLE_PIN_CORES"),
        ("ps", "PS_ENABLE_POLLING"),
        ("ps", "PS_DISABLE_PIN_CORES"),
        ("ps", ENV_TENSOR_FUSE),
        ("ps", ENV_STATS_ENDPOINT),
        ("ps", ENV_TRACE),
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
        ("ps", ENV_SEND_ARENA_KEEP, &["1073741825", "-1"]),
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
fn wire_features_are_all_none_or_names() {
    use crate::wire::WireFeatures;
    assert_eq!(config("ps", &[]).unwrap().wire_features, WireFeatures::ALL);
    for (text, want) in [
        ("all", WireFeatures::ALL),
        ("none", WireFeatures::NONE),
        ("row_formats", WireFeatures::ROW_FORMATS),
    ] {
        let c = config("worker", &[(ENV_WIRE_FEATURES, text)]).unwrap();
        assert_eq!(c.wire_features, want, "{text}");
    }
    for bad in ["", "ALL", "row_formats,", "versions", "row formats"] {
        assert_rejected("ps", ENV_WIRE_FEATURES, bad);
    }
    let err = error("ps", &[(ENV_WIRE_FEATURES, "bf16")]);
    assert!(err.to_string().contains("row_formats"), "{err}");
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
        ENV_URING_FLAGS,
        ENV_URING_FIXED_FILES,
        ENV_URING_DIRECT_ACCEPT,
        ENV_URING_RECV_BUFS,
        ENV_URING_RECV_BUNDLES,
        ENV_URING_RECV_INCREMENTAL,
        ENV_MAX_FRAME,
        ENV_MAX_KEY,
        ENV_MAX_TENSORS,
        ENV_MAX_RANK,
        ENV_MAX_TENSOR_BYTES,
        ENV_MAX_TABLES,
        ENV_MAX_ROWS,
        ENV_MAX_ROW_BYTES,
        ENV_CHUNK_SIZE,
        ENV_ACC_SIZE,
        ENV_SEND_ARENA_KEEP,
        ENV_BUF_SIZE,
        ENV_TENSOR_FUSE,
        ENV_RECV_BUFFER,
        ENV_MAX_INFLIGHT,
        ENV_CONNECT_RETRIES,
        ENV_CONNECT_BACKOFF_MS,
        ENV_CONNECTIONS_PER_PEER,
        ENV_HANDSHAKE_TIMEOUT_MS,
        ENV_FRAME_TIMEOUT_MS,
        ENV_PROGRESS_TIMEOUT_MS,
        ENV_HEARTBEAT_INTERVAL_MS,
        ENV_HEARTBEAT_TIMEOUT_MS,
        ENV_RECV_BUDGET,
        ENV_CONN_RECV_BUDGET,
        ENV_MAX_CONNECTIONS,
        ENV_MAX_SERVED,
        ENV_ANSWER_BACKLOG,
        ENV_CLOSE_LINGER_MS,
        ENV_ZERO_COPY_MIN,
        ENV_HANDLER_THREADS,
        ENV_STATS_ENDPOINT,
        ENV_TABLE_UPKEEP_MS,
        ENV_TRACE,
        ENV_TRACE_EVENTS,
        ENV_WIRE_FEATURES,
    ];
    // Every variable of the table is in the list.
    let table: Vec<&str> = table::rows()
        .iter()
        .map(|row| row.env.of(Role::Ps))
        .chain(LIMIT_FIELDS.iter().map(|f| f.env))
        .filter(|&name| name != ENV_CLUSTER_TOKEN && name != ENV_CHECKPOINT_DIR)
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
    // A path is bytes too; an empty one names nothing.
    let dir =
        |name: &str| (name == ENV_CHECKPOINT_DIR).then(|| OsString::from_vec(vec![b'/', 0xff]));
    let c = ConfigBuilder::from_lookup("ps", 0, dir)
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(
        c.checkpoint_dir()
            .map(|p| p.as_os_str().as_bytes().to_vec()),
        Some(vec![b'/', 0xff])
    );
    let empty = |name: &str| (name == ENV_CHECKPOINT_DIR).then(OsString::new);
    let err = ConfigBuilder::from_lookup("ps", 0, empty).unwrap_err();
    assert_eq!(
        (err.name(), err.expected()),
        (ENV_CHECKPOINT_DIR, "a directory")
    );
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
fn uring_flags_default_on_and_can_be_turned_off() {
    assert!(config("ps", &[]).unwrap().uring_flags);
    assert!(!config("ps", &[(ENV_URING_FLAGS, "0")]).unwrap().uring_flags);
    assert!(
        !config("worker", &[(ENV_URING_FLAGS, "false")])
            .unwrap()
            .uring_flags
    );
    assert_rejected("ps", ENV_URING_FLAGS, "off");
}

#[test]
fn uring_direct_accept_default_on_and_can_be_turned_off() {
    assert!(config("ps", &[]).unwrap().uring_direct_accept);
    let off = config("ps", &[(ENV_URING_DIRECT_ACCEPT, "false")]).unwrap();
    assert!(!off.uring_direct_accept);
    assert_rejected("worker", ENV_URING_DIRECT_ACCEPT, "maybe");
}

#[test]
fn uring_fixed_files_default_on_and_can_be_turned_off() {
    assert!(config("ps", &[]).unwrap().uring_fixed_files);
    let off = config("ps", &[(ENV_URING_FIXED_FILES, "0")]).unwrap();
    assert!(!off.uring_fixed_files);
    assert_rejected("worker", ENV_URING_FIXED_FILES, "off");
}

#[test]
fn uring_recv_bundles_default_off_and_can_be_turned_on() {
    assert!(!config("ps", &[]).unwrap().uring_recv_bundles);
    let on = config("ps", &[(ENV_URING_RECV_BUNDLES, "true")]).unwrap();
    assert!(on.uring_recv_bundles);
    assert_rejected("worker", ENV_URING_RECV_BUNDLES, "some");
}

#[test]
fn uring_recv_incremental_default_off_and_can_be_turned_on() {
    assert!(!config("ps", &[]).unwrap().uring_recv_incremental);
    let on = config("ps", &[(ENV_URING_RECV_INCREMENTAL, "true")]).unwrap();
    assert!(on.uring_recv_incremental);
    assert_rejected("worker", ENV_URING_RECV_INCREMENTAL, "some");
}

#[test]
fn uring_recv_bufs_default_256_zero_turns_multishot_receives_off() {
    assert_eq!(config("ps", &[]).unwrap().uring_recv_bufs, 256);
    let off = config("ps", &[(ENV_URING_RECV_BUFS, "0")]).unwrap();
    assert_eq!(off.uring_recv_bufs, 0);
    let most = config("ps", &[(ENV_URING_RECV_BUFS, "32768")]).unwrap();
    assert_eq!(most.uring_recv_bufs, 32768);
    assert_rejected("worker", ENV_URING_RECV_BUFS, "32769");
    assert_rejected("worker", ENV_URING_RECV_BUFS, "many");
}
