//! Frames written by hand from `docs/wire-format.md`, and raw sockets that send them: for
//! the tests that play a hostile or broken peer. Included with `#[path]`.
#![allow(dead_code)]

use starwire::DType;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub const HELLO: u8 = 1;
pub const HELLO_ACK: u8 = 2;
pub const PING: u8 = 3;
pub const PONG: u8 = 4;
pub const RECV: u8 = 5;
pub const PULL: u8 = 7;
pub const PUSH: u8 = 8;
pub const ERROR: u8 = 10;
pub const END: u16 = 1;
pub const HEADER: usize = 32;

#[allow(clippy::too_many_arguments)]
pub fn header(
    kind: u8,
    flags: u16,
    count: u32,
    handle: u64,
    meta_len: u32,
    payload_len: u32,
) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(b"SWRE");
    h.push(2);
    h.push(kind);
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes()); // status
    h.extend_from_slice(&0u16.to_le_bytes()); // reserved
    h.extend_from_slice(&count.to_le_bytes());
    h.extend_from_slice(&handle.to_le_bytes());
    h.extend_from_slice(&meta_len.to_le_bytes());
    h.extend_from_slice(&payload_len.to_le_bytes());
    h
}

pub fn frame(
    kind: u8,
    flags: u16,
    count: u32,
    handle: u64,
    meta: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut f = header(
        kind,
        flags,
        count,
        handle,
        meta.len() as u32,
        payload.len() as u32,
    );
    f.extend_from_slice(meta);
    f.extend_from_slice(payload);
    f
}

pub fn hello_body(cluster_id: u64, job: &str, token: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&cluster_id.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes()); // task index
    m.extend_from_slice(&(16u32 << 20).to_le_bytes()); // max_frame
    m.push(job.len() as u8);
    m.push(token.len() as u8);
    m.push(16); // max_rank
    m.push(0);
    m.extend_from_slice(&4096u16.to_le_bytes()); // max_key
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&65_536u32.to_le_bytes()); // max_tensors
    m.extend_from_slice(&1024u32.to_le_bytes()); // max_tables
    m.extend_from_slice(&(1u32 << 20).to_le_bytes()); // max_rows
    m.extend_from_slice(&(1u32 << 20).to_le_bytes()); // max_row_bytes
    m.extend_from_slice(&(4u64 << 30).to_le_bytes()); // max_tensor_bytes
    m.extend_from_slice(job.as_bytes());
    m.extend_from_slice(token);
    m
}

pub fn hello(cluster_id: u64, token: &[u8]) -> Vec<u8> {
    frame(
        HELLO,
        0,
        0,
        0,
        &hello_body(cluster_id, "worker", token),
        &[],
    )
}

pub fn tensor_meta(dtype: DType, dims: &[u64], byte_len: u64) -> Vec<u8> {
    let mut m = vec![u8::from(dtype), dims.len() as u8, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&byte_len.to_le_bytes());
    for d in dims {
        m.extend_from_slice(&d.to_le_bytes());
    }
    m
}

pub fn push_frame(handle: u64, entries: &[(u64, Vec<u8>)], payload: &[u8]) -> Vec<u8> {
    let mut meta = Vec::new();
    for (id, tm) in entries {
        meta.extend_from_slice(&id.to_le_bytes());
        meta.extend_from_slice(tm);
    }
    frame(PUSH, 0, entries.len() as u32, handle, &meta, payload)
}

/// A frame read whole: kind, status, handle, meta section, payload section.
pub type RawFrame = (u8, u16, u64, Vec<u8>, Vec<u8>);

pub fn read_frame(s: &mut TcpStream) -> std::io::Result<RawFrame> {
    let f = read_raw(s)?;
    let kind = f[5];
    let status = u16::from_le_bytes([f[8], f[9]]);
    let handle = u64::from_le_bytes(f[16..24].try_into().unwrap());
    let meta_len = u32::from_le_bytes(f[24..28].try_into().unwrap()) as usize;
    let (meta, payload) = f[HEADER..].split_at(meta_len);
    Ok((kind, status, handle, meta.to_vec(), payload.to_vec()))
}

/// A frame read whole, header included, as bytes.
pub fn read_raw(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut f = vec![0u8; HEADER];
    s.read_exact(&mut f)?;
    let meta_len = u32::from_le_bytes(f[24..28].try_into().unwrap()) as usize;
    let payload_len = u32::from_le_bytes(f[28..32].try_into().unwrap()) as usize;
    f.resize(HEADER + meta_len + payload_len, 0);
    s.read_exact(&mut f[HEADER..])?;
    Ok(f)
}

/// A raw connection to `addr`, after a valid handshake.
pub fn raw_open(addr: SocketAddr) -> TcpStream {
    let mut s = raw_connect(addr);
    s.write_all(&hello(0, b"")).unwrap();
    let (kind, ..) = read_frame(&mut s).expect("HELLO_ACK");
    assert_eq!(kind, HELLO_ACK);
    s
}

pub fn raw_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads until the peer closes; returns the frames it sent first (kind and status) and
/// how long it took. Fails if the connection stays open `within`.
pub fn expect_closed(s: &mut TcpStream, within: Duration) -> (Vec<(u8, u16)>, Duration) {
    let start = Instant::now();
    s.set_read_timeout(Some(within)).unwrap();
    let mut frames = Vec::new();
    loop {
        match read_frame(s) {
            Ok((kind, status, ..)) => frames.push((kind, status)),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => break,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("connection still open after {within:?} ({e}); frames {frames:?}"),
        }
    }
    (frames, start.elapsed())
}

pub const CHUNK: u8 = 11;
/// `tensor_flags` bit 1 (docs/wire-format.md §4.7).
pub const CHUNKED: u8 = 2;

/// The meta of a chunked `u8` tensor of `len` bytes (shape `[len]`).
pub fn chunked_meta(len: u64) -> Vec<u8> {
    let mut m = tensor_meta(DType::U8, &[len], len);
    m[2] = CHUNKED;
    m
}

/// A `CHUNK` of the tensor at `index` of the frame `handle`, starting at `offset`.
pub fn chunk_frame(handle: u64, index: u32, offset: u64, bytes: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(16);
    body.extend_from_slice(&index.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&offset.to_le_bytes());
    frame(CHUNK, 0, 1, handle, &body, bytes)
}

/// Resident memory of this process in bytes (`/proc/self/statm`).
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE);
    pages * page.ok().flatten().unwrap_or(4096) as u64
}
