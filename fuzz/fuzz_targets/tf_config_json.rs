//! The `TF_CONFIG` JSON reader against serde_json: never a panic, the same answer to
//! "is this JSON?", the same strings, and a spec that survives being written back.
//!
//! The input (bytes that are not UTF-8 replaced by U+FFFD) goes to `TfConfig::parse_all`
//! and to serde_json. The reader accepted the JSON when the answer is anything but a
//! `ClusterError::Json`. serde_json reads it into [`Shape`], which refuses an object with
//! a key twice and measures the nesting, so that both readers judge the same language.
//! They must agree, except where the reader differs on purpose:
//!
//! - nesting: the reader refuses more than 64 levels (serde_json allows 128);
//! - numbers: the reader keeps a number's text, serde_json refuses one beyond `f64`
//!   ("number out of range");
//! - size: the reader refuses more than 1 MiB (not reached with libFuzzer's default
//!   `-max_len`).
//!
//! A JSON error's offset is within the input. A `TF_CONFIG` that parses has the jobs,
//! addresses and task serde_json reads in the same text (so escapes decode alike), and,
//! written back as JSON by serde_json, parses to the same `TfConfig`.
#![no_main]

use std::collections::HashSet;
use std::fmt;

use libfuzzer_sys::fuzz_target;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use starwire::cluster::{ClusterError, TaskId, TfConfig};
use starwire::cluster::endpoint_map::HostPort;

/// The reader's limits (`src/cluster/json.rs`).
const MAX_DEPTH: usize = 64;
const MAX_INPUT: usize = 1 << 20;

/// Any JSON value, with duplicate keys refused; `depth` is the deepest nesting of arrays
/// and objects (a scalar is 0, `[]` is 1).
struct Shape {
    depth: usize,
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(ShapeVisitor)
    }
}

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape { depth: 0 })
    }
    fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape { depth: 0 })
    }
    fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape { depth: 0 })
    }
    fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape { depth: 0 })
    }
    fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
        Ok(Shape { depth: 0 })
    }
    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(Shape { depth: 0 })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut depth = 0;
        while let Some(item) = seq.next_element::<Shape>()? {
            depth = depth.max(item.depth);
        }
        Ok(Shape { depth: depth + 1 })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut keys = HashSet::new();
        let mut depth = 0;
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key) {
                return Err(de::Error::custom("duplicate key"));
            }
            depth = depth.max(map.next_value::<Shape>()?.depth);
        }
        Ok(Shape { depth: depth + 1 })
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let ours = TfConfig::parse_all(&text);
    let json_error = match &ours {
        Err(errors) => {
            assert!(!errors.is_empty());
            match &errors[..] {
                [ClusterError::Json(e)] => Some(e.clone()),
                _ => {
                    assert!(!errors.iter().any(|e| matches!(e, ClusterError::Json(_))));
                    None
                }
            }
        }
        Ok(_) => None,
    };
    if let Some(e) = &json_error {
        assert!(e.offset <= text.len(), "{e} in {} bytes", text.len());
        let _ = e.to_string();
    }
    if text.len() > MAX_INPUT {
        assert!(json_error.is_some());
        return;
    }

    // The same answer as serde_json, but for the listed differences.
    match (serde_json::from_str::<Shape>(&text), &json_error) {
        (Ok(shape), None) => assert!(shape.depth <= MAX_DEPTH, "{text:?}"),
        (Ok(shape), Some(e)) => assert!(
            shape.depth > MAX_DEPTH && e.message.starts_with("nested deeper than"),
            "serde_json accepts, the reader says {e}: {text:?}"
        ),
        (Err(se), None) => assert!(
            se.to_string().starts_with("number out of range"),
            "the reader accepts, serde_json says {se}: {text:?}"
        ),
        (Err(_), Some(_)) => {}
    }

    // A spec that parses: what serde_json reads in the same text, and a round trip.
    let Ok(tf) = ours else { return };
    // serde_json cannot read it only for a number beyond f64 (checked above).
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let cluster = value["cluster"]
        .as_object()
        .expect("an accepted TF_CONFIG has a cluster object");
    assert_eq!(tf.cluster.jobs().count(), cluster.len());
    for (job, list) in cluster {
        let ours = tf.cluster.job(job).expect("the same job names");
        let theirs: Vec<HostPort> = list
            .as_array()
            .expect("a job is an array")
            .iter()
            .map(|s| HostPort::parse(s.as_str().expect("of strings")).expect("addresses"))
            .collect();
        assert_eq!(ours, &theirs[..], "job {job}");
    }
    match &tf.task {
        None => assert!(value.get("task").is_none()),
        Some(t) => {
            assert_eq!(value["task"]["type"].as_str(), Some(t.job.as_str()));
            let index = &value["task"]["index"];
            let index = match index {
                serde_json::Value::Null => Some(0),
                serde_json::Value::String(s) => s.parse::<u32>().ok(),
                n => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            };
            assert_eq!(index, Some(t.index));
        }
    }

    let mut jobs = serde_json::Map::new();
    for job in tf.cluster.jobs() {
        let addrs = tf.cluster.job(job).unwrap_or_default();
        let addrs = addrs.iter().map(|a| a.to_string().into()).collect();
        jobs.insert(job.to_owned(), serde_json::Value::Array(addrs));
    }
    let mut written = serde_json::json!({ "cluster": jobs });
    if let Some(TaskId { job, index }) = &tf.task {
        written["task"] = serde_json::json!({ "type": job, "index": index });
    }
    let written = written.to_string();
    let again = TfConfig::parse(&written)
        .unwrap_or_else(|e| panic!("written back, {written} does not parse: {e}"));
    assert_eq!(again, tf, "{written}");
});
