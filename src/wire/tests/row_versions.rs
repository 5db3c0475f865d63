//! Golden fixtures of the `ROW_VERSIONS` feature (4.1 `features`, 4.9 row versions, 4.5
//! `HAS_VERSIONS`), written by hand from the specification's tables, and their rejections.
//! The fixtures of the other files are unchanged by the feature.

use super::*;

/// `PULL_ROWS`, handle 0x0000000100000005: table 7, bf16 rows of 4 (with `ROW_FORMATS`),
/// ids 42, 7 and 9, held versions 0x1000, 0 (none) and 0x2000.
#[rustfmt::skip]
const PULL_ROWS_HELD: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,                   // magic, version 2
    0x0c,                                           // kind PULL_ROWS
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags, status, reserved
    0x01, 0x00, 0x00, 0x00,                         // count 1 table
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x58, 0x00, 0x00, 0x00,                         // meta_len 88 = 8 + 32 + 24 + 24
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x07, 0x00, 0x00, 0x00,                         // table 7
    0x01, 0x00, 0x00, 0x00,                         // pull_flags: HELD_VERSIONS
    0x07, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // block: bf16, rank 2
    0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 24 = 3 x 4 x 2
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[0] = n = 3
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[1] = 4
    0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 42
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 7
    0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 9
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // held 0x1000 (id 42)
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // held 0 (id 7: none)
    0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // held 0x2000 (id 9)
];

/// Its answer with `END`: id 42 unchanged (version 0x1000, not sent), id 7 sent at version
/// 0x1001, id 9 missing (sent as zeros, version 0).
#[rustfmt::skip]
const ROWS_ANSWER_VERSIONED: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x09,                                           // kind RESPONSE
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags END
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x45, 0x00, 0x00, 0x00,                         // meta_len 69 = 8 + 32 + 21 + 8
    0x10, 0x00, 0x00, 0x00,                         // payload_len 16
    0x00, 0x00, 0x00, 0x00,                         // index 0
    0x00, 0x00,                                     // status OK
    0x07, 0x00,                                     // HAS_TENSOR | HAS_MISSING | HAS_VERSIONS
    0x07, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // bf16, rank 2
    0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 16
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[0] = s = 2 rows sent
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00,                         // versions report: n = 3
    0x01,                                           // unchanged: position 0
    0x01, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // position 1: version 0x1001
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // position 2: version 0 (missing)
    0x01, 0x00, 0x00, 0x00,                         // missing report: m = 1
    0x02, 0x00, 0x00, 0x00,                         // position 2
    0x80, 0x3f, 0x20, 0xc0, 0x00, 0x3f, 0x00, 0x40, // id 7: 1.0 -2.5 0.5 2.0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 9: zeros
];

/// An answer to a pull of 3 rows where none changed: a block of no rows, no payload.
#[rustfmt::skip]
const ROWS_ANSWER_UNCHANGED: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x09,                                           // kind RESPONSE
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags END
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x2d, 0x00, 0x00, 0x00,                         // meta_len 45 = 8 + 32 + 5
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x00, 0x00, 0x00, 0x00,                         // index 0
    0x00, 0x00,                                     // status OK
    0x05, 0x00,                                     // HAS_TENSOR | HAS_VERSIONS
    0x07, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // bf16, rank 2
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[0] = s = 0
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00,                         // n = 3
    0x07,                                           // all three unchanged
];

const H5: u64 = 0x0000_0001_0000_0005;
const BOTH: WireFeatures = WireFeatures::ALL;

fn parse_on(frame: &[u8], features: WireFeatures) -> Result<(HeaderRepr, Body<'_>)> {
    parse_on_with(frame, features, &lim())
}

fn parse_on_with<'a>(
    frame: &'a [u8],
    features: WireFeatures,
    limits: &Limits,
) -> Result<(HeaderRepr, Body<'a>)> {
    let header = HeaderRepr::parse(&Header::new_checked(frame)?, limits)?;
    let meta_end = HEADER_LEN + header.meta_len as usize;
    let meta = frame.get(HEADER_LEN..meta_end).ok_or(Error::Truncated)?;
    let body = Body::parse_with(&header, meta, limits, features)?;
    Ok((header, body))
}

/// parse -> emit -> parse on a connection with both features gives the same bytes.
fn round_trip_on(frame: &[u8]) {
    let (h, body) = parse_on(frame, BOTH).unwrap();
    let meta = emit_body(&body);
    let payload = payload_of(frame);
    let again = emit_frame(&h, meta.len(), |b| b.copy_from_slice(&meta), payload);
    assert_eq!(again, frame);
    let (h2, body2) = parse_on(&again, BOTH).unwrap();
    assert_eq!((h2, body2), (h, body));
}

#[track_caller]
fn rejects_on(frame: &[u8], features: WireFeatures, want: Error) {
    match parse_on(frame, features) {
        Ok((h, _)) => panic!("accepted, wanted {want:?}: {h:?}"),
        Err(e) => assert_eq!(e, want),
    }
}

#[test]
fn fixture_pull_rows_with_held_versions() {
    let (h, body) = parse_on(PULL_ROWS_HELD, BOTH).unwrap();
    let want_h = hdr(FrameKind::PullRows, false, Status::Ok, 1, H5, 88, 0);
    assert_eq!(h, want_h);
    let Body::PullRows(mut tables) = body else {
        panic!("{body:?}")
    };
    let t = tables.next().unwrap();
    assert!(tables.next().is_none());
    assert!(t.has_held());
    assert_eq!(t.ids().collect::<Vec<_>>(), [42, 7, 9]);
    assert_eq!(t.held().collect::<Vec<_>>(), [0x1000, 0, 0x2000]);
    assert_eq!((t.block.dtype, t.len(), t.loss_scale), (DType::BF16, 3, None));
    let block = TensorMeta::new(DType::BF16, &[3, 4]).unwrap();
    let len = pull_rows_versioned_meta_len(2, 3, true);
    assert_eq!(len, 88);
    let emitted = emit_frame(
        &want_h,
        len,
        |b| emit_pull_rows_versioned_meta(7, &block, &[42, 7, 9], &[0x1000, 0, 0x2000], b),
        &[],
    );
    assert_eq!(emitted, PULL_ROWS_HELD);
    round_trip_on(PULL_ROWS_HELD);
    // The same section without its flag and held versions is the plain pull: what a
    // connection without the feature carries.
    let plain = patch(PULL_ROWS_HELD, |v| {
        v.truncate(v.len() - 24);
        set32(v, H_META_LEN, 64);
        set32(v, M + 4, 0);
    });
    let Body::PullRows(mut tables) = parse_on(&plain, WireFeatures::NONE).unwrap().1 else {
        panic!("not a PULL_ROWS")
    };
    let t = tables.next().unwrap();
    assert!(!t.has_held());
    assert_eq!(t.held().count(), 0);
}

#[test]
fn fixture_versioned_answer() {
    let (h, body) = parse_on(ROWS_ANSWER_VERSIONED, BOTH).unwrap();
    let want_h = hdr(FrameKind::Response, true, Status::Ok, 1, H5, 69, 16);
    assert_eq!(h, want_h);
    let Body::Response(mut entries) = body else {
        panic!("{body:?}")
    };
    let e = entries.next().unwrap();
    let v = e.versions;
    assert_eq!((v.rows(), v.sent(), v.unchanged_count()), (3, 2, 1));
    assert_eq!(
        (0..3).map(|i| v.is_unchanged(i)).collect::<Vec<_>>(),
        [true, false, false]
    );
    assert_eq!((v.sent_version(0), v.sent_version(1)), (Some(0x1001), Some(0)));
    assert_eq!(v.sent_version(2), None);
    assert_eq!(e.missing.iter().collect::<Vec<_>>(), [2]);
    assert_eq!(e.tensor.unwrap().dims.iter().collect::<Vec<_>>(), [2, 4]);
    // Emitted from native parts.
    let (bitmap, sent, missing) = ([1u8], [0x1001u64, 0], [2u32]);
    let entry = ResponseEntry {
        index: 0,
        status: Status::Ok,
        tensor: Some(TensorMeta::new(DType::BF16, &[2, 4]).unwrap()),
        missing: Missing::Native(&missing),
        versions: Versions::new(3, &bitmap, &sent).unwrap(),
    };
    assert_eq!(entry.buffer_len(), 69);
    let emitted = emit_frame(&want_h, 69, |b| entry.emit(b), payload_of(ROWS_ANSWER_VERSIONED));
    assert_eq!(emitted, ROWS_ANSWER_VERSIONED);
    round_trip_on(ROWS_ANSWER_VERSIONED);
}

#[test]
fn fixture_answer_where_no_row_changed() {
    let (h, body) = parse_on(ROWS_ANSWER_UNCHANGED, BOTH).unwrap();
    assert_eq!(h.payload_len, 0);
    let Body::Response(mut entries) = body else {
        panic!("{body:?}")
    };
    let e = entries.next().unwrap();
    assert_eq!((e.versions.rows(), e.versions.sent()), (3, 0));
    assert!((0..3).all(|i| e.versions.is_unchanged(i)));
    assert_eq!(e.tensor.unwrap().byte_len, 0);
    let entry = ResponseEntry {
        index: 0,
        status: Status::Ok,
        tensor: Some(TensorMeta::new(DType::BF16, &[0, 4]).unwrap()),
        missing: Missing::default(),
        versions: Versions::new(3, &[7], &[]).unwrap(),
    };
    let emitted = emit_frame(&h, 45, |b| entry.emit(b), &[]);
    assert_eq!(emitted, ROWS_ANSWER_UNCHANGED);
    round_trip_on(ROWS_ANSWER_UNCHANGED);
}

#[test]
fn reports_that_do_not_add_up_are_not_built() {
    // The bitmap's length, bits past n, and one version per row sent.
    assert!(Versions::new(3, &[1], &[5, 6]).is_some());
    assert!(Versions::new(3, &[1], &[5]).is_none());
    assert!(Versions::new(3, &[1, 0], &[5, 6]).is_none());
    assert!(Versions::new(3, &[0b1001], &[5, 6]).is_none());
    assert!(Versions::new(0, &[], &[]).is_none());
    assert_eq!(versions_bitmap_len(8), 1);
    assert_eq!(versions_bitmap_len(9), 2);
}

#[test]
fn reject_bad_held_versions() {
    // Offsets in the meta section of PULL_ROWS_HELD: pull_flags at 4, ids from 40, held
    // versions from 64.
    let flags_at = M + 4;
    // An undefined flag bit.
    rejects_on(&patch(PULL_ROWS_HELD, |v| set32(v, flags_at, 3)), BOTH, Error::BadVersions);
    rejects_on(&patch(PULL_ROWS_HELD, |v| set32(v, flags_at, 2)), BOTH, Error::BadVersions);
    // Held versions on a connection without the feature: a reserved word not zero (a loss
    // scale on a pull, with `ROW_FORMATS` alone).
    rejects_on(PULL_ROWS_HELD, WireFeatures::NONE, Error::ReservedNotZero);
    rejects_on(PULL_ROWS_HELD, WireFeatures::ROW_FORMATS, Error::BadLossScale);
    // Fewer or more held-version bytes than ids.
    let short = patch(PULL_ROWS_HELD, |v| {
        v.truncate(v.len() - 8);
        set32(v, H_META_LEN, 80);
    });
    rejects_on(&short, BOTH, Error::BadMetaLen);
    let long = patch(PULL_ROWS_HELD, |v| {
        v.extend_from_slice(&[0; 8]);
        set32(v, H_META_LEN, 96);
    });
    rejects_on(&long, BOTH, Error::BadMetaLen);
    // The flag in a push's word is a loss scale, not held versions.
    let push = patch(PULL_ROWS_HELD, |v| v[H_KIND] = FrameKind::PushRows.into());
    assert!(parse_on(&push, BOTH).is_err());
}

#[test]
fn reject_bad_versions_reports() {
    // Entry meta at M: flags at 6, tensor meta 8..40, report: n at 40, bitmap at 44,
    // versions at 45 and 53, missing report at 61 (m) and 65 (position).
    let (flags, n_at, bitmap_at, v1_at, missing_at) = (M + 6, M + 40, M + 44, M + 53, M + 61);
    // HAS_VERSIONS on a connection without the feature.
    rejects_on(ROWS_ANSWER_VERSIONED, WireFeatures::ROW_FORMATS, Error::BadFlags);
    rejects_on(ROWS_ANSWER_UNCHANGED, WireFeatures::NONE, Error::BadFlags);
    // HAS_VERSIONS without HAS_TENSOR (a failed entry with no meta).
    let failed = patch(ROWS_ANSWER_UNCHANGED, |v| {
        set16(v, M + 4, Status::NotFound.into());
        set16(v, flags, 4);
        v.truncate(M + 8);
        set32(v, H_META_LEN, 8);
    });
    rejects_on(&failed, BOTH, Error::BadVersions);
    // n = 0; n over max_rows.
    rejects_on(&patch(ROWS_ANSWER_VERSIONED, |v| set32(v, n_at, 0)), BOTH, Error::BadVersions);
    let tight = Limits {
        max_rows: 2,
        ..Limits::default()
    };
    assert_eq!(
        parse_on_with(ROWS_ANSWER_VERSIONED, BOTH, &tight).unwrap_err(),
        Error::BadVersions
    );
    // A bit set past n.
    let past = patch(ROWS_ANSWER_VERSIONED, |v| v[bitmap_at] = 0b1001);
    rejects_on(&past, BOTH, Error::BadVersions);
    // Rows sent (n less the bits set) unlike the block's rows.
    let two_unchanged = patch(ROWS_ANSWER_VERSIONED, |v| v[bitmap_at] = 0b011);
    rejects_on(&two_unchanged, BOTH, Error::BadVersions);
    let none_unchanged = patch(ROWS_ANSWER_VERSIONED, |v| v[bitmap_at] = 0);
    rejects_on(&none_unchanged, BOTH, Error::BadVersions);
    // A missing row reported unchanged, or with a version.
    let missing_unchanged = patch(ROWS_ANSWER_VERSIONED, |v| set32(v, missing_at + 4, 0));
    rejects_on(&missing_unchanged, BOTH, Error::BadVersions);
    let missing_versioned = patch(ROWS_ANSWER_VERSIONED, |v| set64(v, v1_at, 5));
    rejects_on(&missing_versioned, BOTH, Error::BadVersions);
    // A missing position past n (with versions, positions are the request's).
    let past_n = patch(ROWS_ANSWER_VERSIONED, |v| set32(v, missing_at + 4, 3));
    rejects_on(&past_n, BOTH, Error::BadMissing);
    // The report running past the meta section.
    let cut = patch(ROWS_ANSWER_UNCHANGED, |v| set32(v, n_at, 9));
    rejects_on(&cut, BOTH, Error::BadMetaLen);
}
