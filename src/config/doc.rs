//! The settings table of `docs/tuning.md`, rendered from the table in `table.rs`.

use super::table::{rows, EnvName, Row, LIMIT_FIELDS, MAX_JOB_LEN};
use super::types::{bytes, grouped};
use super::Limits;

/// The markdown table of every setting: variable, builder method, default, range and
/// effect, one row each, as `docs/tuning.md` shows it. In a role-dependent variable's name,
/// `P` stands for `WORKER` or `PS`.
pub fn settings_table() -> String {
    let mut out = String::from(
        "| variable | builder method | default | range | effect |\n|---|---|---|---|---|\n",
    );
    let mut line = |cells: [&str; 5]| {
        out.push('|');
        for cell in cells {
            out.push(' ');
            out.push_str(&cell.replace('|', "\\|"));
            out.push_str(" |");
        }
        out.push('\n');
    };
    line([
        "—",
        "`Config::builder(job, _)`",
        "required",
        &format!("1 – {MAX_JOB_LEN} characters `A-Z a-z 0-9 _ -`"),
        "The task's job name; decides the role.",
    ]);
    line([
        "—",
        "`Config::builder(_, task_index)`",
        "required",
        "any `u32`",
        "The task's index within its job.",
    ]);
    let defaults = Limits::default();
    for row in rows() {
        let [env, method, default, range, effect] = cells(&row);
        line([&env, &method, &default, &range, &effect]);
        // The limits belong with the other frame settings, next to the chunk size.
        if row.method.starts_with(".backend(") {
            for f in &LIMIT_FIELDS {
                let range = format!("{} – {} {}", grouped(f.lo), grouped(f.hi), f.unit);
                let default = match f.unit {
                    "bytes" => bytes((f.get)(&defaults)),
                    _ => grouped((f.get)(&defaults)),
                };
                line([
                    &format!("`{}`", f.env),
                    "`.limits(Limits)`",
                    &default,
                    &range,
                    f.doc,
                ]);
            }
        }
    }
    out
}

fn cells(row: &Row) -> [String; 5] {
    let env = match row.env {
        EnvName::One(name) => format!("`{name}`"),
        EnvName::ByRole { worker, .. } => format!("`{}`", worker.replacen("WORKER", "P", 1)),
    };
    [
        env,
        format!("`{}`", row.method),
        row.default.clone(),
        row.range.clone(),
        first_paragraph(row.doc),
    ]
}

/// The doc lines up to the first blank one, joined into one line.
fn first_paragraph(doc: &[&str]) -> String {
    doc.iter()
        .map(|line| line.trim())
        .take_while(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
