//! Whether a receive may read ahead: on a connection of small frames, yes; for a header
//! read on its own (large frames arriving, or none yet) and for a payload received in
//! place, no.

use super::*;

/// A tensor of 75,000 f32 (300 KB): well above the zero-copy threshold.
const BIG_ID: u64 = 75_000;

/// Whether `slot`'s next receive may read ahead, and whether it is in place; the loan is
/// given back unused.
fn next_receive(s: &mut Session, slot: Option<u32>, now: Instant) -> (bool, bool) {
    let place = s.lend_recv(slot.unwrap()).expect("a receive target");
    let in_place = matches!(place.mem, RecvLoan::Tensor(_));
    s.received(slot.unwrap(), place.mem, 0, now);
    (place.ahead, in_place)
}

#[test]
fn small_frames_are_read_ahead_headers_of_large_ones_are_not() {
    let mut p = Pair::new();
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    // Before any frame has arrived the client reads a header on its own.
    assert_eq!(next_receive(&mut p.client, p.c, p.now), (false, false));
    p.pump();
    assert_eq!(p.completions().len(), 1);
    // After small frames, as much as the buffer holds.
    assert_eq!(next_receive(&mut p.client, p.c, p.now), (true, false));
    assert_eq!(next_receive(&mut p.server, p.s, p.now), (true, false));

    // A large answer: its payload is received in place, never read ahead, and the header
    // after it is read on its own.
    p.submit(pull(&[BIG_ID]), None);
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    Pair::input(&mut p.server, p.s, &up, p.now);
    let down = Pair::output(&mut p.server, &mut p.dirty, p.s);
    assert!(down.len() > 100_000, "{}", down.len());
    let mut at = 0;
    let mut saw_in_place = false;
    while at < down.len() {
        let place = p.client.lend_recv(p.c.unwrap()).expect("a receive target");
        let RecvPlace {
            mut mem,
            start,
            len,
            ahead,
        } = place;
        if matches!(mem, RecvLoan::Tensor(_)) {
            assert!(!ahead, "a payload in place is never read ahead");
            saw_in_place = true;
        }
        let n = len.min(down.len() - at);
        loan_bytes(&mut mem)[start..start + n].copy_from_slice(&down[at..at + n]);
        p.client.received(p.c.unwrap(), mem, n, p.now);
        at += n;
    }
    assert!(saw_in_place, "the payload was not received in place");
    assert_eq!(p.completions().len(), 1);
    assert_eq!(next_receive(&mut p.client, p.c, p.now), (false, false));
}
