//! Building: builder values, checks between settings, accessors, `Debug`, the table itself.

use super::*;

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
fn the_connect_schedule_adds_up_to_the_documented_bounds() {
    let c = Config::builder("worker", 0).build().unwrap();
    let ms = |n| Duration::from_millis(n);
    assert_eq!(
        (
            c.connect_retries(),
            c.connect_backoff(),
            c.handshake_timeout()
        ),
        (
            DEFAULT_CONNECT_RETRIES,
            DEFAULT_CONNECT_BACKOFF,
            DEFAULT_HANDSHAKE_TIMEOUT
        )
    );
    // The waits between attempts: retry n waits connect_delay(n).
    let waits: Vec<Duration> = (0..c.connect_retries())
        .map(|n| c.connect_delay(n))
        .collect();
    assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1280].map(ms));
    assert_eq!(c.connect_retry_wait(), waits.iter().sum::<Duration>());
    assert_eq!(c.connect_retry_wait(), ms(2_550));
    // Each of the 9 attempts may take up to handshake_timeout on top.
    let attempts = c.connect_retries() + 1;
    assert_eq!(
        c.connect_give_up_bound(),
        c.connect_retry_wait() + c.handshake_timeout() * attempts
    );
    assert_eq!(c.connect_give_up_bound(), ms(47_550));
    // No retries: no waiting between attempts, one attempt's time.
    let once = Config::builder("worker", 0)
        .connect_retries(0)
        .build()
        .unwrap();
    assert_eq!(once.connect_retry_wait(), Duration::ZERO);
    assert_eq!(once.connect_give_up_bound(), once.handshake_timeout());
    // Past the cap every retry waits the cap, and the sums saturate rather than wrap.
    let many = Config::builder("worker", 0)
        .connect_retries(10)
        .build()
        .unwrap();
    assert_eq!(
        many.connect_retry_wait(),
        ms(2_550) + CONNECT_BACKOFF_CAP * 2
    );
    let endless = Config::builder("worker", 0)
        .connect_retries(u32::MAX)
        .build()
        .unwrap();
    let capped = ms(2_550) + CONNECT_BACKOFF_CAP * (u32::MAX - 8);
    assert_eq!(endless.connect_retry_wait(), capped);
    assert!(endless.connect_give_up_bound() > capped);
}

#[test]
fn debug_hides_the_token() {
    let b = Config::builder("ps", 0).cluster_token(b"hunter2".to_vec());
    assert!(!format!("{b:?}").contains("104, 117"), "{b:?}");
    let c = b.build().unwrap();
    let shown = format!("{c:?}");
    assert!(shown.contains("<7 bytes, not shown>"), "{shown}");
    assert!(!shown.contains("104, 117"), "{shown}");
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
    assert_eq!(ENV_URING_FLAGS, crate::sys::uring::URING_FLAGS_ENV);
    // Options leave both to the config unless set.
    assert_eq!(crate::Options::default().zero_copy_min, None);
    assert_eq!(crate::Options::default().handler_threads, None);
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

#[test]
fn receive_budgets_default_to_a_quarter_of_memory_and_half_of_that_per_connection() {
    let c = Config::builder("ps", 0).build().unwrap();
    let total = c.recv_budget_bytes();
    assert!(total >= MIN_RECV_BUDGET, "{total}");
    assert_eq!(c.conn_recv_budget_bytes(), total / 2);
    let c = Config::builder("ps", 0)
        .recv_budget(8u64 << 20)
        .conn_recv_budget(64u64 << 20)
        .build()
        .unwrap();
    // A connection's part never exceeds the task's budget.
    assert_eq!(
        (c.recv_budget_bytes(), c.conn_recv_budget_bytes()),
        (8 << 20, 8 << 20)
    );
}
