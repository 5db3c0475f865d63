//! `docs/tuning.md` shows the table of settings that `starwire::config::settings_table()`
//! renders from the one table in `src/config/table.rs`; this test fails when they differ.
//!
//! To regenerate the table in the doc:
//!
//! ```text
//! STARWIRE_BLESS=1 cargo test --test tuning_doc
//! ```

use std::path::PathBuf;

const BEGIN: &str = "<!-- settings table: generated from src/config/table.rs";
const END: &str = "<!-- end of settings table -->";

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/tuning.md")
}

/// The doc split around the generated table: (before it, the table, after it). The marker
/// lines belong to `before` and `after`.
fn split(doc: &str) -> (&str, &str, &str) {
    let begin = doc
        .find(BEGIN)
        .unwrap_or_else(|| panic!("docs/tuning.md lacks the line starting {BEGIN:?}"));
    let table_start = begin
        + doc[begin..]
            .find('\n')
            .map(|n| n + 1)
            .expect("a line after the begin marker");
    let table_end = table_start
        + doc[table_start..]
            .find(END)
            .unwrap_or_else(|| panic!("docs/tuning.md lacks {END:?} after the begin marker"));
    (
        &doc[..table_start],
        &doc[table_start..table_end],
        &doc[table_end..],
    )
}

/// The lines that differ, each side prefixed as in a diff.
fn line_diff(doc: &str, generated: &str) -> String {
    let old: Vec<&str> = doc.lines().collect();
    let new: Vec<&str> = generated.lines().collect();
    let mut out = String::new();
    for i in 0..old.len().max(new.len()) {
        let (o, n) = (old.get(i), new.get(i));
        if o != n {
            out.push_str(&format!("line {} of the table:\n", i + 1));
            if let Some(o) = o {
                out.push_str(&format!("- {o}\n"));
            }
            if let Some(n) = n {
                out.push_str(&format!("+ {n}\n"));
            }
        }
    }
    out
}

#[test]
fn tuning_doc_shows_the_generated_settings_table() {
    let path = doc_path();
    let doc = std::fs::read_to_string(&path).expect("read docs/tuning.md");
    let (before, table, after) = split(&doc);
    let generated = starwire::config::settings_table();
    if table == generated {
        return;
    }
    if std::env::var_os("STARWIRE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, format!("{before}{generated}{after}")).expect("write docs/tuning.md");
        return;
    }
    panic!(
        "the settings table in docs/tuning.md differs from the one src/config/table.rs \
         renders (- doc, + generated):\n{}\nRegenerate it with:\n    \
         STARWIRE_BLESS=1 cargo test --test tuning_doc",
        line_diff(table, &generated)
    );
}

#[test]
fn every_variable_is_in_the_table_once() {
    let table = starwire::config::settings_table();
    for var in [
        starwire::config::ENV_CLUSTER_ID,
        starwire::config::ENV_SPIN_US,
        starwire::config::ENV_CHUNK_SIZE,
        starwire::config::ENV_SEND_ARENA_KEEP,
        starwire::config::ENV_MAX_FRAME,
        starwire::config::ENV_MAX_TENSOR_BYTES,
        starwire::config::ENV_MAX_TABLES,
        starwire::config::ENV_MAX_ROWS,
        starwire::config::ENV_MAX_ROW_BYTES,
        starwire::config::ENV_ZERO_COPY_MIN,
        starwire::config::ENV_HANDLER_THREADS,
        starwire::config::ENV_MAX_SERVED,
        starwire::config::ENV_ANSWER_BACKLOG,
        starwire::config::ENV_CLOSE_LINGER_MS,
        starwire::config::ENV_URING_FLAGS,
        starwire::config::ENV_URING_FIXED_FILES,
        starwire::config::ENV_URING_DIRECT_ACCEPT,
        starwire::config::ENV_URING_RECV_BUFS,
        starwire::config::ENV_URING_RECV_BUNDLES,
        starwire::config::ENV_URING_RECV_INCREMENTAL,
        starwire::config::ENV_PROGRESS_TIMEOUT_MS,
        starwire::config::ENV_HEARTBEAT_INTERVAL_MS,
        starwire::config::ENV_HEARTBEAT_TIMEOUT_MS,
        starwire::config::ENV_RECV_BUDGET,
        starwire::config::ENV_CONN_RECV_BUDGET,
        starwire::config::ENV_STATS_ENDPOINT,
        starwire::config::ENV_CHECKPOINT_DIR,
        starwire::config::ENV_TABLE_UPKEEP_MS,
        starwire::config::ENV_TRACE,
        starwire::config::ENV_TRACE_EVENTS,
        starwire::config::ENV_WIRE_FEATURES,
        "`P_ENABLE_POLLING`",
        "`NETWORK_P_CORE_NUMBER`",
        "`P_DISABLE_PIN_CORES`",
    ] {
        let cell = if var.starts_with('`') {
            format!("| {var} |")
        } else {
            format!("| `{var}` |")
        };
        assert_eq!(table.matches(&cell).count(), 1, "{cell} in\n{table}");
    }
    // The header, the separator, job and task index, and one line per setting.
    assert_eq!(table.lines().count(), 2 + 2 + 50, "{table}");
}
