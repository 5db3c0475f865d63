//! `.endpoint_map` and `TF_CONFIG` parsing: never a panic, and round trips.
//!
//! - The map's sound entries, written back in file form, parse again without a problem
//!   to the same entries; every problem has a line within the input (or none for the file).
//! - Every line that parses as a `host:port` prints as one that parses to the same address.
//! - The same bytes as `TF_CONFIG` JSON: no panic; a spec that parses joins with the map
//!   without a panic, and every task it reports as missing is one the map lacks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starwire::cluster::{Cluster, ClusterError, TfConfig};
use starwire::cluster::endpoint_map::{EndpointMap, HostPort};

fuzz_target!(|data: &[u8]| {
    let (map, problems) = EndpointMap::parse_lenient("fuzz", data);
    let lines = data.split(|&b| b == b'\n').count();
    for p in &problems {
        assert!(p.line.map_or(true, |l| l >= 1 && l <= lines), "{p}");
        let _ = p.to_string();
    }
    let text = map.to_string();
    let again = EndpointMap::parse("again", text.as_bytes())
        .unwrap_or_else(|p| panic!("written map does not parse: {p:?}\n{text}"));
    assert_eq!(again.len(), map.len());
    for (a, b) in map.entries().iter().zip(again.entries()) {
        assert_eq!((&a.control, &a.data), (&b.control, &b.data));
        assert_eq!(map.data_addr(&a.control), Some(&a.data));
    }

    if let Ok(s) = std::str::from_utf8(data) {
        for line in s.lines() {
            if let Ok(hp) = HostPort::parse(line) {
                assert_ne!(hp.port(), 0);
                let shown = hp.to_string();
                assert_eq!(
                    HostPort::parse(&shown).as_ref(),
                    Ok(&hp),
                    "{line:?} -> {shown:?}"
                );
            }
        }
        match TfConfig::parse_all(s) {
            Ok(tf) => {
                if let Some(t) = &tf.task {
                    assert!(tf.cluster.contains(t));
                }
                if let Err(errors) = Cluster::resolve(&tf.cluster, &map) {
                    for e in errors {
                        if let ClusterError::MissingEntry { control, .. } = &e {
                            assert!(map.data_addr(control).is_none());
                        }
                        let _ = e.to_string();
                    }
                }
            }
            Err(errors) => {
                assert!(!errors.is_empty());
                for e in errors {
                    let _ = e.to_string();
                }
            }
        }
    }
});
