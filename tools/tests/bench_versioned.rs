//! `commctl bench -o pull-rows --versioned [--changed F]` against `commctl serve`: rows
//! pulled holding their versions come back unchanged (not sent) unless bench pushed to
//! them just before.

mod common;

use std::net::TcpListener;

use common::{commctl, run, Server};
use serde_json::Value;

/// `commctl bench ADDR -o pull-rows ARGS... --json` against `server`, every request ok;
/// the report.
fn bench(server: &Server, args: &[&str]) -> Value {
    let addr = server.addr.to_string();
    let mut cmd = commctl(&["bench", &addr, "-o", "pull-rows", "--json"]);
    let r = run(cmd.args(args));
    assert_eq!(r.code, 0, "{args:?}: {}{}", r.stdout, r.stderr);
    let v: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["failed"], 0, "{v}");
    assert!(v["ok"].as_u64().unwrap() > 0, "{v}");
    v
}

fn int(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count in {v}"))
}

#[test]
fn versioned_pulls_send_only_the_rows_pushed_since() {
    // serve's default table: a PsTable, which keeps versions, with its 100000 rows made at
    // start (16 f32, 64 B each).
    let mut server = Server::start(&["--listen", "127.0.0.1:0", "--loops", "1"], &[]);
    let k = ["-k", "100", "--rows", "100000"];

    // A plain pull: every row is sent; no version members.
    let plain = bench(&server, &[&k[..], &["-n", "50", "-p", "4"]].concat());
    assert_eq!(int(&plain, "bytes"), int(&plain, "rows") * 64, "{plain}");
    for key in [
        "rows_unchanged",
        "rows_sent",
        "pushes",
        "rows_with_versions",
    ] {
        assert!(plain.get(key).is_none(), "{key} in {plain}");
    }

    // Versioned, nothing pushed: bench learned every row's version first, so every row
    // comes back unchanged and no row bytes travel.
    let v = bench(
        &server,
        &[&k[..], &["-n", "50", "-p", "4", "--versioned"]].concat(),
    );
    assert_eq!(int(&v, "rows_with_versions"), 100_000, "{v}");
    assert_eq!(int(&v, "rows"), 50 * 100, "{v}");
    assert_eq!(int(&v, "rows_unchanged"), int(&v, "rows"), "{v}");
    assert_eq!(int(&v, "rows_sent"), 0, "{v}");
    assert_eq!(int(&v, "bytes"), 0, "{v}");
    assert_eq!(int(&v, "pushes"), 0, "{v}");
    assert_eq!(v["changed_fraction"], 0.0, "{v}");

    // A tenth of each pull's rows pushed to just before it (one in flight, so each push
    // reaches the table before its pull): at least those come back changed, and most rows
    // still do not travel.
    let v = bench(
        &server,
        &[
            &k[..],
            &["-n", "40", "-p", "1", "--versioned", "--changed", "0.1"],
        ]
        .concat(),
    );
    let (ok, sent) = (int(&v, "ok"), int(&v, "rows_sent"));
    assert_eq!(ok, 40, "{v}");
    assert_eq!(
        (int(&v, "pushes"), int(&v, "rows_per_push")),
        (40, 10),
        "{v}"
    );
    assert!(sent >= 40 * 10, "every pushed row comes back changed: {v}");
    assert!(sent < int(&v, "rows") / 2, "{v}");
    assert_eq!(int(&v, "rows_unchanged") + sent, int(&v, "rows"), "{v}");
    assert_eq!(int(&v, "bytes"), sent * 64, "{v}");

    // The table says how many rows came unchanged and how many were sent.
    let addr = server.addr.to_string();
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "pull-rows",
        "-k",
        "100",
        "-n",
        "20",
        "-p",
        "1",
        "--versioned",
        "--changed",
        "0.5",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for words in [
        "versioned, 50 % of each pull's rows pushed to just before it",
        "rows came unchanged (not sent), ",
        "20 pushes of 50 rows between pulls",
    ] {
        assert!(r.stdout.contains(words), "{words}: {}", r.stdout);
    }

    // The table saw the pushes: 40 of 10 rows and 20 of 50.
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(", 1400 rows pushed,"), "{stderr}");
}

#[test]
fn a_mem_table_keeps_versions_too() {
    let mut server = Server::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--loops",
            "1",
            "--table-kind",
            "mem",
            "--rows",
            "1000",
        ],
        &[],
    );
    let v = bench(
        &server,
        &["-k", "100", "--rows", "1000", "-n", "10", "--versioned"],
    );
    assert_eq!(int(&v, "rows_with_versions"), 1000, "{v}");
    assert_eq!(int(&v, "rows_unchanged"), int(&v, "rows"), "{v}");
    assert_eq!(int(&v, "bytes"), 0, "{v}");
    // Its counters saw the versioned pulls: the 10 pulls of 100 rows and the 1000 rows
    // pulled to learn the versions.
    let (code, stderr) = server.signal("TERM");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("table 1: 2000 rows pulled (0 missing)"),
        "{stderr}"
    );
}

#[test]
fn a_server_without_row_versions_sends_every_row_and_bench_says_so() {
    // A server that does not announce row_versions: every pull goes out plain, and every
    // row comes back changed, with version 0.
    let server = Server::start(
        &["--listen", "127.0.0.1:0", "--loops", "1", "--rows", "1000"],
        &[("STARWIRE_WIRE_FEATURES", "none")],
    );
    let v = bench(
        &server,
        &["-k", "100", "--rows", "1000", "-n", "10", "--versioned"],
    );
    assert_eq!(int(&v, "rows_with_versions"), 0, "{v}");
    assert_eq!(int(&v, "rows_sent"), int(&v, "rows"), "{v}");
    assert_eq!(int(&v, "bytes"), int(&v, "rows") * 64, "{v}");
    let addr = server.addr.to_string();
    let r = run(&mut commctl(&[
        "bench",
        &addr,
        "-o",
        "pull-rows",
        "-k",
        "100",
        "--rows",
        "1000",
        "-n",
        "5",
        "--versioned",
    ]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("the target gave no row a version, so every row is sent"),
        "{}",
        r.stdout
    );
}

#[test]
fn versioned_flags_are_checked() {
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    for (args, says) in [
        (&["-o", "pull", "--versioned"][..], "pulls of rows only"),
        (
            &["-o", "push-rows", "--versioned"][..],
            "pulls of rows only",
        ),
        (
            &["-o", "pull-rows", "--changed", "0.1"][..],
            "give --versioned",
        ),
        (
            &["-o", "pull-rows", "--versioned", "--changed", "1.5"][..],
            "--changed 1.5: expected a share of the rows from 0 to 1",
        ),
        (
            &["-o", "pull-rows", "--versioned", "--changed", "-0.1"][..],
            "from 0 to 1",
        ),
        (
            &["-o", "pull-rows", "--versioned", "--changed", "NaN"][..],
            "from 0 to 1",
        ),
        (
            &["-o", "pull-rows", "--versioned", "--rows", "20000000"][..],
            "expected at most 16777216 rows",
        ),
    ] {
        let mut cmd = commctl(&["bench", &dead]);
        let r = run(cmd.args(args));
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
}
