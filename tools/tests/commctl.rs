//! commctl end to end: the real binary, real sockets, real files.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A port nothing listens on (bound, then released).
fn dead_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a.to_string()
}

// ---------------------------------------------------------------------------------------
// Help and usage.

#[test]
fn help_for_every_subcommand() {
    let r = run(&mut commctl(&["--help"]));
    assert_eq!(r.code, 0);
    for word in [
        "validate",
        "ping",
        "serve",
        "bench",
        "endpoint-map",
        "wait",
        "stats",
        "checkpoint",
        "Error codes:",
    ] {
        assert!(r.stdout.contains(word), "{word}: {}", r.stdout);
    }
    for sub in [
        "validate",
        "ping",
        "serve",
        "bench",
        "endpoint-map",
        "wait",
        "stats",
        "checkpoint",
    ] {
        let r = run(&mut commctl(&[sub, "--help"]));
        assert_eq!(r.code, 0, "{sub}");
        assert!(
            r.stdout.starts_with(&format!("Usage: commctl {sub}")),
            "{}",
            r.stdout
        );
        let r = run(&mut commctl(&[sub, "-h"]));
        assert_eq!(r.code, 0, "{sub} -h");
    }
    let r = run(&mut commctl(&["-V"]));
    assert_eq!(r.code, 0);
    assert!(r.stdout.starts_with("commctl "));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["ping"],
        &["ping", "-c", "x", "127.0.0.1:1"],
        &["ping", "-W", "0", "127.0.0.1:1"],
        &["ping", "not an address"],
        &["ping", "ps:0"],
        &["bench", "-d", "forever", "127.0.0.1:1"],
        &["serve"],
        &["serve", "--listen", "300.1.1.1:5"],
    ] {
        let r = run(&mut commctl(args));
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(!r.stderr.is_empty(), "{args:?}");
        assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.stderr);
    }
}

#[test]
fn target_errors_say_what_failed() {
    // A task name without a cluster spec: 2, with the options that give one.
    let r = run(&mut commctl(&["ping", "/job:ps/task:0"]));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        "commctl: /job:ps/task:0: a task name, but no cluster spec is given (give --cluster, \
         --ps-hosts or --worker-hosts, or set TF_CONFIG)\n"
    );
    // A job the spec does not have; the map is not needed to say so.
    let r = run(&mut commctl(&[
        "ping",
        "/job:chief/task:0",
        "--ps-hosts",
        "10.1.1.1:2222",
        "--endpoint-map",
        "/nonexistent",
    ]));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        "commctl: /job:chief/task:0: the cluster spec from the command line has no job \
         \"chief\" (it has ps)\n"
    );
    // A host name with no address: 3, as for a peer that cannot be reached.
    let r = run(&mut commctl(&[
        "ping",
        "-c",
        "1",
        "no-such-host.invalid:5555",
    ]));
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with("commctl: no-such-host.invalid:5555: cannot resolve the host name: "),
        "{}",
        r.stderr
    );
}

// ---------------------------------------------------------------------------------------
// validate.

const GOOD_MAP: &str = "\
# ps
10.0.0.1:2222=10.0.0.1:5555
10.0.0.2:2222=10.0.0.2:5555

# workers
10.0.0.3:2222=10.0.0.3:5555   # worker 0
10.0.0.4:2222=10.0.0.4:5555
";

#[test]
fn validate_a_good_map_from_each_place() {
    let dir = Scratch::new("validate-good");
    dir.file(".endpoint_map", GOOD_MAP);
    // Explicit file, explicit folder, TF_SEASTAR_ENDPOINT_MAP_PATH, current folder.
    let file = dir.0.join(".endpoint_map");
    for cmd in [
        commctl(&["validate", file.to_str().unwrap()]),
        commctl(&["validate", dir.0.to_str().unwrap()]),
        {
            let mut c = commctl(&["validate"]);
            c.env("TF_SEASTAR_ENDPOINT_MAP_PATH", &dir.0);
            c
        },
        {
            let mut c = commctl(&["validate"]);
            c.current_dir(&dir.0);
            c
        },
    ]
    .iter_mut()
    {
        let r = run(cmd);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains("OK, 4 entries"), "{}", r.stdout);
    }
}

#[test]
fn validate_reports_every_problem_with_file_and_line() {
    let dir = Scratch::new("validate-bad");
    let bad = dir.file(
        "map",
        "10.0.0.1:2222=10.0.0.1:5555\n\
         10.0.0.2:2222=10.0.0.2:0\n\
         10.0.0.3:2222 10.0.0.3:5555\n\
         10.0.0.1:2222=10.0.0.9:5555\n\
         10.0.0.4:2222=10.0.0.1:5555\n\
         10.0.0.5:2222=10.0.0.1:2222\n\
         10.0.0.6:2222=10.0.0.6:5555 worker 3\n\
         10.0.0.7:99999=10.0.0.7:5555\n\
         ::1:2222=[::1]:5555\n",
    );
    let path = bad.to_str().unwrap();
    let r = run(&mut commctl(&["validate", path]));
    assert_eq!(r.code, 1, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 9, "{}", r.stdout);
    for (i, want) in [
        (2, "port 0 is not allowed"),
        (3, "expected control_host:port=data_host:port"),
        (
            4,
            "control address 10.0.0.1:2222 is already mapped on line 1",
        ),
        (
            5,
            "data address 10.0.0.1:5555 is already used by 10.0.0.1:2222 (line 1)",
        ),
        (
            6,
            "data address 10.0.0.1:2222 is also a control address (line 1)",
        ),
        (7, "unexpected \"worker 3\" after the data address"),
        (8, "port out of range (1-65535)"),
        (9, "must be in brackets"),
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = format!("{path}:{}: ", want.0);
        assert!(
            lines[i].starts_with(&prefix) && lines[i].contains(want.1),
            "line {i}: {:?}",
            lines[i]
        );
    }
    assert_eq!(lines[8], "8 problems found");

    let r = run(&mut commctl(&["validate", path, "--json"]));
    assert_eq!(r.code, 1);
    assert!(r.stdout.starts_with("{\"valid\":false,"), "{}", r.stdout);
    assert!(r.stdout.contains(
        "\"line\":2,\"message\":\"data address \\\"10.0.0.2:0\\\": port 0 is not allowed\""
    ));
    assert_eq!(r.stdout.matches("\"line\":").count(), 8);
}

#[test]
fn validate_a_cluster_spec_against_the_map() {
    let dir = Scratch::new("validate-cluster");
    let map = dir.file(".endpoint_map", GOOD_MAP);
    let map = map.to_str().unwrap();
    let r = run(&mut commctl(&[
        "validate",
        map,
        "--ps-hosts",
        "10.0.0.1:2222,10.0.0.2:2222",
        "--worker-hosts",
        "10.0.0.3:2222,10.0.0.4:2222",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("4 tasks, every one mapped"));
    assert!(
        r.stdout.contains("worker:1  10.0.0.4:2222  10.0.0.4:5555"),
        "{}",
        r.stdout
    );

    // A task without an entry is named by job and index.
    let r = run(&mut commctl(&[
        "validate",
        map,
        "--cluster",
        "ps=10.0.0.1:2222",
        "--cluster",
        "worker=10.0.0.3:2222,10.0.0.9:2222",
    ]));
    assert_eq!(r.code, 1);
    assert!(
        r.stdout
            .contains("worker:1 (10.0.0.9:2222) has no entry in"),
        "{}",
        r.stdout
    );

    // A task whose line has a problem of its own (here a data address another line has):
    // that line is reported once, not again as a task without an entry.
    let shared = dir.file(
        "shared_map",
        "127.0.0.1:2222=127.0.0.1:5555\n127.0.0.1:2223=127.0.0.1:5555\n",
    );
    for json in [false, true] {
        let mut cmd = commctl(&[
            "validate",
            shared.to_str().unwrap(),
            "--ps-hosts",
            "127.0.0.1:2222,127.0.0.1:2223",
        ]);
        if json {
            cmd.arg("--json");
        }
        let r = run(&mut cmd);
        assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
        assert!(!r.stdout.contains("has no entry"), "{}", r.stdout);
        if json {
            assert_eq!(r.stdout.matches("\"message\"").count(), 1, "{}", r.stdout);
        } else {
            assert_eq!(
                r.stdout,
                format!(
                    "{}:2: data address 127.0.0.1:5555 is already used by 127.0.0.1:2222 \
                     (line 1)\n1 problem found\n",
                    shared.display()
                )
            );
        }
    }

    // TF_CONFIG, as a training operator sets it.
    let tf = r#"{"cluster": {"ps": ["10.0.0.1:2222", "10.0.0.2:2222"],
                 "worker": ["10.0.0.3:2222", "10.0.0.4:2222"]},
                 "task": {"type": "worker", "index": 1}, "environment": "cloud"}"#;
    let r = run(commctl(&["validate", map, "--tf-config", "--json"]).env("TF_CONFIG", tf));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("\"source\":\"TF_CONFIG\",\"task\":\"worker:1\""),
        "{}",
        r.stdout
    );
    assert!(r
        .stdout
        .contains("{\"task\":\"ps:1\",\"control\":\"10.0.0.2:2222\",\"data\":\"10.0.0.2:5555\"}"));

    // Bad TF_CONFIG: the byte offset of the JSON error; bad content: every problem.
    let r = run(commctl(&["validate", map, "--tf-config"]).env("TF_CONFIG", r#"{"cluster": ["#));
    assert_eq!(r.code, 1);
    assert!(
        r.stdout.starts_with("TF_CONFIG: invalid JSON at byte 13: "),
        "{}",
        r.stdout
    );
    let r = run(commctl(&["validate", map, "--tf-config"]).env(
        "TF_CONFIG",
        r#"{"cluster": {"ps": ["10.0.0.1:0"], "worker": ["10.0.0.3:2222", 5]}}"#,
    ));
    assert_eq!(r.code, 1);
    assert!(r
        .stdout
        .contains("TF_CONFIG: ps:0: address \"10.0.0.1:0\": port 0 is not allowed"));
    assert!(r
        .stdout
        .contains("TF_CONFIG: worker:1: expected a \"host:port\" string"));

    // Options that contradict, a variable that is not set, a file that is not there: 2.
    let r = run(&mut commctl(&[
        "validate",
        map,
        "--tf-config",
        "--ps-hosts",
        "a:1",
    ]));
    assert_eq!(r.code, 2);
    let r = run(&mut commctl(&["validate", map, "--tf-config"]));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("TF_CONFIG is not set"));
    let r = run(commctl(&["validate"])
        .current_dir(&dir.0)
        .env("TF_SEASTAR_ENDPOINT_MAP_PATH", "/nonexistent"));
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("/nonexistent/.endpoint_map: "),
        "{}",
        r.stderr
    );
}

#[test]
fn validate_survives_hostile_files() {
    let dir = Scratch::new("validate-hostile");
    let mut junk = Vec::new();
    for i in 0..5000u32 {
        junk.extend_from_slice(&i.to_le_bytes());
        junk.extend_from_slice(b"=[:\n\r\xff\x00#");
    }
    std::fs::write(dir.0.join("junk"), &junk).unwrap();
    let r = run(&mut commctl(&[
        "validate",
        dir.0.join("junk").to_str().unwrap(),
    ]));
    assert_eq!(r.code, 1);
    assert!(!r.stderr.contains("panicked"));
    // A folder without a map in it.
    let r = run(&mut commctl(&["validate", dir.0.to_str().unwrap()]));
    assert_eq!(r.code, 2);
}

// ---------------------------------------------------------------------------------------
// serve, ping, bench.

#[test]
fn ping_a_server_by_address_and_by_task() {
    let mut server = Server::start(&["--listen", "127.0.0.1:0", "--loops", "1"], &[]);
    let addr = server.addr.to_string();
    let r = run(&mut commctl(&["ping", "-c", "3", "-i", "0.05", &addr]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], format!("PING {addr}: 56 payload bytes"));
    for (i, seq) in [1, 2, 3].iter().enumerate() {
        let want = format!("56 bytes from {addr}: seq={seq} time=");
        assert!(lines[1 + i].starts_with(&want), "{:?}", lines[1 + i]);
    }
    assert_eq!(lines[5], format!("--- {addr} ping statistics ---"));
    assert!(lines[6].starts_with("3 pings sent, 3 replies received, 0% loss, time "));
    assert!(
        lines[7].starts_with("rtt min/avg/p50/p99/max = "),
        "{}",
        lines[7]
    );

    // job:index through the cluster spec and the endpoint map.
    let dir = Scratch::new("ping-task");
    dir.file(
        ".endpoint_map",
        &format!("10.1.1.1:2222={addr}\n10.1.1.2:2222=127.0.0.1:1\n"),
    );
    let r = run(commctl(&[
        "ping",
        "-c",
        "2",
        "-i",
        "0.01",
        "-s",
        "1000",
        "-q",
        "ps:0",
        "--ps-hosts",
        "10.1.1.1:2222",
        "--worker-hosts",
        "10.1.1.2:2222",
    ])
    .current_dir(&dir.0));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .starts_with(&format!("PING ps:0 ({addr}): 1000 payload bytes")),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("2 pings sent, 2 replies received"));
    // The same through TF_CONFIG, and the device form.
    let tf = r#"{"cluster": {"ps": ["10.1.1.1:2222"], "worker": ["10.1.1.2:2222"]}}"#;
    let r = run(commctl(&["ping", "-c", "1", "/job:ps/task:0"])
        .env("TF_CONFIG", tf)
        .env("TF_SEASTAR_ENDPOINT_MAP_PATH", &dir.0));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // A task the spec does not have.
    let r = run(commctl(&["ping", "-c", "1", "ps:3"])
        .env("TF_CONFIG", tf)
        .current_dir(&dir.0));
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("ps:3 is not in the cluster spec from TF_CONFIG"),
        "{}",
        r.stderr
    );

    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("SIGTERM: stopped"), "{stderr}");
}

#[test]
fn ping_errors_have_distinct_exit_codes() {
    // Nothing listening: 3.
    let dead = dead_addr();
    let r = run(&mut commctl(&["ping", "-c", "2", "-W", "3", &dead]));
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        r.stderr,
        format!(
            "commctl: {dead}: could not connect: connection refused (is a starwire server \
             listening there?)\n"
        )
    );

    // Handshake refused (another cluster id): 4.
    let mut server = Server::start(
        &["--listen", "127.0.0.1:0", "--loops", "1"],
        &[("STARWIRE_CLUSTER_ID", "7")],
    );
    let addr = server.addr.to_string();
    let r = run(commctl(&["ping", "-c", "1", &addr]).env("STARWIRE_CLUSTER_ID", "8"));
    assert_eq!(r.code, 4, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("refused the handshake: cluster id differs"),
        "{}",
        r.stderr
    );
    let r = run(commctl(&["ping", "-c", "1", &addr]).env("STARWIRE_CLUSTER_ID", "7"));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let (code, _) = server.signal("INT");
    assert_eq!(code, 0);

    // Something that accepts and never answers: 5.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let r = run(&mut commctl(&[
        "ping", "-c", "2", "-i", "0.1", "-W", "0.3", &addr,
    ]));
    assert_eq!(r.code, 5, "{}{}", r.stdout, r.stderr);
    for seq in [1, 2] {
        let want = format!("from {addr}: seq={seq} no reply within 0.3 s");
        assert!(r.stdout.contains(&want), "{}", r.stdout);
    }
    assert!(
        r.stdout
            .contains("2 pings sent, 0 replies received, 100% loss"),
        "{}",
        r.stdout
    );
    drop(silent);
}

#[test]
fn bench_a_server_and_its_own() {
    let server = Server::start(&["--listen", "127.0.0.1:0", "--loops", "1"], &[]);
    let addr = server.addr.to_string();
    let pid = server.child.id().to_string();
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-d",
        "300ms",
        "-p",
        "4",
        "-C",
        "2",
        "-s",
        "128",
        "--server-pid",
        &pid,
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for word in [
        "requests",
        "req/s",
        "GB/s",
        "p50",
        "p99",
        "p999",
        "client CPU",
        "server CPU",
        "loop time    client loops: busy",
        "idle awake",
    ] {
        assert!(r.stdout.contains(word), "{word}: {}", r.stdout);
    }
    assert!(!r.stdout.contains("unknown (give --server-pid)"));
    // Not a terminal: no progress line.
    assert!(!r.stderr.contains('\r'), "{:?}", r.stderr);

    let r = run(&mut commctl(&["bench", &addr, "-n", "500", "--json"]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.starts_with("{\"operation\":\"ping\","),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("\"ok\":500,\"failed\":0"), "{}", r.stdout);
    assert!(r.stdout.contains("\"server_cpu_seconds\":null"));
    // A ping carries no tensors, and its report says nothing of them.
    assert!(!r.stdout.contains("tensor"), "{}", r.stdout);

    // Without a target bench starts its own server and knows its CPU time.
    let r = run(&mut commctl(&["bench", "-n", "300", "--json"]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("\"server_started_by_bench\":true"));
    assert!(
        !r.stdout.contains("\"server_cpu_seconds\":null"),
        "{}",
        r.stdout
    );

    // Operations that are not there, and flags that do not fit the operation.
    let r = run(&mut commctl(&["bench", &addr, "-o", "frob"]));
    assert_eq!(r.code, 2);
    assert_eq!(
        r.stderr,
        "commctl: -o frob: unknown operation (supported: ping, pull, push, recv, \
         fused-recv, pull-rows, push-rows)\n"
    );
    let r = run(&mut commctl(&["bench", &addr, "-o", "recv", "-k", "4"]));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("use -o fused-recv"), "{}", r.stderr);
    let r = run(&mut commctl(&["bench", &addr, "-o", "pull", "-k", "0"]));
    assert_eq!(r.code, 2, "{}", r.stderr);

    // Nothing listening.
    let r = run(&mut commctl(&["bench", &dead_addr(), "-n", "10"]));
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
}

#[test]
fn serve_as_a_task_of_the_cluster() {
    let dir = Scratch::new("serve-task");
    // A free port for the data address.
    let data = dead_addr();
    dir.file(".endpoint_map", &format!("10.2.2.1:2222={data}\n"));
    let tf = r#"{"cluster": {"ps": ["10.2.2.1:2222"]}, "task": {"type": "ps", "index": 0}}"#;
    let mut cmd_env = [("TF_CONFIG", tf), ("TF_SEASTAR_ENDPOINT_MAP_PATH", "")];
    let p = dir.0.to_str().unwrap().to_owned();
    cmd_env[1].1 = &p;
    let mut server = Server::start(&["--tf-config", "--loops", "1"], &cmd_env);
    assert_eq!(server.addr.to_string(), data);
    // The task TF_CONFIG names, not the default.
    assert!(
        server
            .line
            .starts_with(&format!("listening on {data} as ps:0 (1 event loop")),
        "{}",
        server.line
    );
    let r = run(&mut commctl(&["ping", "-c", "1", &data]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let (code, _) = server.signal("INT");
    assert_eq!(code, 0);
    // A task without an entry in the map: named in the error.
    let r = run(commctl(&[
        "serve",
        "--task",
        "ps:1",
        "--ps-hosts",
        "10.2.2.1:2222,10.2.2.2:2222",
    ])
    .current_dir(&dir.0));
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("ps:1 (10.2.2.2:2222) has no entry in"),
        "{}",
        r.stderr
    );
}

/// The integer `"key":N` of a one-line JSON report.
fn json_int(json: &str, key: &str) -> i64 {
    let pat = format!("\"{key}\":");
    let at = json
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + pat.len();
    let digits: String = json[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not an integer in {json}"))
}

#[test]
fn bench_every_tensor_operation_against_serve() {
    let mut server = Server::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--tensors",
            "64",
            "--tensor-size",
            "1000",
        ],
        &[],
    );
    let addr = server.addr.to_string();
    let pid = server.child.id().to_string();
    // recv and fused-recv twice: a second run receives the same keys again.
    let mut received = 0;
    for (op, k) in [
        ("pull", "8"),
        ("push", "8"),
        ("recv", "1"),
        ("fused-recv", "16"),
        ("recv", "1"),
        ("fused-recv", "16"),
    ] {
        let r = run(&mut commctl(&[
            "bench",
            &addr,
            "-o",
            op,
            "-k",
            k,
            "--tensor-size",
            "1000",
            "--variables",
            "64",
            "-d",
            "300ms",
            "-p",
            "8",
            "--server-pid",
            &pid,
            "--json",
        ]));
        assert_eq!(r.code, 0, "{op}: {}{}", r.stdout, r.stderr);
        let j = r.stdout.trim();
        assert!(j.starts_with(&format!("{{\"operation\":\"{op}\",")), "{j}");
        let ok = json_int(j, "ok");
        assert!(ok > 0, "{op}: {j}");
        assert_eq!(json_int(j, "failed"), 0, "{op}: {j}");
        assert!(j.contains("\"errors\":[]"), "{j}");
        let k: i64 = k.parse().unwrap();
        assert_eq!(json_int(j, "tensors"), ok * k, "{op}: {j}");
        assert_eq!(json_int(j, "bytes"), ok * k * 1000, "{op}: {j}");
        if op.contains("recv") {
            received += ok * k;
        }
        assert!(!j.contains("\"server_cpu_seconds\":null"), "{j}");
    }

    // The table names tensors/s and bandwidth.
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "pull",
        "-k",
        "4",
        "--variables",
        "64",
        "-n",
        "50",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for word in [
        "4 ids per request",
        "tensors/s",
        "GB/s of tensor bytes received",
        "p999",
    ] {
        assert!(r.stdout.contains(word), "{word}: {}", r.stdout);
    }

    // Ids past the store, and pushes of the wrong size: answered with an error status,
    // exit 1 (requests failed), not a transport error.
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "pull",
        "--variables",
        "100",
        "-k",
        "100",
        "-n",
        "3",
        "--json",
    ]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert_eq!(json_int(&r.stdout, "failed"), 3, "{}", r.stdout);
    assert!(r.stdout.contains("NotFound"), "{}", r.stdout);
    assert!(r.stdout.contains("\"latency_ms\":null"), "{}", r.stdout);
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "push",
        "--tensor-size",
        "999",
        "-n",
        "3",
        "--json",
    ]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("InvalidArgument"), "{}", r.stdout);

    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.starts_with("commctl serve: SIGTERM: stopped after "),
        "{stderr}"
    );
    // Every tensor the recvs took, not the keys published at start.
    assert!(
        stderr.contains(&format!(" {received} tensors taken by recvs")),
        "{received}: {stderr}"
    );
}

#[test]
fn bench_starts_a_server_with_the_tensor_flags() {
    let r = run(&mut commctl(&[
        "bench",
        "-o",
        "fused-recv",
        "-k",
        "4",
        "--variables",
        "16",
        "--tensor-size",
        "256",
        "-d",
        "200ms",
        "--json",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let ok = json_int(&r.stdout, "ok");
    assert!(ok > 0, "{}", r.stdout);
    assert_eq!(json_int(&r.stdout, "bytes"), ok * 4 * 256, "{}", r.stdout);
}

#[test]
fn serve_rejects_bad_store_flags() {
    for args in [
        &["serve", "-l", "127.0.0.1:0", "--tensors", "0"][..],
        &["serve", "-l", "127.0.0.1:0", "--tensor-size", "2000000000"][..],
        &[
            "serve",
            "-l",
            "127.0.0.1:0",
            "--tensors",
            "1048576",
            "--tensor-size",
            "1048576",
        ][..],
    ] {
        let r = run(&mut commctl(args));
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
    }
}

// ---------------------------------------------------------------------------------------
// Rows: serve's table, bench's pull-rows and push-rows.

/// `commctl bench ADDR -o OP ARGS... --json` against `server`; the report, checked to have
/// every request ok and `k` rows of `row_bytes` in each.
fn bench_rows(server: &Server, op: &str, k: i64, row_bytes: i64, args: &[&str]) -> String {
    let addr = server.addr.to_string();
    let pid = server.child.id().to_string();
    let k_text = k.to_string();
    let mut cmd = commctl(&[
        "bench",
        &addr,
        "-o",
        op,
        "-k",
        &k_text,
        "--server-pid",
        &pid,
    ]);
    cmd.args(args).arg("--json");
    let r = run(&mut cmd);
    assert_eq!(r.code, 0, "{op} {args:?}: {}{}", r.stdout, r.stderr);
    let j = r.stdout.trim().to_owned();
    assert!(j.starts_with(&format!("{{\"operation\":\"{op}\",")), "{j}");
    let ok = json_int(&j, "ok");
    assert!(ok > 0, "{op}: {j}");
    assert_eq!(json_int(&j, "failed"), 0, "{op}: {j}");
    assert!(j.contains("\"errors\":[]"), "{j}");
    assert_eq!(json_int(&j, "rows_per_request"), k, "{j}");
    assert_eq!(json_int(&j, "row_bytes"), row_bytes, "{j}");
    assert_eq!(json_int(&j, "rows"), ok * k, "{op}: {j}");
    assert_eq!(json_int(&j, "bytes"), ok * k * row_bytes, "{op}: {j}");
    for key in [
        "rows_per_second",
        "client_cpu_ns_per_row",
        "server_cpu_ns_per_row",
    ] {
        assert!(j.contains(&format!("\"{key}\":")), "{key}: {j}");
    }
    assert!(!j.contains("\"server_cpu_ns_per_row\":null"), "{j}");
    assert!(!j.contains("\"tensors\":"), "{j}");
    // The client loops' accounting over the run: they worked, and every part is there. (No
    // bound against the wall time: a park under way at the first snapshot is counted
    // whole when it ends, however long the bench thread waited to take that snapshot.)
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    let t = &v["client_loop_time"];
    let part = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k} in {j}"));
    assert!(part("busy_seconds") > 0.0, "{j}");
    for k in ["spin_seconds", "parked_seconds"] {
        assert!(part(k) >= 0.0, "{k}: {j}");
    }
    assert!(t["parks"].is_u64(), "{j}");
    j
}

#[test]
fn bench_rows_operations_against_serve() {
    // Rows start missing, so that the first pulls report them.
    let mut server = Server::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--table",
            "7",
            "--dim",
            "16",
            "--init",
            "missing",
            "--rows",
            "0",
        ],
        &[],
    );
    let (mut pulled, mut pushed, mut missing) = (0, 0, 0);
    // Nothing pushed yet: every row pulled is missing.
    let j = bench_rows(
        &server,
        "pull-rows",
        100,
        64,
        &[
            "--table",
            "7",
            "--row-bytes",
            "64",
            "--id-range",
            "1000",
            "-d",
            "300ms",
            "-p",
            "4",
        ],
    );
    pulled += json_int(&j, "rows");
    missing += json_int(&j, "missing");
    assert_eq!(json_int(&j, "missing"), json_int(&j, "rows"), "{j}");
    // Pushes of 1000 rows (--dim 16 is --row-bytes 64) create the rows they name.
    let j = bench_rows(
        &server,
        "push-rows",
        1000,
        64,
        &[
            "--table",
            "7",
            "--dim",
            "16",
            "--id-range",
            "1000",
            "-n",
            "20",
            "-p",
            "4",
        ],
    );
    assert_eq!(json_int(&j, "ok"), 20, "{j}");
    pushed += json_int(&j, "rows");
    // The ids are the same sequence every run: the first 1000 pulled are the first 1000
    // pushed, so none is missing now.
    let j = bench_rows(
        &server,
        "pull-rows",
        100,
        64,
        &["--table", "7", "--id-range", "1000", "-n", "10", "-p", "1"],
    );
    assert_eq!(json_int(&j, "missing"), 0, "{j}");
    pulled += json_int(&j, "rows");

    // The table says rows/s, the row bytes and CPU time per row.
    let addr = server.addr.to_string();
    let pid = server.child.id().to_string();
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "pull-rows",
        "-k",
        "100",
        "--table",
        "7",
        "--id-range",
        "1000",
        "-n",
        "50",
        "--server-pid",
        &pid,
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    pulled += 50 * 100;
    for word in [
        "pull-rows to ",
        "100 rows of 64 B per request (table 7, ids in 0..1000, uniform)",
        "working set  1000 rows, ",
        "req/s",
        "rows/s",
        "GB/s of row bytes received",
        "ns per row",
        "p999",
    ] {
        assert!(r.stdout.contains(word), "{word}: {}", r.stdout);
    }
    assert_eq!(r.stdout.matches("ns per row").count(), 2, "{}", r.stdout);

    // A table the server does not serve, rows of another size: answered with an error
    // status (exit 1), with a hint; nothing reaches the table.
    for (args, status, hint) in [
        (&["--table", "8"][..], "NotFound", "--table must be one"),
        (
            &["--table", "7", "--dim", "8"][..],
            "InvalidArgument",
            "--dim or --row-bytes",
        ),
    ] {
        for op in ["pull-rows", "push-rows"] {
            let mut cmd = commctl(&["bench", &addr, "-o", op, "-k", "10", "-n", "3"]);
            let r = run(cmd.args(args));
            assert_eq!(r.code, 1, "{op} {args:?}: {}{}", r.stdout, r.stderr);
            assert!(r.stdout.contains("0 ok, 3 failed"), "{}", r.stdout);
            assert!(r.stdout.contains(status), "{}", r.stdout);
            assert!(r.stdout.contains(hint), "{}", r.stdout);
            // Nothing succeeded: said so, with no rates, latencies or CPU shares of it.
            assert!(r.stdout.contains("no request succeeded"), "{}", r.stdout);
            for figure in ["req/s", "  latency  ", "% of one CPU", "loop time"] {
                assert!(!r.stdout.contains(figure), "{figure}: {}", r.stdout);
            }
        }
    }

    // The server counted exactly what bench did.
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    let want = format!(
        "table 7: {pulled} rows pulled ({missing} missing), {pushed} rows pushed, 1000 rows \
         stored"
    );
    assert!(stderr.contains(&want), "{want}: {stderr}");
}

#[test]
fn bench_rows_starts_a_server_with_its_row_size() {
    // Rows of 32 B: the server bench starts serves rows of 8 f32.
    for (op, size) in [("pull-rows", "--row-bytes"), ("push-rows", "--dim")] {
        let value = if size == "--dim" { "8" } else { "32" };
        let r = run(&mut commctl(&[
            "bench", "-o", op, "-k", "1000", size, value, "-d", "200ms", "--json",
        ]));
        assert_eq!(r.code, 0, "{op}: {}{}", r.stdout, r.stderr);
        let ok = json_int(&r.stdout, "ok");
        assert!(ok > 0, "{}", r.stdout);
        assert_eq!(json_int(&r.stdout, "row_bytes"), 32, "{}", r.stdout);
        assert_eq!(json_int(&r.stdout, "bytes"), ok * 1000 * 32, "{}", r.stdout);
        assert!(r.stdout.contains("\"server_started_by_bench\":true"));
        assert!(
            !r.stdout.contains("\"server_cpu_ns_per_row\":null"),
            "{}",
            r.stdout
        );
    }
}

/// Bytes per row of a `PsTable` of rows of 16 f32 stored as `stored`, with `optimizer`.
fn ps_bytes_per_row(
    stored: starwire::rows::ps::Float,
    optimizer: starwire::rows::ps::Optimizer,
) -> i64 {
    let t = starwire::rows::PsTable::builder(16)
        .stored_as(stored)
        .optimizer(optimizer)
        .max_rows(1)
        .build()
        .unwrap();
    t.bytes_per_row() as i64
}

/// The `fits_in` a bench report gives for `bytes` on this machine.
fn fits_in(bytes: i64) -> &'static str {
    use starwire_tools::cpu;
    cpu::fit(bytes as u64, &cpu::caches()).name()
}

#[test]
fn serve_makes_its_rows_at_start_and_bench_pulls_them() {
    use starwire::rows::ps::{Float, Optimizer};
    let mut server = Server::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--rows",
            "2000",
            "--init",
            "uniform:0.5:3",
            "--stored",
            "bf16",
            "--optimizer",
            "adagrad",
        ],
        &[],
    );
    assert!(
        server
            .line
            .contains("table 1: PsTable, rows of 16 f32 (64 B; stored as bf16), uniform:0.5:3"),
        "{}",
        server.line
    );
    // The table's report, then where its rows came from.
    let report = server.next_line();
    assert!(
        report.starts_with("table 1: 16 x Bf16 (served F32), adagrad; slot "),
        "{report}"
    );
    assert!(report.contains("huge pages: "), "{report}");
    let made = server.next_line();
    assert!(
        made.starts_with("table 1: 2000 rows made at start: ids 0..2000, init uniform:0.5:3, in "),
        "{made}"
    );
    assert!(made.contains(" in memory: "), "{made}");
    // Uniform ids over the 2,000 rows, then skewed ones: every row pulled exists.
    let per_row = ps_bytes_per_row(
        Float::Bf16,
        Optimizer::Adagrad {
            lr: 0.01,
            initial_accumulator: 0.1,
        },
    );
    let mut pulled = 0;
    for zipf in [None, Some("1.1")] {
        let mut args = vec![
            "--rows",
            "2000",
            "-n",
            "30",
            "--stored",
            "bf16",
            "--optimizer",
            "adagrad",
        ];
        args.extend(zipf.map(|s| ["--zipf", s]).into_iter().flatten());
        let j = bench_rows(&server, "pull-rows", 500, 64, &args);
        pulled += json_int(&j, "rows");
        assert_eq!(json_int(&j, "missing"), 0, "{j}");
        assert_eq!(json_int(&j, "table_rows"), 2000, "{j}");
        assert_eq!(json_int(&j, "id_range"), 2000, "{j}");
        // The working set: the table's bytes for 2,000 rows, and where they fit.
        let bytes = json_int(&j, "working_set_bytes");
        assert_eq!(bytes, 2000 * per_row, "{j}");
        let fit = fits_in(bytes);
        assert!(j.contains(&format!("\"fits_in\":\"{fit}\"")), "{fit}: {j}");
        match zipf {
            Some(s) => assert!(j.contains(&format!("\"zipf\":{s}")), "{j}"),
            None => assert!(j.contains("\"zipf\":null"), "{j}"),
        }
    }
    // The header says the same for people.
    let addr = server.addr.to_string();
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "pull-rows",
        "-k",
        "10",
        "-n",
        "5",
        "--rows",
        "2000",
        "--zipf",
        "1.1",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    pulled += 50;
    for words in [
        "(table 1, ids in 0..2000, zipf 1.1)",
        "working set  2000 rows, ",
        "as a PsTable of f32 rows with sgd (90 B a row): ",
        "with skewed ids most requests touch far fewer rows",
    ] {
        assert!(r.stdout.contains(words), "{words}: {}", r.stdout);
    }
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    let want =
        format!("table 1: {pulled} rows pulled (0 missing), 0 rows pushed, 2000 rows stored");
    assert!(stderr.contains(&want), "{want}: {stderr}");
}

#[test]
fn serve_the_small_table_to_compare_with() {
    let mut server = Server::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--table-kind",
            "mem",
            "--rows",
            "500",
        ],
        &[],
    );
    assert!(
        server.line.contains("table 1: MemTable, rows of 16 f32"),
        "{}",
        server.line
    );
    // No report line: the rows' line comes next.
    let made = server.next_line();
    assert!(
        made.starts_with("table 1: 500 rows made at start"),
        "{made}"
    );
    assert!(made.contains("; about "), "{made}");
    let j = bench_rows(
        &server,
        "pull-rows",
        100,
        64,
        &["--rows", "500", "-n", "4", "--table-kind", "mem"],
    );
    assert_eq!(json_int(&j, "missing"), 0, "{j}");
    // A MemTable's row: its values and its hash-map entry, about.
    assert_eq!(json_int(&j, "working_set_bytes"), 500 * (64 + 16), "{j}");
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("table 1: 400 rows pulled (0 missing), 0 rows pushed, 500 rows stored"),
        "{stderr}"
    );
}

#[test]
fn serve_loads_its_table_from_a_checkpoint_folder() {
    use starwire_tools::bench::row_id;
    let dir = Scratch::new("checkpoint");
    let dir_text = dir.0.to_str().unwrap().to_owned();
    let file = dir.0.join("table-1.swrows");
    let args = |more: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--checkpoint-dir",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(dir_text.clone());
        v.extend(more.iter().map(|s| s.to_string()));
        v
    };
    // No checkpoint there yet: the rows are made, and the line says so.
    let first = args(&["--rows", "100"]);
    let server = Server::start(&refs(&first), &[]);
    server.next_line();
    let made = server.next_line();
    let want = format!(
        "table 1: 100 rows made at start (no checkpoint {} yet)",
        file.display()
    );
    assert!(made.starts_with(&want), "{want}: {made}");
    drop(server);

    // A checkpoint of table 1 written by the library: rows 0..50, row i all i.
    let table = starwire::rows::PsTable::builder(16)
        .table_id(1)
        .build()
        .unwrap();
    let ids: Vec<u64> = (0..50).collect();
    let values: Vec<f32> = ids.iter().flat_map(|&i| [i as f32; 16]).collect();
    table.load_rows(&ids, &values, None).unwrap();
    table.save(&dir.0).unwrap();
    // Loaded at start instead of --rows; ids past 50 are missing (--init missing).
    let second = args(&["--rows", "1000", "--init", "missing"]);
    let mut server = Server::start(&refs(&second), &[]);
    server.next_line();
    let loaded = server.next_line();
    let want = format!("table 1: 50 rows loaded from {} in ", file.display());
    assert!(loaded.starts_with(&want), "{want}: {loaded}");
    let j = bench_rows(
        &server,
        "pull-rows",
        100,
        64,
        &["--rows", "100", "-n", "1", "-p", "1"],
    );
    let expect_missing = (0..100).filter(|&k| row_id(k, 100) >= 50).count() as i64;
    assert_eq!(json_int(&j, "missing"), expect_missing, "{j}");
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("rows pushed, 50 rows stored"), "{stderr}");

    // A file of another shape: serve does not start, and names the file and the mismatch.
    let third = args(&["--dim", "8"]);
    let mut cmd = commctl(&["serve"]);
    let r = run(cmd.args(refs(&third)));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("table-1.swrows"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("wrong shape: dim 16 in the file, 8 in the table"),
        "{}",
        r.stderr
    );
}

#[test]
fn rows_flags_are_checked() {
    let dead = dead_addr();
    for (args, says) in [
        (
            &["-o", "pull-rows", "--row-bytes", "63"][..],
            "multiple of 4",
        ),
        (
            &["-o", "pull-rows", "--row-bytes", "64", "--dim", "16"][..],
            "give one",
        ),
        (&["-o", "push-rows", "--dim", "0"][..], "expected 1 to"),
        (&["-o", "pull-rows", "-k", "0"][..], "rows per request"),
        (
            &["-o", "pull-rows", "-k", "2000000"][..],
            "rows per request",
        ),
        (&["-o", "pull-rows", "--id-range", "0"][..], "--id-range 0"),
        (&["-o", "pull-rows", "--rows", "0"][..], "--rows 0"),
        (
            &["-o", "pull-rows", "--rows", "5", "--id-range", "5"][..],
            "give one",
        ),
        (&["-o", "pull-rows", "--zipf", "0"][..], "--zipf 0"),
        (&["-o", "pull-rows", "--zipf", "nan"][..], "--zipf NaN"),
        (&["--table-kind", "hash"][..], "expected ps"),
        (&["--stored", "f64"][..], "expected f32, bf16 or f16"),
    ] {
        let mut cmd = commctl(&["bench", &dead]);
        let r = run(cmd.args(args));
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
    for args in [
        &["--dim", "0"][..],
        &["--init", "gaussian"][..],
        &["--init", "uniform:-1"][..],
        &["--optimizer", "rmsprop"][..],
        &["--lr", "0"][..],
        &["--initial-accumulator", "-1"][..],
        &["--table-kind", "hash"][..],
        &["--stored", "f8"][..],
        &["--rows", "-1"][..],
        &["--rows", "5000000000"][..],
        &["--table-kind", "mem", "--stored", "bf16"][..],
        &["--table-kind", "mem", "--optimizer", "adam"][..],
        &["--table-kind", "mem", "--init", "normal"][..],
        &["--table-kind", "mem", "--checkpoint-dir", "/tmp"][..],
    ] {
        let mut cmd = commctl(&["serve", "-l", "127.0.0.1:0"]);
        let r = run(cmd.args(args));
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        if args.contains(&"mem") {
            assert!(r.stderr.contains("needs --table-kind ps"), "{}", r.stderr);
        }
    }
}

#[test]
fn serve_says_what_table_it_serves() {
    let r = run(&mut commctl(&["serve", "--help"]));
    assert_eq!(r.code, 0);
    for word in [
        "--table",
        "--dim",
        "--init",
        "--optimizer",
        "--lr",
        "pull-rows",
        "MemTable",
        "PsTable",
        "--table-kind",
        "--rows",
        "--stored",
        "--checkpoint-dir",
    ] {
        assert!(r.stdout.contains(word), "{word}: {}", r.stdout);
    }
    let mut server = Server::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--table",
            "3",
            "--dim",
            "4",
            "--init",
            "uniform:0.5:9",
            "--optimizer",
            "adagrad",
            "--lr",
            "0.05",
        ],
        &[],
    );
    assert!(
        server.line.trim_end().ends_with(
            "tensors of 4096 B; table 3: PsTable, rows of 4 f32 (16 B), uniform:0.5:9, adagrad \
             lr 0.05 initial accumulator 0.1)"
        ),
        "{}",
        server.line
    );
    let (code, stderr) = server.signal("INT");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("table 3: 0 rows pulled (0 missing), 0 rows pushed, 100000 rows stored"),
        "{stderr}"
    );
    // Without -v the table is named only on stdout; with -v (after serve or before it)
    // the log says what is served, rows included.
    assert!(!stderr.contains("info: serving"), "{stderr}");
    for verbose in [&["serve", "-v"][..], &["-v", "serve"][..]] {
        let mut cmd = commctl(verbose);
        cmd.args(["--listen", "127.0.0.1:0", "--loops", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("serve starts");
        let mut server = Server::from_child(child);
        let (code, stderr) = server.signal("TERM");
        assert_eq!(code, 0, "{verbose:?}: {stderr}");
        assert!(
            stderr.contains(
                "commctl: info: serving pull and push of ids 0..1024 (4096 B u8 tensors), recv \
                 of keys t/0..t/1023, and PULL_ROWS and PUSH_ROWS of table 1: PsTable, rows of 16 f32 \
                 (64 B), zeros, sgd lr 0.01"
            ),
            "{verbose:?}: {stderr}"
        );
        // The kernel features the loops use: on io_uring this kernel grants the deferred
        // task-work setup and the file table (unless STARWIRE_URING_FLAGS and
        // STARWIRE_URING_FIXED_FILES turn them off); none on epoll.
        let features = stderr
            .lines()
            .find(|l| l.contains("kernel I/O features in use: "))
            .unwrap_or_else(|| panic!("{verbose:?}: {stderr}"));
        let off = |var| std::env::var(var).is_ok_and(|v| v == "0");
        let flags_off = off("STARWIRE_URING_FLAGS");
        let files_off = off("STARWIRE_URING_FIXED_FILES");
        if features.contains("info: uring backend") && !(flags_off && files_off) {
            assert_eq!(
                features.contains("SINGLE_ISSUER, DEFER_TASKRUN"),
                !flags_off,
                "{features}"
            );
            assert_eq!(features.contains("fixed files"), !files_off, "{features}");
            for feature in ["registered ring fd", "multishot accept"] {
                assert_eq!(features.contains(feature), !flags_off, "{features}");
            }
            let direct = !flags_off && !files_off && !off("STARWIRE_URING_DIRECT_ACCEPT");
            assert_eq!(features.contains("direct accept"), direct, "{features}");
        } else {
            assert!(features.ends_with("in use: none"), "{features}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Signals: ping interrupted.

#[test]
fn ping_until_interrupted_prints_its_summary() {
    let server = Server::start(&["--listen", "127.0.0.1:0", "--loops", "1"], &[]);
    let addr = server.addr.to_string();
    let mut child = commctl(&["ping", "-i", "0.05", &addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ping starts");
    // Wait for the header and two replies, then interrupt it.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for _ in 0..3 {
            let _ = tx.send(lines.next());
        }
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let _ = tx.send(Some(Ok(rest.join("\n"))));
    });
    let mut head = Vec::new();
    for _ in 0..3 {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("ping prints")
            .expect("a line")
            .unwrap();
        head.push(line);
    }
    assert_eq!(head[0], format!("PING {addr}: 56 payload bytes"));
    assert!(head[2].contains("seq=2 time="), "{head:?}");
    let ok = Command::new("kill")
        .args(["-s", "INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let status = child.wait().unwrap();
    let rest = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap()
        .unwrap()
        .unwrap();
    // Not killed by the signal: it ends itself, with its summary; 0, or 1 when a ping was
    // still in flight when the signal came.
    assert!(matches!(status.code(), Some(0 | 1)), "{status:?}: {rest}");
    assert!(
        rest.contains(&format!("--- {addr} ping statistics ---")),
        "{rest}"
    );
    let received: u64 = rest
        .split(" replies received")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no reply count in {rest}"));
    assert!(received >= 2, "{rest}");
    assert!(rest.contains("rtt min/avg/p50/p99/max = "), "{rest}");
}

// ---------------------------------------------------------------------------------------
// endpoint-map.

const OPERATOR_TF_CONFIG: &str = r#"{"cluster": {
    "chief": ["trainer-chief-0.ns.svc:2222"],
    "ps": ["trainer-ps-0.ns.svc:2222", "trainer-ps-1.ns.svc:2222"],
    "worker": ["trainer-worker-0.ns.svc:2222", "trainer-worker-1.ns.svc:2222"]},
    "task": {"type": "worker", "index": 1}, "environment": "cloud"}"#;

#[test]
fn endpoint_map_from_tf_config() {
    let dir = Scratch::new("endpoint-map-tf");
    // To stdout.
    let r = run(
        commctl(&["endpoint-map", "--tf-config", "--port-rule", "5555"])
            .env("TF_CONFIG", OPERATOR_TF_CONFIG),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let entries: Vec<&str> = r.stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        entries,
        [
            "trainer-chief-0.ns.svc:2222=trainer-chief-0.ns.svc:5555   # chief:0",
            "trainer-ps-0.ns.svc:2222=trainer-ps-0.ns.svc:5555   # ps:0",
            "trainer-ps-1.ns.svc:2222=trainer-ps-1.ns.svc:5555   # ps:1",
            "trainer-worker-0.ns.svc:2222=trainer-worker-0.ns.svc:5555   # worker:0",
            "trainer-worker-1.ns.svc:2222=trainer-worker-1.ns.svc:5555   # worker:1",
        ]
    );
    assert!(
        r.stdout
            .starts_with("# written by commctl endpoint-map from the TF_CONFIG (data port 5555"),
        "{}",
        r.stdout
    );
    let printed = r.stdout;

    // Into a folder: .endpoint_map there, the same text; validate and the library agree.
    let r = run(commctl(&[
        "endpoint-map",
        "--tf-config",
        "--port-rule",
        "5555",
        "-o",
        dir.0.to_str().unwrap(),
    ])
    .env("TF_CONFIG", OPERATOR_TF_CONFIG));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let file = dir.0.join(".endpoint_map");
    assert_eq!(
        r.stdout,
        format!(
            "{}: 5 entries (chief 1, ps 2, worker 2), data port 5555 on every host\n",
            file.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), printed);
    // No temporary file left beside it.
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [".endpoint_map"]);
    let r = run(commctl(&["validate", "--tf-config", "--json"])
        .env("TF_CONFIG", OPERATOR_TF_CONFIG)
        .env("TF_SEASTAR_ENDPOINT_MAP_PATH", &dir.0));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(
        "{\"task\":\"ps:1\",\"control\":\"trainer-ps-1.ns.svc:2222\",\
         \"data\":\"trainer-ps-1.ns.svc:5555\"}"
    ));
    assert!(r.stdout.contains("\"task\":\"worker:1\""), "{}", r.stdout);

    // A file path, replaced in one step when it exists.
    let other = dir.file("map", "stale\n");
    let r = run(&mut commctl(&[
        "endpoint-map",
        "--cluster",
        "ps=10.0.0.1:2222",
        "--cluster",
        "worker=10.0.0.2:2222",
        "--port-rule",
        "+1000",
        "-o",
        other.to_str().unwrap(),
    ]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let text = std::fs::read_to_string(&other).unwrap();
    assert!(text.starts_with(
        "# written by commctl endpoint-map from the cluster spec of the command line (data \
         port = control port + 1000)\n"
    ));
    assert!(text.ends_with(
        "10.0.0.1:2222=10.0.0.1:3222   # ps:0\n10.0.0.2:2222=10.0.0.2:3222   # worker:0\n"
    ));
}

#[test]
fn endpoint_map_refuses_a_rule_that_clashes() {
    let dir = Scratch::new("endpoint-map-clash");
    let out = dir.0.join("m");
    let out = out.to_str().unwrap();
    // Tasks sharing a host: one fixed port gives two tasks one data address.
    let r = run(&mut commctl(&[
        "endpoint-map",
        "--ps-hosts",
        "127.0.0.1:2222,127.0.0.1:2223",
        "--worker-hosts",
        "127.0.0.1:2224",
        "--port-rule",
        "5555",
        "-o",
        out,
    ]));
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.stdout, "");
    assert_eq!(
        r.stderr,
        "commctl: ps:1 (127.0.0.1:2223): data address 127.0.0.1:5555 is also the data \
         address of ps:0; the rule must give tasks on one host different ports (use +OFFSET)\n\
         commctl: worker:0 (127.0.0.1:2224): data address 127.0.0.1:5555 is also the data \
         address of ps:0; the rule must give tasks on one host different ports (use +OFFSET)\n\
         commctl: 2 problems found; no map written\n"
    );
    assert!(!dir.0.join("m").exists());
    // An offset that lands on another task's control port.
    let r = run(&mut commctl(&[
        "endpoint-map",
        "--ps-hosts",
        "127.0.0.1:2222",
        "--worker-hosts",
        "127.0.0.1:3222",
        "--port-rule",
        "+1000",
    ]));
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with(
            "commctl: ps:0 (127.0.0.1:2222): data address 127.0.0.1:3222 is the control \
             address of worker:0; the rule must give another port\n"
        ),
        "{}",
        r.stderr
    );
    // Past the last port.
    let r = run(&mut commctl(&[
        "endpoint-map",
        "--ps-hosts",
        "ps0:65000",
        "--port-rule",
        "+1000",
    ]));
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with(
            "commctl: ps:0 (ps0:65000): the data port would be past 65535 (data port = \
             control port + 1000)\n"
        ),
        "{}",
        r.stderr
    );
    // An offset that fits them.
    let r = run(&mut commctl(&[
        "endpoint-map",
        "--ps-hosts",
        "127.0.0.1:2222,127.0.0.1:2223",
        "--worker-hosts",
        "127.0.0.1:2224",
        "--port-rule",
        "+1000",
        "-o",
        out,
    ]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = run(&mut commctl(&[
        "validate",
        out,
        "--ps-hosts",
        "127.0.0.1:2222,127.0.0.1:2223",
        "--worker-hosts",
        "127.0.0.1:2224",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("ps:1      127.0.0.1:2223  127.0.0.1:3223"),
        "{}",
        r.stdout
    );
}

#[test]
fn endpoint_map_usage_errors() {
    let dir = Scratch::new("endpoint-map-usage");
    for (args, env, want) in [
        (
            &["endpoint-map", "--port-rule", "5555"][..],
            None,
            "no cluster spec",
        ),
        (
            &["endpoint-map", "--tf-config", "--port-rule", "5555"],
            None,
            "TF_CONFIG is not set",
        ),
        (
            &["endpoint-map", "--tf-config", "--port-rule", "5555"],
            Some(r#"{"cluster": {"ps": ["a:1",]}}"#),
            "TF_CONFIG: invalid JSON at byte 26: expected a JSON value, found ']'",
        ),
        (
            &["endpoint-map", "--ps-hosts", "a:1", "--port-rule", "0"],
            None,
            "expected PORT",
        ),
        (&["endpoint-map", "--ps-hosts", "a:1"], None, "--port-rule"),
        (
            &[
                "endpoint-map",
                "--ps-hosts",
                "a:1",
                "--port-rule",
                "5555",
                "-o",
                "/nonexistent/folder/map",
            ],
            None,
            "/nonexistent/folder/map: ",
        ),
    ] {
        let mut cmd = commctl(args);
        if let Some(tf) = env {
            cmd.env("TF_CONFIG", tf);
        }
        let r = run(cmd.current_dir(&dir.0));
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(want), "{args:?}: {}", r.stderr);
        assert_eq!(r.stdout, "", "{args:?}");
    }
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
}

#[test]
fn a_generated_map_serves_and_reaches_a_task() {
    // TF_CONFIG names the PS by its control address; the map gives it a free data port;
    // `serve --tf-config` listens there and `ping ps:0` finds it through the same map.
    let dir = Scratch::new("endpoint-map-e2e");
    let data: SocketAddr = dead_addr().parse().unwrap();
    let tf = r#"{"cluster": {"ps": ["127.0.0.1:2222"]}, "task": {"type": "ps", "index": 0}}"#;
    let r = run(commctl(&[
        "endpoint-map",
        "--tf-config",
        "--port-rule",
        &data.port().to_string(),
        "-o",
        dir.0.to_str().unwrap(),
    ])
    .env("TF_CONFIG", tf));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let p = dir.0.to_str().unwrap().to_owned();
    let env = [
        ("TF_CONFIG", tf),
        ("TF_SEASTAR_ENDPOINT_MAP_PATH", p.as_str()),
    ];
    let mut server = Server::start(&["--tf-config", "--loops", "1"], &env);
    assert_eq!(server.addr, data);
    let r = run(commctl(&["ping", "-c", "1", "ps:0"]).envs(env));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .starts_with(&format!("PING ps:0 ({data}): 56 payload bytes")),
        "{}",
        r.stdout
    );
    let (code, _) = server.signal("TERM");
    assert_eq!(code, 0);
}

#[test]
fn wait_names_the_tasks_that_never_came_up() {
    let server = Server::start(&["--listen", "127.0.0.1:0", "--loops", "1"], &[]);
    let up = server.addr.to_string();
    let r = run(&mut commctl(&["wait", &up, "-W", "30"]));
    assert_eq!(
        (r.code, r.stdout.trim()),
        (0, "all 1 targets answered"),
        "{}",
        r.stderr
    );
    // ps:1 is a task of the spec whose data address nobody listens on.
    let dir = Scratch::new("wait");
    let dead = dead_addr();
    let map = dir.file(
        ".endpoint_map",
        &format!("10.1.1.1:2222={up}\n10.1.1.2:2222={dead}\n"),
    );
    let r = run(&mut commctl(&[
        "wait",
        "ps:0",
        "ps:1",
        "-W",
        "0.5",
        "--ps-hosts",
        "10.1.1.1:2222,10.1.1.2:2222",
        "--endpoint-map",
        map.to_str().unwrap(),
    ]));
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines[0].starts_with("1 of 2 targets did not answer within "),
        "{}",
        r.stdout
    );
    assert!(
        lines[1].starts_with(&format!("  ps:1 ({dead}): ")),
        "{}",
        r.stdout
    );
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    let r = run(&mut commctl(&["wait"]));
    assert_eq!(r.code, 2, "{}", r.stderr);
}

// ---------------------------------------------------------------------------------------
// stats.

#[test]
fn stats_shows_what_a_server_served_per_peer_and_operation() {
    let server = Server::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--tensors",
            "64",
            "--tensor-size",
            "1000",
        ],
        &[],
    );
    let addr = server.addr.to_string();
    // Without --task: the default task name, said to be one.
    assert!(
        server
            .line
            .contains(" as ps:0 (the default task; 1 event loop"),
        "{}",
        server.line
    );
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "pull",
        "-k",
        "8",
        "--tensor-size",
        "1000",
        "--variables",
        "64",
        "-d",
        "200ms",
        "-p",
        "4",
        "--json",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let pulls = json_int(r.stdout.trim(), "ok") as u64;
    assert!(pulls > 0);

    // The JSON document: the bench's pulls, served to its task, each with a latency.
    let r = run(&mut commctl(&["stats", &addr, "--json"]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let doc: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(doc["format"], "starwire-stats");
    assert_eq!(doc["version"], 1);
    // The loops' accounting: they worked, spun while idle and parked (between the bench's
    // requests and after them).
    let totals = &doc["totals"];
    for key in ["busy_ns", "spin_ns", "parked_ns", "parks"] {
        assert!(totals[key].as_u64().unwrap() > 0, "{key} in {totals}");
    }
    let peers = doc["peers"].as_array().unwrap();
    let bench = peers
        .iter()
        .find(|p| p["role"] == "server" && p["ops"]["pull"].is_object())
        .unwrap_or_else(|| panic!("no served pulls in {doc}"));
    // Each commctl process is a task of its own: the bench is not merged with the stats
    // requests that follow it.
    assert!(bench["task"]
        .as_str()
        .unwrap()
        .starts_with("commctl-bench:"));
    assert!(bench["ops"]["stats"].is_null(), "{doc}");
    let pull = &bench["ops"]["pull"];
    assert_eq!(pull["requests"].as_u64(), Some(pulls));
    assert_eq!(pull["outcomes"]["ok"].as_u64(), Some(pulls));
    assert_eq!(pull["tensors"].as_u64(), Some(pulls * 8));
    assert!(pull["bytes_out"].as_u64().unwrap() > pulls * 8 * 1000);
    // Every pull was answered when the stats were taken.
    assert_eq!(pull["in_flight"].as_u64(), Some(0));

    // The table names the peer's task and the operation.
    let r = run(&mut commctl(&["stats", &addr]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("served commctl-bench:"), "{}", r.stdout);
    assert!(r.stdout.contains("served commctl-stats:"), "{}", r.stdout);
    assert!(r.stdout.contains(" pull "), "{}", r.stdout);

    // Prometheus: the counters of the same pulls.
    let r = run(&mut commctl(&["stats", &addr, "--prometheus"]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("# TYPE starwire_requests_total counter"));
    let ok_line = r
        .stdout
        .lines()
        .find(|l| {
            l.starts_with("starwire_requests_total{role=\"server\"")
                && l.contains("op=\"pull\",status=\"ok\"")
        })
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(ok_line.ends_with(&format!(" {pulls}")), "{ok_line}");

    // --watch refreshes until interrupted.
    let child = commctl(&["stats", &addr, "--watch", "-i", "0.1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let _ = Command::new("kill")
        .args(["-s", "INT", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.matches("stats of ").count() >= 2, "{text}");
    assert!(text.contains("REQ/s"), "{text}");
}

#[test]
fn stats_refused_by_a_task_with_the_endpoint_off() {
    let server = Server::start(
        &["--listen", "127.0.0.1:0", "--loops", "1"],
        &[("STARWIRE_STATS_ENDPOINT", "0")],
    );
    let r = run(&mut commctl(&["stats", &server.addr.to_string()]));
    assert_eq!(r.code, 6, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("Unimplemented"), "{}", r.stderr);
}

/// `commctl ARGS` with its stdout a pipe whose read end is already closed, and
/// `RUST_BACKTRACE=1`: every write to stdout fails with `EPIPE`.
fn into_closed_pipe(args: &[&str]) -> Run {
    use nix::fcntl::OFlag;
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("a pipe");
    drop(read);
    let mut cmd = commctl(args);
    cmd.env("RUST_BACKTRACE", "1")
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("commctl runs");
    let out = child.wait_with_output().expect("commctl ends");
    Run {
        code: out.status.code().expect("exited, not killed by a signal"),
        stdout: String::new(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let mut server = Server::start(&["--listen", "127.0.0.1:0", "--loops", "1"], &[]);
    let addr = server.addr.to_string();
    let dir = Scratch::new("closed-pipe");
    let map = dir.file(".endpoint_map", "10.0.0.1:2222=10.0.0.1:5555\n");
    let map = map.to_str().unwrap();
    // `ping` without -c and `stats --watch` would go on for ever: with nobody reading they
    // stop, as `ping ... | head` expects.
    let commands: [&[&str]; 12] = [
        &["--help"],
        &["--version"],
        &["stats", "--help"],
        &["serve", "--help"],
        &["validate", map],
        &["validate", map, "--json"],
        &[
            "endpoint-map",
            "--ps-hosts",
            "10.0.0.1:2222",
            "--port-rule",
            "+1",
        ],
        &["ping", "-i", "0.01", &addr],
        &["stats", &addr],
        &["stats", &addr, "--watch", "-i", "0.01"],
        &["bench", &addr, "-n", "20"],
        &["wait", &addr],
    ];
    for args in commands {
        let r = into_closed_pipe(args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        for word in ["panicked", "Broken pipe", "backtrace"] {
            assert!(!r.stderr.contains(word), "{args:?}: {}", r.stderr);
        }
    }
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn stats_watch_into_a_pipe_writes_no_screen_codes() {
    let mut server = Server::start(&["--listen", "127.0.0.1:0", "--loops", "1"], &[]);
    let addr = server.addr.to_string();
    let mut watch = commctl(&["stats", &addr, "--watch", "-i", "0.01"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("stats runs");
    // Three refreshes, then Ctrl-C.
    let mut text = String::new();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut tables = 0;
    while tables < 3 {
        let line = lines.next().expect("more output").unwrap();
        tables += usize::from(line.starts_with("stats of "));
        text.push_str(&line);
        text.push('\n');
    }
    let ok = Command::new("kill")
        .args(["-s", "INT", &watch.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    drop(lines);
    let status = watch.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!text.contains('\x1b'), "{text:?}");
    // Refreshes one after the other, each with its header and the rates since the last.
    assert!(text.contains("\n\nstats of "), "{text}");
    assert!(text.contains("REQ/s"), "{text}");
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn serve_help_names_its_default_task() {
    let r = run(&mut commctl(&["serve", "--help"]));
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("default: ps:0"), "{}", r.stdout);
}
