//! Every rejection the specification lists, truncation, and a mutation loop.

use super::*;

// ---------------------------------------------------------------------------------------
// Rejections of section 2.1 (header).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_magic() {
    for at in 0..4 {
        rejects(&patch(PING, |v| v[at] ^= 0x20), Error::BadMagic);
    }
    assert_eq!(Error::BadMagic.status(), Status::Protocol);
}

#[test]
fn reject_bad_version() {
    for ver in [0u8, 1, 3, 255] {
        let f = patch(PING, |v| v[H_VERSION] = ver);
        rejects(&f, Error::BadVersion(ver));
        assert_eq!(Error::BadVersion(ver).status(), Status::VersionMismatch);
    }
}

#[test]
fn reject_unknown_kind() {
    for k in [0u8, 17, 18, 128, 255] {
        rejects(&patch(PING, |v| v[H_KIND] = k), Error::UnknownKind(k));
    }
}

#[test]
fn reject_reserved_nonzero() {
    for (name, frame) in ALL.iter().filter(|(_, f)| !is_request(f)) {
        for x in [1u16, 0x8000] {
            let f = patch(frame, |v| set16(v, H_RESERVED, x));
            assert_eq!(try_parse(&f).unwrap_err(), Error::ReservedNotZero, "{name}");
        }
    }
}

#[test]
fn reject_undefined_flag_bits() {
    for (name, frame) in ALL {
        for bit in 1..16 {
            let f = patch(frame, |v| v[H_FLAGS + bit / 8] ^= 1 << (bit % 8));
            assert_eq!(
                try_parse(&f).unwrap_err(),
                Error::BadFlags,
                "{name} bit {bit}"
            );
        }
    }
}

#[test]
fn reject_end_where_forbidden_or_missing() {
    // END must be zero on every kind but PONG, RESPONSE and ERROR.
    for frame in [HELLO, HELLO_ACK, PING, RECV, FUSED_RECV, PULL, PUSH, CHUNK] {
        rejects(&patch(frame, |v| v[H_FLAGS] |= 1), Error::BadFlags);
    }
    // PONG without END.
    rejects(&patch(PONG, |v| v[H_FLAGS] = 0), Error::BadFlags);
    // ERROR with handle != 0 without END; ERROR with handle 0 with END.
    rejects(&patch(ERROR_REQ, |v| v[H_FLAGS] = 0), Error::BadFlags);
    rejects(&patch(ERROR_CONN, |v| v[H_FLAGS] = 1), Error::BadFlags);
    // RESPONSE: END optional.
    assert!(try_parse(&patch(RESPONSE, |v| v[H_FLAGS] = 0)).is_ok());
    assert!(try_parse(&patch(RESPONSE_CHUNKED, |v| v[H_FLAGS] = 1)).is_ok());
}

#[test]
fn reject_status_rules() {
    for (name, frame) in ALL.iter().filter(|(_, f)| !is_request(f)) {
        if frame[H_KIND] == 10 {
            continue;
        }
        for s in [1u16, 11, 0xffff] {
            let f = patch(frame, |v| set16(v, H_STATUS, s));
            assert_eq!(try_parse(&f).unwrap_err(), Error::BadStatus, "{name}");
        }
    }
    rejects(
        &patch(ERROR_CONN, |v| set16(v, H_STATUS, 0)),
        Error::BadStatus,
    );
    rejects(
        &patch(ERROR_REQ, |v| set16(v, H_STATUS, 0)),
        Error::BadStatus,
    );
}

#[test]
fn requests_read_bytes_8_to_11_as_their_timeout() {
    // On request kinds the status and reserved bytes are `timeout_ms`: any value parses.
    for (name, frame) in ALL.iter().filter(|(_, f)| is_request(f)) {
        for ms in [1u32, 0x8000, 0x0001_0000, u32::MAX] {
            let f = patch(frame, |v| v[H_STATUS..H_STATUS + 4].copy_from_slice(&ms.to_le_bytes()));
            let (h, ..) = parse_ok(&f);
            assert_eq!((h.timeout_ms, h.status), (ms, Status::Ok), "{name}");
            round_trip(&f);
        }
    }
}

#[test]
fn reject_cancel_rules() {
    // A nonzero handle, no END, no payload, 4 bytes of meta per item, at most max_tensors.
    rejects(&patch(CANCEL, |v| set64(v, H_HANDLE, 0)), Error::BadHandle);
    rejects(&patch(CANCEL, |v| v[H_FLAGS] |= 1), Error::BadFlags);
    rejects(&patch(CANCEL, |v| set32(v, H_COUNT, 3)), Error::BadMetaLen);
    rejects(&patch(CANCEL_ALL, |v| set32(v, H_COUNT, 1)), Error::BadMetaLen);
    let mut with_payload = CANCEL.to_vec();
    set32(&mut with_payload, H_PAYLOAD_LEN, 1);
    with_payload.push(0);
    rejects(&with_payload, Error::BadPayloadLen);
    let mut few = lim();
    few.max_tensors = 1;
    rejects_with(CANCEL, &few, Error::BadCount);
}

#[test]
fn reject_stats_rules() {
    // A nonzero handle, no END, no count, no meta, no payload (4.11).
    rejects(&patch(STATS, |v| set64(v, H_HANDLE, 0)), Error::BadHandle);
    rejects(&patch(STATS, |v| v[H_FLAGS] |= 1), Error::BadFlags);
    rejects(&patch(STATS, |v| set32(v, H_COUNT, 1)), Error::BadCount);
    let mut with_meta = STATS.to_vec();
    set32(&mut with_meta, H_META_LEN, 1);
    with_meta.push(0);
    rejects(&with_meta, Error::BadMetaLen);
    let mut with_payload = STATS.to_vec();
    set32(&mut with_payload, H_PAYLOAD_LEN, 1);
    with_payload.push(0);
    rejects(&with_payload, Error::BadPayloadLen);
}

#[test]
fn reject_handle_rules() {
    // Requests need a nonzero handle (2.3, 3).
    for frame in [PING, RECV, FUSED_RECV, PULL, PUSH, PUSH_CHUNKED] {
        rejects(&patch(frame, |v| set64(v, H_HANDLE, 0)), Error::BadHandle);
    }
    // HELLO and HELLO_ACK carry handle 0 (3).
    for frame in [HELLO, HELLO_ACK] {
        for hd in [1u64, 1 << 32, u64::MAX] {
            rejects(&patch(frame, |v| set64(v, H_HANDLE, hd)), Error::BadHandle);
        }
    }
    // Answers with handle 0 can never name a request in flight (2.3); the code rejects them
    // already at the header (see the report: the specification does not say where).
    for frame in [PONG, RESPONSE, RESPONSE_EMPTY, CHUNK] {
        rejects(&patch(frame, |v| set64(v, H_HANDLE, 0)), Error::BadHandle);
    }
}

#[test]
fn reject_frame_over_max_frame_from_header_alone() {
    let limits = lim();
    // Only the 32 header bytes are available.
    let huge = patch(&PING[..HEADER_LEN], |v| set32(v, H_PAYLOAD_LEN, u32::MAX));
    let h = Header::new_checked(&huge[..]).unwrap();
    assert_eq!(
        HeaderRepr::parse(&h, &limits),
        Err(Error::FrameTooLarge {
            len: 32 + u32::MAX as u64,
            max: limits.max_frame,
        })
    );
    // meta_len and payload_len both at u32::MAX: no overflow in the sum.
    let both = patch(&huge, |v| set32(v, H_META_LEN, u32::MAX));
    assert_eq!(
        HeaderRepr::parse(&Header::new_checked(&both[..]).unwrap(), &limits),
        Err(Error::FrameTooLarge {
            len: 32 + 2 * u32::MAX as u64,
            max: limits.max_frame,
        })
    );
    // Exactly max_frame is allowed, one more byte is not.
    let exact = patch(&huge, |v| set32(v, H_PAYLOAD_LEN, limits.max_frame - 32));
    assert!(HeaderRepr::parse(&Header::new_checked(&exact[..]).unwrap(), &limits).is_ok());
    let over = patch(&huge, |v| set32(v, H_PAYLOAD_LEN, limits.max_frame - 31));
    assert!(matches!(
        HeaderRepr::parse(&Header::new_checked(&over[..]).unwrap(), &limits),
        Err(Error::FrameTooLarge { .. })
    ));
    // With a small receiver limit, a whole valid frame is rejected too.
    let small = Limits {
        max_frame: PUSH.len() as u32 - 1,
        ..limits
    };
    assert!(matches!(
        try_parse_with(PUSH, &small),
        Err(Error::FrameTooLarge { .. })
    ));
    assert!(try_parse_with(
        PUSH,
        &Limits {
            max_frame: PUSH.len() as u32,
            ..limits
        }
    )
    .is_ok());
}

#[test]
fn reject_count_rules() {
    let c = |frame: &[u8], n: u32| patch(frame, |v| set32(v, H_COUNT, n));
    // count 0 on HELLO, HELLO_ACK, PING, PONG, ERROR.
    for frame in [HELLO, HELLO_ACK, PING, PONG, ERROR_CONN, ERROR_REQ] {
        rejects(&c(frame, 1), Error::BadCount);
    }
    // count 1 on RECV and CHUNK.
    rejects(&c(RECV, 2), Error::BadCount);
    rejects(&c(RECV, 0), Error::BadCount);
    rejects(&c(CHUNK, 0), Error::BadCount);
    rejects(&c(CHUNK, 2), Error::BadCount);
    // >= 1 on FUSED_RECV, PULL, PUSH.
    for frame in [FUSED_RECV, PULL, PUSH] {
        rejects(&c(frame, 0), Error::BadCount);
        rejects(&c(frame, u32::MAX), Error::BadCount);
    }
    // Over max_tensors (3 items each).
    let two = Limits {
        max_tensors: 2,
        ..lim()
    };
    for frame in [FUSED_RECV, PULL, RESPONSE] {
        rejects_with(frame, &two, Error::BadCount);
    }
    let one = Limits {
        max_tensors: 1,
        ..lim()
    };
    rejects_with(PUSH, &one, Error::BadCount);
    let three = Limits {
        max_tensors: 3,
        ..lim()
    };
    assert!(try_parse_with(FUSED_RECV, &three).is_ok());
    assert!(try_parse_with(RESPONSE, &three).is_ok());
    rejects(&c(RESPONSE_EMPTY, 65_537), Error::BadCount);
}

#[test]
fn reject_count_not_matching_items() {
    // More items announced than present, or fewer: the meta section does not match.
    rejects(
        &patch(FUSED_RECV, |v| set32(v, H_COUNT, 4)),
        Error::BadMetaLen,
    );
    rejects(
        &patch(FUSED_RECV, |v| set32(v, H_COUNT, 2)),
        Error::BadMetaLen,
    );
    rejects(&patch(PULL, |v| set32(v, H_COUNT, 2)), Error::BadMetaLen);
    rejects(&patch(PULL, |v| set32(v, H_COUNT, 4)), Error::BadMetaLen);
    rejects(&patch(PUSH, |v| set32(v, H_COUNT, 1)), Error::BadMetaLen);
    rejects(&patch(PUSH, |v| set32(v, H_COUNT, 3)), Error::BadMetaLen);
    rejects(
        &patch(RESPONSE, |v| set32(v, H_COUNT, 2)),
        Error::BadMetaLen,
    );
    rejects(
        &patch(RESPONSE, |v| set32(v, H_COUNT, 4)),
        Error::BadMetaLen,
    );
}

// ---------------------------------------------------------------------------------------
// meta_len / payload_len per kind (section 3, 4.x).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_section_lengths_fixed_by_kind() {
    // PING and PONG: empty meta.
    rejects(&with_meta(PING, &[0]), Error::BadMetaLen);
    rejects(&with_meta(PONG, &[0]), Error::BadMetaLen);
    // CHUNK: meta_len 16.
    rejects(&with_meta(CHUNK, &meta_of(CHUNK)[..15]), Error::BadMetaLen);
    rejects(
        &with_meta(CHUNK, &[meta_of(CHUNK), &[0]].concat()),
        Error::BadMetaLen,
    );
    // Empty payload on HELLO, HELLO_ACK, RECV, FUSED_RECV, PULL, ERROR.
    for frame in [
        HELLO, HELLO_ACK, RECV, FUSED_RECV, PULL, ERROR_CONN, ERROR_REQ,
    ] {
        rejects(&with_payload(frame, &[0]), Error::BadPayloadLen);
    }
    // CHUNK payload >= 1.
    rejects(&with_payload(CHUNK, &[]), Error::BadPayloadLen);
    assert!(try_parse(&with_payload(CHUNK, &[9])).is_ok());
}

#[test]
fn reject_hello_meta_len() {
    let m = meta_of(HELLO);
    rejects(&with_meta(HELLO, &m[..m.len() - 1]), Error::BadMetaLen);
    rejects(&with_meta(HELLO, &[m, &[0]].concat()), Error::BadMetaLen);
    rejects(&with_meta(HELLO, &m[..19]), Error::BadMetaLen);
    rejects(&with_meta(HELLO, &[]), Error::BadMetaLen);
    // token_len larger than what is there.
    rejects(&patch(HELLO, |v| v[M + 17] = 5), Error::BadMetaLen);
}

#[test]
fn reject_recv_meta_len() {
    let m = meta_of(RECV);
    // Short: the key runs past the end.
    rejects(&with_meta(RECV, &m[..m.len() - 1]), Error::BadMetaLen);
    // Long: trailing byte.
    rejects(&with_meta(RECV, &[m, &[0]].concat()), Error::BadMetaLen);
    // Shorter than step_id, or no key at all.
    rejects(&with_meta(RECV, &m[..7]), Error::BadMetaLen);
    rejects(&with_meta(RECV, &m[..8]), Error::BadMetaLen);
    rejects(&with_meta(RECV, &m[..9]), Error::BadMetaLen);
    // key_len running past the end of the section.
    rejects(&patch(RECV, |v| set16(v, M + 8, 4)), Error::BadMetaLen);
    rejects(
        &patch(FUSED_RECV, |v| set16(v, M + 11, 0xff)),
        Error::BadMetaLen,
    );
    // key_len shorter than the bytes present: leftover bytes.
    rejects(&patch(RECV, |v| set16(v, M + 8, 2)), Error::BadMetaLen);
}

#[test]
fn reject_pull_meta_len() {
    let m = meta_of(PULL);
    rejects(&with_meta(PULL, &m[..23]), Error::BadMetaLen);
    rejects(&with_meta(PULL, &[m, &[0]].concat()), Error::BadMetaLen);
    rejects(&with_meta(PULL, &[]), Error::BadMetaLen);
}

#[test]
fn reject_push_and_response_meta_len() {
    for frame in [PUSH, PUSH_CHUNKED, RESPONSE, RESPONSE_CHUNKED] {
        let m = meta_of(frame);
        rejects(&with_meta(frame, &m[..m.len() - 1]), Error::BadMetaLen);
        rejects(&with_meta(frame, &m[..m.len() - 8]), Error::BadMetaLen);
        rejects(&with_meta(frame, &[m, &[0]].concat()), Error::BadMetaLen);
        rejects(&with_meta(frame, &[m, &[0; 8]].concat()), Error::BadMetaLen);
    }
    // A rank that makes the tensor meta run past the section.
    rejects(&patch(PUSH, |v| v[M + 49] = 1), Error::BadMetaLen);
    rejects(&patch(RESPONSE, |v| v[M + 9] = 4), Error::BadMetaLen);
    // An entry flag that announces a tensor meta that is not there.
    rejects(&patch(RESPONSE, |v| set16(v, M + 46, 1)), Error::BadMetaLen);
    // Response with count 0 and a nonempty meta.
    rejects(&with_meta(RESPONSE_EMPTY, &[0; 8]), Error::BadMetaLen);
}

#[test]
fn reject_error_meta_len_and_message() {
    let m = meta_of(ERROR_CONN);
    rejects(&with_meta(ERROR_CONN, &m[..m.len() - 1]), Error::BadMetaLen);
    rejects(
        &with_meta(ERROR_CONN, &[m, &[0]].concat()),
        Error::BadMetaLen,
    );
    rejects(&with_meta(ERROR_CONN, &m[..1]), Error::BadMetaLen);
    rejects(&with_meta(ERROR_CONN, &[]), Error::BadMetaLen);
    // Message of 1024 bytes is fine, 1025 is not.
    let mut ok = 1024u16.to_le_bytes().to_vec();
    ok.extend_from_slice(&[b'x'; 1024]);
    assert!(try_parse(&with_meta(ERROR_CONN, &ok)).is_ok());
    let mut long = 1025u16.to_le_bytes().to_vec();
    long.extend_from_slice(&[b'x'; 1025]);
    rejects(&with_meta(ERROR_CONN, &long), Error::BadString);
    // An empty message is fine.
    assert!(try_parse(&with_meta(ERROR_CONN, &[0, 0])).is_ok());
    // ErrorRepr::new cuts to 1024.
    assert_eq!(ErrorRepr::new(&[b'y'; 2000]).message.len(), 1024);
}

#[test]
fn body_parse_rejects_meta_slice_of_wrong_length() {
    let (h, _, _) = parse_ok(FUSED_RECV);
    let meta = meta_of(FUSED_RECV);
    for n in 0..meta.len() {
        assert_eq!(Body::parse(&h, &meta[..n], &lim()), Err(Error::Truncated));
    }
    let longer = [meta, &[0]].concat();
    assert_eq!(Body::parse(&h, &longer, &lim()), Err(Error::BadMetaLen));
}

// ---------------------------------------------------------------------------------------
// Keys (4.2).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_keys() {
    // Empty key.
    let mut m = 9u64.to_le_bytes().to_vec();
    m.extend_from_slice(&[0, 0]);
    rejects(&with_meta(RECV, &m), Error::BadKey);
    // Empty key in the middle of a fused recv (count 3: "a", "", "ccc" + filler).
    let mut m = meta_of(FUSED_RECV)[..11].to_vec();
    m.extend_from_slice(&[0, 0, 3, 0, b'c', b'c', b'c']);
    rejects(&with_meta(FUSED_RECV, &m), Error::BadKey);
    // Over max_key.
    let two = Limits {
        max_key: 2,
        ..lim()
    };
    rejects_with(FUSED_RECV, &two, Error::BadKey);
    rejects_with(RECV, &two, Error::BadKey);
    let three = Limits {
        max_key: 3,
        ..lim()
    };
    assert!(try_parse_with(FUSED_RECV, &three).is_ok());
    // Default max_key is 4096: 4096 ok, 4097 rejected.
    for (len, ok) in [(4096usize, true), (4097, false)] {
        let mut m = 1u64.to_le_bytes().to_vec();
        m.extend_from_slice(&(len as u16).to_le_bytes());
        m.extend(std::iter::repeat(b'k').take(len));
        let f = with_meta(RECV, &m);
        assert_eq!(try_parse(&f).is_ok(), ok, "{len}");
        if !ok {
            rejects(&f, Error::BadKey);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tensor meta (4.7).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_rank_over_max_rank() {
    let one = Limits {
        max_rank: 1,
        ..lim()
    };
    rejects_with(PUSH, &one, Error::RankTooLarge);
    let two = Limits {
        max_rank: 2,
        ..lim()
    };
    assert!(try_parse_with(PUSH, &two).is_ok());
    // Rank 17 with the default 16; rank 33 and 255 over the hard maximum, even though the
    // dims would not fit.
    rejects(&push1(&tmeta(2, 0, 1, &[1; 17]), 1), Error::RankTooLarge);
    assert!(try_parse(&push1(&tmeta(2, 0, 1, &[1; 16]), 1)).is_ok());
    for rank in [33u8, 255] {
        let f = patch(PUSH, |v| v[M + 9] = rank);
        rejects(&f, Error::RankTooLarge);
    }
    // In a response too.
    let zero = Limits {
        max_rank: 0,
        ..lim()
    };
    rejects_with(RESPONSE, &zero, Error::RankTooLarge);
}

#[test]
fn reject_bad_dim() {
    let big = 1u64 << 63;
    rejects(&patch(PUSH, |v| set64(v, M + 24, big)), Error::BadDim);
    rejects(&patch(PUSH, |v| set64(v, M + 32, u64::MAX)), Error::BadDim);
    rejects(&patch(RESPONSE, |v| set64(v, M + 24, big)), Error::BadDim);
    // 2^63 - 1 is a legal dimension; this one then fails the byte_len/limit checks instead.
    let max_dim = push1(&tmeta(2, 0, i64::MAX as u64, &[i64::MAX as u64]), 0);
    let unlimited = Limits {
        max_tensor_bytes: i64::MAX as u64,
        ..lim()
    };
    rejects_with(&max_dim, &unlimited, Error::BadPayloadLen);
    rejects(&max_dim, Error::TensorTooLarge);
}

#[test]
fn reject_unknown_dtype() {
    for d in [0u8, 16, 255] {
        rejects(&patch(PUSH, |v| v[M + 8] = d), Error::UnknownDType(d));
        rejects(&patch(RESPONSE, |v| v[M + 8] = d), Error::UnknownDType(d));
        // A dead tensor needs a known dtype too.
        rejects(&patch(PUSH, |v| v[M + 48] = d), Error::UnknownDType(d));
    }
}

#[test]
fn reject_byte_len_mismatch_and_overflow() {
    rejects(
        &patch(PUSH, |v| set64(v, M + 16, 23)),
        Error::ByteLenMismatch,
    );
    rejects(
        &patch(PUSH, |v| set64(v, M + 16, 25)),
        Error::ByteLenMismatch,
    );
    rejects(
        &patch(PUSH, |v| set64(v, M + 16, 0)),
        Error::ByteLenMismatch,
    );
    rejects(&patch(PUSH, |v| v[M + 8] = 13), Error::ByteLenMismatch); // f64 [2,3] != 24
    rejects(
        &patch(RESPONSE, |v| set64(v, M + 16, 4)),
        Error::ByteLenMismatch,
    );
    // Product of the dims overflows u64.
    let over = tmeta(2, 0, 0, &[1 << 62, 8]);
    rejects(&push1(&over, 0), Error::ByteLenMismatch);
    // Product fits, times the element size overflows.
    let over = tmeta(13, 0, 0, &[1 << 61, 2]);
    rejects(&push1(&over, 0), Error::ByteLenMismatch);
    // Shape with a zero dimension: zero bytes.
    assert!(try_parse(&push1(&tmeta(10, 0, 0, &[5, 0, 7]), 0)).is_ok());
}

#[test]
fn reject_tensor_over_max_tensor_bytes() {
    let limits = Limits {
        max_tensor_bytes: 23,
        ..lim()
    };
    rejects_with(PUSH, &limits, Error::TensorTooLarge);
    let limits = Limits {
        max_tensor_bytes: 24,
        ..lim()
    };
    assert!(try_parse_with(PUSH, &limits).is_ok());
    // A chunked tensor counts in full (byte_len 8_000_000).
    let limits = Limits {
        max_tensor_bytes: 7_999_999,
        ..lim()
    };
    rejects_with(PUSH_CHUNKED, &limits, Error::TensorTooLarge);
    let limits = Limits {
        max_tensor_bytes: 7,
        ..lim()
    };
    rejects_with(RESPONSE, &limits, Error::TensorTooLarge);
}

#[test]
fn reject_bad_dead_tensors() {
    // Dead with byte_len.
    rejects(&push1(&tmeta(10, 1, 4, &[]), 4), Error::BadDeadTensor);
    rejects(&patch(PUSH, |v| set64(v, M + 56, 4)), Error::BadDeadTensor);
    // Dead with a rank (even a zero-sized shape).
    rejects(&push1(&tmeta(10, 1, 0, &[0]), 0), Error::BadDeadTensor);
    rejects(&push1(&tmeta(10, 1, 4, &[1]), 4), Error::BadDeadTensor);
    // Dead and chunked.
    rejects(&push1(&tmeta(10, 3, 0, &[]), 0), Error::BadDeadTensor);
    rejects(&patch(PUSH, |v| v[M + 50] = 3), Error::BadDeadTensor);
    // Dead in a response.
    let mut m = vec![0, 0, 0, 0, 0, 0, 1, 0];
    m.extend_from_slice(&tmeta(10, 1, 0, &[]));
    let f = patch(&with_payload(&with_meta(RESPONSE, &m), &[]), |v| {
        set32(v, H_COUNT, 1)
    });
    assert!(try_parse(&f).is_ok());
    m[8 + 8] = 1; // byte_len 1
    let f = patch(&with_payload(&with_meta(RESPONSE, &m), &[]), |v| {
        set32(v, H_COUNT, 1)
    });
    rejects(&f, Error::BadDeadTensor);
}

#[test]
fn reject_bad_chunked() {
    // CHUNKED with byte_len 0 (a zero-sized shape).
    rejects(&push1(&tmeta(10, 2, 0, &[0]), 0), Error::BadChunked);
    // Several CHUNKED entries in one frame are allowed (their chunks follow in entry
    // order, specification 4.8): in a PUSH ...
    let two = patch(PUSH_CHUNKED, |v| {
        v[M + 10] = 2;
        set32(v, H_PAYLOAD_LEN, 0);
        v.truncate(v.len() - 4);
    });
    assert!(try_parse_with(&two, &lim()).is_ok());
    // ... and in a RESPONSE.
    let m = meta_of(RESPONSE_CHUNKED);
    let mut second = m.to_vec();
    second[0] = 3;
    let f = patch(&with_meta(RESPONSE_CHUNKED, &[m, &second].concat()), |v| {
        set32(v, H_COUNT, 2)
    });
    assert!(try_parse_with(&f, &lim()).is_ok());
}

#[test]
fn reject_tensor_flags_and_reserved() {
    for bit in 2..16 {
        let flags = 1u16 << bit;
        rejects(&patch(PUSH, |v| set16(v, M + 10, flags)), Error::BadFlags);
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 10, flags)),
            Error::BadFlags,
        );
    }
    for at in 12..16 {
        rejects(&patch(PUSH, |v| v[M + at] = 1), Error::ReservedNotZero);
        rejects(&patch(PUSH, |v| v[M + 40 + at] = 1), Error::ReservedNotZero);
    }
}

#[test]
fn tensor_meta_parse_direct() {
    let m = tmeta(10, 0, 24, &[2, 3]);
    let (t, len) = TensorMeta::parse(&m, &lim()).unwrap();
    assert_eq!(len, 32);
    assert_eq!(t, TensorMeta::new(DType::F32, &[2, 3]).unwrap());
    for n in 0..m.len() {
        assert_eq!(
            TensorMeta::parse(&m[..n], &lim()),
            Err(Error::Truncated),
            "{n}"
        );
        assert_eq!(
            TensorMetaView::new_checked(&m[..n]).err(),
            Some(Error::Truncated)
        );
    }
    let v = TensorMetaView::new_checked(&m[..]).unwrap();
    assert_eq!(
        (v.dtype(), v.rank(), v.flags(), v.reserved()),
        (DType::F32, 2, 0, 0)
    );
    assert_eq!(
        (v.byte_len(), v.dim(0), v.dim(1), v.dim(2)),
        (24, Some(2), Some(3), None)
    );
    assert_eq!(v.total_len(), 32);
    let mut out = [0xAA; 32];
    t.emit(&mut out);
    assert_eq!(out[..], m[..]);
}

// ---------------------------------------------------------------------------------------
// Payload (4.7).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_payload_len_mismatch() {
    for frame in [PUSH, PUSH_CHUNKED, RESPONSE] {
        let p = payload_of(frame);
        rejects(
            &with_payload(frame, &p[..p.len() - 1]),
            Error::BadPayloadLen,
        );
        rejects(
            &with_payload(frame, &[p, &[0]].concat()),
            Error::BadPayloadLen,
        );
        rejects(&with_payload(frame, &[]), Error::BadPayloadLen);
    }
    // Dead and chunked tensors contribute nothing.
    for frame in [RESPONSE_CHUNKED, RESPONSE_EMPTY] {
        rejects(&with_payload(frame, &[0]), Error::BadPayloadLen);
    }
    // A chunked tensor's bytes are not in the declaring frame.
    let with_chunked_bytes = with_payload(PUSH_CHUNKED, &[0; 12]);
    rejects(&with_chunked_bytes, Error::BadPayloadLen);
}

// ---------------------------------------------------------------------------------------
// Response entries (4.5).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_response_entries() {
    // HAS_TENSOR with a nonzero status.
    for s in [1u16, 8, 999] {
        rejects(&patch(RESPONSE, |v| set16(v, M + 4, s)), Error::BadEntry);
    }
    // Undefined entry flags, with and without HAS_TENSOR.
    for bit in 2..16 {
        let flag = 1u16 << bit;
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 6, 1 | flag)),
            Error::BadFlags,
        );
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 38, flag)),
            Error::BadFlags,
        );
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 46, flag)),
            Error::BadFlags,
        );
    }
    // A nonzero status without a tensor is fine at the wire level.
    assert!(try_parse(&patch(RESPONSE, |v| set16(v, M + 44, 6))).is_ok());
}

// ---------------------------------------------------------------------------------------
// Hello (4.1).
// ---------------------------------------------------------------------------------------

fn hello_with(job: &[u8], token: &[u8], max_frame: u32, ack: bool) -> Vec<u8> {
    let base = if ack { HELLO_ACK } else { HELLO };
    let mut m = meta_of(base)[..48].to_vec();
    set32(&mut m, 12, max_frame);
    m[16] = job.len() as u8;
    m[17] = token.len() as u8;
    m.extend_from_slice(job);
    m.extend_from_slice(token);
    with_meta(base, &m)
}

#[test]
fn reject_bad_hello() {
    let mf = 1 << 20;
    assert!(try_parse(&hello_with(b"a", b"", mf, false)).is_ok());
    assert!(try_parse(&hello_with(&[b'z'; 64], &[0xff; 64], mf, false)).is_ok());
    assert!(try_parse(&hello_with(b"Az09_-", b"", mf, true)).is_ok());
    // Job name empty, too long, bad characters.
    for ack in [false, true] {
        rejects(&hello_with(b"", b"", mf, ack), Error::BadString);
        rejects(&hello_with(&[b'a'; 65], b"", mf, ack), Error::BadString);
        for bad in [b'.', b' ', b'/', b':', 0, 0x80, 0xff] {
            rejects(&hello_with(&[b'a', bad], b"", mf, ack), Error::BadString);
        }
    }
    // Token too long.
    rejects(&hello_with(b"w", &[1; 65], mf, false), Error::BadString);
    // Token in HELLO_ACK.
    rejects(&hello_with(b"ps", b"t", mf, true), Error::BadString);
    // max_frame below 65536 or above 1 GiB.
    for ack in [false, true] {
        rejects(&hello_with(b"w", b"", 65_535, ack), Error::BadLimits);
        rejects(&hello_with(b"w", b"", 0, ack), Error::BadLimits);
        rejects(&hello_with(b"w", b"", (1 << 30) + 1, ack), Error::BadLimits);
        assert!(try_parse(&hello_with(b"w", b"", 65_536, ack)).is_ok());
        assert!(try_parse(&hello_with(b"w", b"", 1 << 30, ack)).is_ok());
    }
    // The other limits out of their ranges (section 6), from the table's offsets.
    let limit = |at: usize, bytes: &[u8]| {
        patch(HELLO, |v| v[M + at..M + at + bytes.len()].copy_from_slice(bytes))
    };
    rejects(&limit(18, &[33]), Error::BadLimits); // max_rank
    rejects(&limit(20, &[0, 0]), Error::BadLimits); // max_key
    rejects(&limit(24, &[0; 4]), Error::BadLimits); // max_tensors
    rejects(&limit(24, &[1, 0, 0, 1]), Error::BadLimits); // max_tensors over 2^24
    rejects(&limit(28, &[0; 4]), Error::BadLimits); // max_tables
    rejects(&limit(28, &[1, 0, 1, 0]), Error::BadLimits); // max_tables over 2^16
    rejects(&limit(32, &[0; 4]), Error::BadLimits); // max_rows
    rejects(&limit(36, &[0; 4]), Error::BadLimits); // max_row_bytes
    rejects(&limit(40, &[0, 0, 0, 0, 0, 0, 0, 0x80]), Error::BadLimits); // max_tensor_bytes
    // Reserved.
    rejects(&patch(HELLO, |v| v[M + 19] = 1), Error::ReservedNotZero);
    // Offset 22 is `features` (4.1), no longer reserved: any bits parse, kept as sent.
    let with_features = patch(HELLO_ACK, |v| v[M + 22] = 0x03);
    let Body::HelloAck(r) = parse_ok(&with_features).1 else {
        panic!("not a HELLO_ACK")
    };
    assert_eq!(r.features.bits(), 3);
    // HelloRepr::check agrees.
    let r = HelloRepr {
        cluster_id: 1,
        task_index: 0,
        limits: Limits {
            max_frame: 65_535,
            ..Limits::default()
        },
        job: b"w",
        token: b"",
        features: crate::wire::WireFeatures::NONE,
    };
    assert_eq!(r.check(), Err(Error::BadLimits));
    assert_eq!(HelloRepr { job: b"", ..r }.check(), Err(Error::BadString));
}

// ---------------------------------------------------------------------------------------
// Chunk (4.8).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_chunk() {
    for at in 4..8 {
        rejects(&patch(CHUNK, |v| v[M + at] = 1), Error::ReservedNotZero);
    }
    rejects(&with_payload(CHUNK, &[]), Error::BadPayloadLen);
}

// ---------------------------------------------------------------------------------------
// Truncation.
// ---------------------------------------------------------------------------------------

#[test]
fn every_header_prefix_is_truncated() {
    for (name, frame) in ALL {
        for n in 0..HEADER_LEN {
            let prefix = &frame[..n];
            assert_eq!(
                Header::new_checked(prefix).err(),
                Some(Error::Truncated),
                "{name} {n}"
            );
            let view = Header::new_unchecked(prefix);
            assert_eq!(view.check_len(), Err(Error::Truncated));
            assert_eq!(
                HeaderRepr::parse(&view, &lim()),
                Err(Error::Truncated),
                "{name} {n}"
            );
            assert_eq!(
                try_parse(prefix).unwrap_err(),
                Error::Truncated,
                "{name} {n}"
            );
        }
        // Any shorter prefix of the whole frame is rejected (the frame is incomplete).
        for n in HEADER_LEN..frame.len() {
            assert!(try_parse(&frame[..n]).is_err(), "{name} {n}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Mutation loop: parsing never panics; whatever is accepted re-emits byte for byte.
// ---------------------------------------------------------------------------------------

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Parses like a receiver would, touching every accessor; returns whether it was accepted.
fn exercise(frame: &[u8], limits: &Limits) -> bool {
    let view = Header::new_unchecked(frame);
    if view.check_len().is_ok() {
        let _ = (
            view.magic(),
            view.version(),
            view.kind(),
            view.flags(),
            view.status(),
        );
        let _ = (
            view.count(),
            view.handle(),
            view.meta_len(),
            view.payload_len(),
        );
    }
    let Ok(header) = HeaderRepr::parse(&view, limits) else {
        return false;
    };
    // Feed Body::parse whatever meta bytes there are, even a short slice.
    let end = (HEADER_LEN + header.meta_len as usize).min(frame.len());
    let meta = &frame[HEADER_LEN..end];
    let Ok(body) = Body::parse(&header, meta, limits) else {
        return false;
    };
    match body {
        Body::Recv(r) | Body::FusedRecv(r) => assert_eq!(r.keys.count(), header.count as usize),
        Body::Pull(ids) => assert_eq!(ids.iter().count(), header.count as usize),
        Body::Push(e) => assert_eq!(e.count(), header.count as usize),
        Body::Response(e) => assert_eq!(e.count(), header.count as usize),
        _ => {}
    }
    let mut inline = 0u64;
    for t in body.tensors() {
        let _ = t.meta.dims.iter().count();
        if t.meta.is_inline() {
            inline += t.meta.byte_len;
        }
    }
    if matches!(header.kind, FrameKind::Push | FrameKind::Response) {
        assert_eq!(inline, header.payload_len as u64);
    }
    // Accepted encodings are canonical: the emit code reproduces them exactly.
    let again = emit_frame(
        &header,
        meta.len(),
        |b| b.copy_from_slice(&emit_body(&body)),
        &[],
    );
    assert_eq!(
        &again[..HEADER_LEN + meta.len()],
        &frame[..HEADER_LEN + meta.len()]
    );
    true
}

#[test]
fn mutations_never_panic() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let tight = Limits {
        max_frame: 65_536,
        max_key: 2,
        max_tensors: 2,
        max_rank: 1,
        max_tensor_bytes: 16,
        ..Limits::default()
    };
    let mut accepted = 0usize;
    let mut total = 0usize;
    for (_, frame) in ALL {
        for _ in 0..4000 {
            let mut f = frame.to_vec();
            let ops = 1 + rng.below(3);
            for _ in 0..ops {
                match rng.below(6) {
                    0 if !f.is_empty() => {
                        let at = rng.below(f.len());
                        f[at] ^= 1 << rng.below(8);
                    }
                    1 if !f.is_empty() => {
                        let at = rng.below(f.len());
                        f[at] = rng.next() as u8;
                    }
                    2 => {
                        let n = rng.below(f.len() + 1);
                        f.truncate(n);
                    }
                    3 => {
                        for _ in 0..rng.below(40) {
                            f.push(rng.next() as u8);
                        }
                    }
                    4 if f.len() >= 4 => {
                        // A length-like field set to an edge value.
                        let at = rng.below(f.len() - 3);
                        let vals = [0, 1, 2, 0xff, 0xffff, u32::MAX, u32::MAX / 2, 0x8000_0000];
                        f[at..at + 4].copy_from_slice(&vals[rng.below(vals.len())].to_le_bytes());
                    }
                    _ if f.len() > 1 => {
                        let at = rng.below(f.len());
                        f.remove(at);
                    }
                    _ => {}
                }
            }
            total += 1;
            if exercise(&f, &lim()) {
                accepted += 1;
            }
            exercise(&f, &tight);
        }
    }
    // Sanity: the loop did not reject everything (e.g. a broken harness).
    assert!(accepted > 0 && accepted < total, "{accepted}/{total}");
}

#[test]
fn zero_dimension_means_zero_elements_whatever_the_order() {
    let big = 1u64 << 62;
    for dims in [[big, 8, 0], [0, big, 8], [big, 0, 8]] {
        let meta = TensorMeta::new(DType::U8, &dims).expect("0 elements, no overflow");
        assert_eq!(meta.byte_len, 0);
        assert_eq!(meta.check(&lim()), Ok(()));
    }
    assert!(TensorMeta::new(DType::U8, &[big, 8]).is_none());
}

#[test]
fn error_message_is_cut_on_a_character_boundary() {
    let msg = "é".repeat(600); // 1200 bytes of two-byte characters
    let repr = ErrorRepr::new(msg.as_bytes());
    assert_eq!(repr.message.len(), 1024);
    assert!(std::str::from_utf8(repr.message).is_ok());
    let msg = format!("a{}", "é".repeat(600)); // boundary falls inside a character
    let repr = ErrorRepr::new(msg.as_bytes());
    assert_eq!(repr.message.len(), 1023);
    assert!(std::str::from_utf8(repr.message).is_ok());
}
