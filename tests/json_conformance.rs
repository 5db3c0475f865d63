//! The `TF_CONFIG` JSON reader against JSONTestSuite (`tests/data/JSONTestSuite`, see its
//! README): every `y_` case parses, every `n_` case is rejected with a JSON error, every
//! `i_` case gives the answer listed here; none panics.
//!
//! The reader is reached the way a task reaches it: [`TfConfig::parse_all`] on the text
//! (`TF_CONFIG` is read with `to_str`, so bytes that are not UTF-8 never get to it; such a
//! file counts as rejected by that check, as `TfConfig::from_env` answers `NotUtf8`). The
//! JSON is accepted when the answer is anything but [`ClusterError::Json`]: `[1]` is valid
//! JSON and then fails as a `TF_CONFIG` for not being an object.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use starwire::cluster::{ClusterError, TfConfig};

/// `y_` cases the reader rejects on purpose, each with the reason.
const Y_REJECTED: &[(&str, &str)] = &[
    (
        "y_object_duplicated_key.json",
        "an object with the same key twice is an error: in a configuration it is a \
         mistake, and which value wins differs between readers",
    ),
    (
        "y_object_duplicated_key_and_value.json",
        "the same key twice, even with the same value (as above)",
    ),
];

/// `i_` (implementation-defined) cases the reader accepts; every other `i_` case is
/// rejected. Numbers keep their text, so any size or precision is accepted.
const I_ACCEPTED: &[&str] = &[
    "i_number_double_huge_neg_exp.json",
    "i_number_huge_exp.json",
    "i_number_neg_int_huge_exp.json",
    "i_number_pos_double_huge_exp.json",
    "i_number_real_neg_overflow.json",
    "i_number_real_pos_overflow.json",
    "i_number_real_underflow.json",
    "i_number_too_big_neg_int.json",
    "i_number_too_big_pos_int.json",
    "i_number_very_big_negative_int.json",
];

/// Why each rejected `i_` case is rejected.
const I_REJECTED_BECAUSE: &[(&str, &str)] = &[
    (
        "i_object_key_lone_2nd_surrogate",
        "a lone surrogate is not a character",
    ),
    ("i_string_1st_surrogate_but_2nd_missing", "a lone surrogate"),
    (
        "i_string_1st_valid_surrogate_2nd_invalid",
        "a lone surrogate",
    ),
    ("i_string_incomplete_surrogate_pair", "a lone surrogate"),
    ("i_string_inverted_surrogates_U+1D11E", "lone surrogates"),
    ("i_string_invalid_lonely_surrogate", "a lone surrogate"),
    ("i_string_invalid_surrogate", "a lone surrogate"),
    ("i_string_lone_second_surrogate", "a lone surrogate"),
    (
        "i_string_incomplete_surrogate_and_escape_valid",
        "a lone surrogate",
    ),
    (
        "i_string_incomplete_surrogates_escape_valid",
        "lone surrogates",
    ),
    ("i_string_UTF-16LE_with_BOM", "not UTF-8"),
    ("i_string_UTF-8_invalid_sequence", "not UTF-8"),
    (
        "i_string_UTF8_surrogate_U+D800",
        "not UTF-8 (an encoded surrogate)",
    ),
    ("i_string_invalid_utf-8", "not UTF-8"),
    ("i_string_iso_latin_1", "not UTF-8"),
    ("i_string_lone_utf8_continuation_byte", "not UTF-8"),
    ("i_string_not_in_unicode_range", "not UTF-8"),
    ("i_string_overlong_sequence_2_bytes", "not UTF-8"),
    ("i_string_overlong_sequence_6_bytes", "not UTF-8"),
    ("i_string_overlong_sequence_6_bytes_null", "not UTF-8"),
    ("i_string_truncated-utf-8", "not UTF-8"),
    ("i_string_utf16BE_no_BOM", "not UTF-8"),
    ("i_string_utf16LE_no_BOM", "not UTF-8"),
    (
        "i_structure_UTF-8_BOM_empty_object",
        "a byte order mark is not JSON text",
    ),
    (
        "i_structure_500_nested_arrays",
        "nested deeper than the reader's 64 levels",
    ),
];

/// How the reader answered one file.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Answer {
    Accepted,
    /// A JSON syntax error from the reader.
    Rejected,
    /// Not UTF-8: refused before the reader, as `TF_CONFIG` is.
    NotUtf8,
    Panicked,
}

fn answer(bytes: &[u8]) -> Answer {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Answer::NotUtf8;
    };
    match catch_unwind(AssertUnwindSafe(|| TfConfig::parse_all(text))) {
        Err(_) => Answer::Panicked,
        Ok(Err(errors)) if matches!(errors[..], [ClusterError::Json(_)]) => Answer::Rejected,
        Ok(Err(errors)) => {
            assert!(
                !errors.iter().any(|e| matches!(e, ClusterError::Json(_))),
                "a JSON error beside others: {errors:?}"
            );
            Answer::Accepted
        }
        Ok(Ok(_)) => Answer::Accepted,
    }
}

fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/JSONTestSuite/test_parsing")
}

/// Every case with the given prefix, by name, with its answer.
fn run(prefix: &str) -> Vec<(String, Answer)> {
    let mut cases: Vec<(String, Answer)> = std::fs::read_dir(suite())
        .expect("the vendored suite is there")
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            (name.starts_with(prefix) && name.ends_with(".json")).then_some(name)
        })
        .map(|name| {
            let bytes = std::fs::read(suite().join(&name)).unwrap();
            let a = answer(&bytes);
            (name, a)
        })
        .collect();
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    cases
}

#[test]
fn every_y_case_parses() {
    let cases = run("y_");
    assert_eq!(cases.len(), 95, "the suite has 95 y_ cases");
    let mut wrong = Vec::new();
    for (name, a) in &cases {
        let excepted = Y_REJECTED.iter().any(|(n, _)| n == name);
        let want = if excepted {
            Answer::Rejected
        } else {
            Answer::Accepted
        };
        if *a != want {
            wrong.push(format!("{name}: {a:?}, expected {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every exception names a case that exists.
    for (n, why) in Y_REJECTED {
        assert!(cases.iter().any(|(c, _)| c == n), "{n} ({why})");
    }
}

/// `n_` cases that are not UTF-8, refused before the reader (see the top of the file).
/// Each must also be rejected by the reader itself once its bad bytes are replaced by
/// U+FFFD, so that the grammar is tested on them too.
const N_NOT_UTF8: &[&str] = &[
    "n_array_a_invalid_utf8.json",
    "n_array_invalid_utf8.json",
    "n_number_invalid-utf-8-in-bigger-int.json",
    "n_number_invalid-utf-8-in-exponent.json",
    "n_number_invalid-utf-8-in-int.json",
    "n_number_real_with_invalid_utf8_after_e.json",
    "n_object_lone_continuation_byte_in_key_and_trailing_comma.json",
    "n_string_invalid-utf-8-in-escape.json",
    "n_string_invalid_utf8_after_escape.json",
    "n_structure_incomplete_UTF8_BOM.json",
    "n_structure_lone-invalid-utf-8.json",
    "n_structure_single_eacute.json",
];

#[test]
fn every_n_case_is_rejected() {
    let cases = run("n_");
    assert_eq!(cases.len(), 188, "the suite has 188 n_ cases");
    let mut wrong = Vec::new();
    for (name, a) in &cases {
        let want = if N_NOT_UTF8.contains(&name.as_str()) {
            let bytes = std::fs::read(suite().join(name)).unwrap();
            let lossy = String::from_utf8_lossy(&bytes);
            let by_reader = answer(lossy.as_bytes());
            if by_reader != Answer::Rejected {
                wrong.push(format!("{name} as {lossy:?}: {by_reader:?}"));
            }
            Answer::NotUtf8
        } else {
            Answer::Rejected
        };
        if *a != want {
            wrong.push(format!("{name}: {a:?}, expected {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn i_cases_give_the_listed_answers() {
    let cases = run("i_");
    assert_eq!(cases.len(), 35, "the suite has 35 i_ cases");
    let mut wrong = Vec::new();
    for (name, a) in &cases {
        let stem = name.trim_end_matches(".json");
        if I_ACCEPTED.contains(&name.as_str()) {
            if *a != Answer::Accepted {
                wrong.push(format!("{name}: {a:?}, listed as accepted"));
            }
            continue;
        }
        let Some((_, why)) = I_REJECTED_BECAUSE.iter().find(|(n, _)| *n == stem) else {
            wrong.push(format!("{name}: {a:?}, not listed"));
            continue;
        };
        let want = if why.starts_with("not UTF-8") {
            Answer::NotUtf8
        } else {
            Answer::Rejected
        };
        if *a != want {
            wrong.push(format!("{name}: {a:?}, listed as {want:?} ({why})"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(I_ACCEPTED.len() + I_REJECTED_BECAUSE.len(), cases.len());
}
