//! Where requests are documented (the Rust `Client` and `Sharded`, the C header, the
//! Python package), the connect-retry schedule's figures are the ones the configuration's
//! defaults give: this test computes them from `Config` and fails when a page says
//! otherwise.

use starwire::Config;
use std::path::Path;
use std::time::Duration;

/// A duration as the pages write it: `2.55 s`, `5 s`.
fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

#[test]
fn the_pages_state_the_schedule_the_defaults_give() {
    let c = Config::builder("worker", 0).build().unwrap();
    let wait = secs(c.connect_retry_wait());
    let bound = secs(c.connect_give_up_bound());
    let attempts = format!("{} attempts", c.connect_retries() + 1);
    let handshake = secs(c.handshake_timeout());
    let delays: Vec<String> = (0..3)
        .map(|n| c.connect_delay(n).as_millis().to_string())
        .collect();
    let first_delays = delays.join(", ");
    assert_eq!(
        (wait.as_str(), bound.as_str(), first_delays.as_str()),
        ("2.55 s", "47.55 s", "10, 20, 40")
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for page in [
        "src/client/api.rs",
        "src/rows/sharded.rs",
        "ffi/src/client.rs",
        "ffi/include/starwire.h",
        "ffi/python/starwire/client.py",
        "ffi/python/README.md",
        "docs/tuning.md",
    ] {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        // Doc comments wrap lines: compare with the comment markers and line breaks gone.
        let flat: String = text
            .lines()
            .map(|l| l.trim().trim_start_matches("///").trim_start_matches("//!"))
            .map(|l| l.trim_start_matches(['*', '#']).trim())
            .collect::<Vec<_>>()
            .join(" ");
        for want in [&wait, &bound, &handshake] {
            assert!(flat.contains(want.as_str()), "{page} does not say {want}");
        }
        let sharded = page.ends_with("sharded.rs");
        if !sharded {
            assert!(
                flat.contains(&first_delays),
                "{page} does not list the delays"
            );
            assert!(flat.contains(&attempts), "{page} does not say {attempts}");
        }
    }
}
