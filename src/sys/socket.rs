//! Non-blocking TCP on owned file descriptors.
//!
//! Every socket is created `SOCK_NONBLOCK | SOCK_CLOEXEC`. Data-path wrappers return
//! `io::ErrorKind::WouldBlock` for EAGAIN and retry EINTR. Sends always carry
//! `MSG_NOSIGNAL` (a closed peer is EPIPE, never SIGPIPE), which is why there is no plain
//! `writev`: use [`sendmsg`] with several iovecs instead.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    self as nsock, sockopt, AddressFamily, Backlog, MsgFlags, SockFlag, SockType, SockaddrStorage,
};

/// How a non-blocking connect started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectStatus {
    /// Connected already.
    Connected,
    /// In progress: wait for writability, then call [`take_socket_error`].
    InProgress,
}

fn family(addr: &SocketAddr) -> AddressFamily {
    match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// A new non-blocking, close-on-exec TCP socket for `addr`'s family.
pub fn tcp_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let fd = nsock::socket(
        family(addr),
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    Ok(fd)
}

/// A listening TCP socket bound to `addr` (v4 or v6) with `SO_REUSEADDR` and
/// `SO_REUSEPORT`, non-blocking and close-on-exec, with Nagle off: the sockets it accepts
/// inherit that (on Linux), also those an io_uring direct accept puts in a file table with
/// no descriptor to set it on. `backlog` is clamped to the kernel's `SOMAXCONN` by the
/// kernel itself. A task's loops after the first join the first's port with this.
pub fn listen_tcp(addr: SocketAddr, backlog: i32) -> io::Result<OwnedFd> {
    listen_on(addr, backlog, true)
}

/// The first listening socket of a task on `addr`, which no other socket may hold: a
/// second task on a port that a stale one still holds must fail, not share the port and
/// take a share of the connections. `shared` when the task's other loops will join it with
/// [`listen_tcp`].
///
/// - Not `shared`: bound without `SO_REUSEPORT`, so the kernel refuses the port while any
///   other socket listens on it, and any other listener while this one does.
/// - `shared`: `SO_REUSEPORT` lets the loops share the port, and would let another task
///   of the same user join it too. So a probe socket without it is bound first: that fails
///   while another socket listens on the port. Two tasks started at the same instant can
///   still both pass the probe before either listens. Port 0 (a fresh port) needs no probe.
///
/// A port in use fails with `io::ErrorKind::AddrInUse`, "the port is in use by another
/// socket".
pub fn listen_tcp_exclusive(addr: SocketAddr, backlog: i32, shared: bool) -> io::Result<OwnedFd> {
    if !shared {
        return listen_on(addr, backlog, false);
    }
    if addr.port() != 0 {
        let probe = tcp_socket(&addr)?;
        // As the listeners: a port whose last connections are in TIME_WAIT is free.
        nsock::setsockopt(&probe, sockopt::ReuseAddr, &true)?;
        let storage = SockaddrStorage::from(addr);
        nsock::bind(probe.as_raw_fd(), &storage).map_err(|e| bind_error(e, addr))?;
        // The probe never listened: closing it frees the port at once.
    }
    listen_on(addr, backlog, true)
}

fn listen_on(addr: SocketAddr, backlog: i32, reuse_port: bool) -> io::Result<OwnedFd> {
    let fd = tcp_socket(&addr)?;
    nsock::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if reuse_port {
        nsock::setsockopt(&fd, sockopt::ReusePort, &true)?;
    }
    set_nodelay(&fd, true)?;
    let storage = SockaddrStorage::from(addr);
    nsock::bind(fd.as_raw_fd(), &storage).map_err(|e| bind_error(e, addr))?;
    let backlog = Backlog::new(backlog.max(1)).map_err(io::Error::from)?;
    nsock::listen(&fd, backlog).map_err(|e| with_context(e, format_args!("listen on {addr}")))?;
    Ok(fd)
}

/// A failed bind of `addr`, with what `EADDRINUSE` means here.
fn bind_error(err: Errno, addr: SocketAddr) -> io::Error {
    if err == Errno::EADDRINUSE {
        with_context(
            err,
            format_args!("bind {addr}: the port is in use by another socket"),
        )
    } else {
        with_context(err, format_args!("bind {addr}"))
    }
}

/// Turns Nagle off (`on == true`) or on.
pub fn set_nodelay(fd: impl AsFd, on: bool) -> io::Result<()> {
    nsock::setsockopt(&fd, sockopt::TcpNoDelay, &on).map_err(io::Error::from)
}

/// Starts a non-blocking connect to `addr` on a fresh socket.
pub fn connect_nonblocking(addr: SocketAddr) -> io::Result<(OwnedFd, ConnectStatus)> {
    let fd = tcp_socket(&addr)?;
    let status = start_connect(&fd, addr)?;
    Ok((fd, status))
}

/// Starts a non-blocking connect on an existing socket (e.g. one with options set).
pub fn start_connect(fd: impl AsFd, addr: SocketAddr) -> io::Result<ConnectStatus> {
    let storage = SockaddrStorage::from(addr);
    match nsock::connect(fd.as_fd().as_raw_fd(), &storage) {
        Ok(()) => Ok(ConnectStatus::Connected),
        // Interrupted: the connect carries on asynchronously, as for EINPROGRESS.
        Err(Errno::EINPROGRESS) | Err(Errno::EINTR) => Ok(ConnectStatus::InProgress),
        Err(err) => Err(with_context(err, format_args!("connect to {addr}"))),
    }
}

/// Reads and clears `SO_ERROR`: `Ok(None)` when there is no pending error (a non-blocking
/// connect succeeded), `Ok(Some(err))` with the socket's error (e.g. ECONNREFUSED).
pub fn take_socket_error(fd: impl AsFd) -> io::Result<Option<io::Error>> {
    let errno = nsock::getsockopt(&fd, sockopt::SocketError)?;
    Ok((errno != 0).then(|| io::Error::from_raw_os_error(errno)))
}

/// Accepts one connection, non-blocking and close-on-exec. `WouldBlock` when none is ready.
/// Retries EINTR and ECONNABORTED (a connection reset while queued is not the listener's
/// problem).
pub fn accept_nonblocking(listener: impl AsFd) -> io::Result<OwnedFd> {
    let raw = listener.as_fd().as_raw_fd();
    loop {
        match nsock::accept4(raw, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC) {
            Ok(fd) => {
                // SAFETY: accept4 just returned this fd; nothing else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            Err(Errno::EINTR) | Err(Errno::ECONNABORTED) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

/// Receives into `buf`. `Ok(0)` is end of stream.
pub fn recv(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    let raw = fd.as_fd().as_raw_fd();
    retry_eintr(|| nsock::recv(raw, buf, MsgFlags::empty()))
}

/// Receives into several buffers with one `readv`. `Ok(0)` is end of stream.
pub fn readv(fd: impl AsFd, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    let fd = fd.as_fd();
    retry_eintr(|| nix::sys::uio::readv(fd, bufs))
}

/// Sends `buf` with `MSG_NOSIGNAL`.
pub fn send(fd: impl AsFd, buf: &[u8]) -> io::Result<usize> {
    let raw = fd.as_fd().as_raw_fd();
    retry_eintr(|| nsock::send(raw, buf, MsgFlags::MSG_NOSIGNAL))
}

/// Sends several buffers with one `sendmsg(MSG_NOSIGNAL)` (the vectored write of this
/// crate). At most `IOV_MAX` (1024) iovecs; more is EMSGSIZE. Does not allocate.
pub fn sendmsg(fd: impl AsFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    let raw = fd.as_fd().as_raw_fd();
    retry_eintr(|| nsock::sendmsg::<SockaddrStorage>(raw, bufs, &[], MsgFlags::MSG_NOSIGNAL, None))
}

/// The address the socket is bound to.
pub fn local_addr(fd: impl AsFd) -> io::Result<SocketAddr> {
    to_std(nsock::getsockname::<SockaddrStorage>(
        fd.as_fd().as_raw_fd(),
    )?)
}

/// The address of the connected peer.
pub fn peer_addr(fd: impl AsFd) -> io::Result<SocketAddr> {
    to_std(nsock::getpeername::<SockaddrStorage>(
        fd.as_fd().as_raw_fd(),
    )?)
}

fn to_std(storage: SockaddrStorage) -> io::Result<SocketAddr> {
    if let Some(v4) = storage.as_sockaddr_in() {
        Ok(SocketAddr::V4(SocketAddrV4::from(*v4)))
    } else if let Some(v6) = storage.as_sockaddr_in6() {
        Ok(SocketAddr::V6(SocketAddrV6::from(*v6)))
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "socket address is neither IPv4 nor IPv6",
        ))
    }
}

/// Runs a syscall until it is not interrupted; EAGAIN becomes `WouldBlock` (io::Error's
/// mapping of EAGAIN already is).
fn retry_eintr<T>(mut f: impl FnMut() -> nix::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(Errno::EINTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

/// Keeps the errno (and so the kind) and says what was being done.
fn with_context(err: Errno, what: std::fmt::Arguments<'_>) -> io::Error {
    let io_err = io::Error::from(err);
    io::Error::new(io_err.kind(), format!("{what}: {io_err}"))
}

/// `true` when `err` is the raw errno `code` (also through a context wrapper, by kind).
#[cfg(test)]
fn is_errno(err: &io::Error, code: i32) -> bool {
    err.raw_os_error() == Some(code) || io::Error::from_raw_os_error(code).kind() == err.kind()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::epoll::{Events, Interest, Poller};
    use nix::libc;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    use std::time::{Duration, Instant};

    fn loopback_v4() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
    }

    /// Waits until `fd` is writable (connect finished, one way or the other).
    fn wait_writable(fd: &OwnedFd) {
        let mut poller = Poller::new().unwrap();
        let mut events = Events::with_capacity(1);
        poller.add(fd, 0, Interest::WRITABLE).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if poller
                .wait(&mut events, Some(Duration::from_millis(100)))
                .unwrap()
                > 0
            {
                return;
            }
        }
        panic!("socket never became writable");
    }

    #[test]
    fn two_listeners_share_a_port_with_reuseport() {
        let a = listen_tcp(loopback_v4(), 16).unwrap();
        let addr = local_addr(&a).unwrap();
        assert_ne!(addr.port(), 0);
        let b = listen_tcp(addr, 16).unwrap();
        assert_eq!(local_addr(&b).unwrap(), addr);
    }

    #[test]
    fn an_exclusive_listener_refuses_a_port_in_use_and_its_group_shares_it() {
        // A port some other task holds with SO_REUSEPORT, as a stale server would.
        let stale = listen_tcp(loopback_v4(), 16).unwrap();
        let addr = local_addr(&stale).unwrap();
        // A wildcard listener on the same port conflicts too, for one loop or several.
        let any = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), addr.port());
        for shared in [false, true] {
            for at in [addr, any] {
                let err = listen_tcp_exclusive(at, 16, shared).unwrap_err();
                assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
                assert!(
                    err.to_string().contains("in use by another socket"),
                    "{err}"
                );
            }
        }
        drop(stale);
        // Free again: the first listener binds, and the task's other loops join it.
        let first = listen_tcp_exclusive(addr, 16, true).unwrap();
        assert_eq!(local_addr(&first).unwrap(), addr);
        let second = listen_tcp(addr, 16).unwrap();
        assert_eq!(local_addr(&second).unwrap(), addr);
        drop((first, second));
        // A task of one loop holds its port alone: no other listener can join it.
        let only = listen_tcp_exclusive(addr, 16, false).unwrap();
        let err = listen_tcp(addr, 16).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        drop(only);
        // Port 0: a fresh port, no check.
        let fresh = listen_tcp_exclusive(loopback_v4(), 16, true).unwrap();
        assert_ne!(local_addr(&fresh).unwrap().port(), 0);
    }

    #[test]
    fn a_bind_that_fails_otherwise_says_only_what_failed() {
        // An address not on this machine (TEST-NET-1): not a port in use.
        let addr: SocketAddr = "192.0.2.1:5555".parse().unwrap();
        for shared in [false, true] {
            let err = listen_tcp_exclusive(addr, 16, shared).unwrap_err();
            assert_ne!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
            assert!(
                err.to_string().starts_with("bind 192.0.2.1:5555: "),
                "{err}"
            );
            assert!(!err.to_string().contains("in use"), "{err}");
        }
    }

    #[test]
    fn ipv6_listener_binds_when_available() {
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0);
        match listen_tcp(v6, 16) {
            Ok(fd) => assert!(local_addr(&fd).unwrap().is_ipv6()),
            // Containers without IPv6 loopback.
            Err(err) => assert!(
                is_errno(&err, libc::EADDRNOTAVAIL) || is_errno(&err, libc::EAFNOSUPPORT),
                "{err}"
            ),
        }
    }

    #[test]
    fn nonblocking_connect_accept_and_data() {
        let listener = listen_tcp(loopback_v4(), 16).unwrap();
        let addr = local_addr(&listener).unwrap();
        assert_eq!(
            accept_nonblocking(&listener).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        let (client, status) = connect_nonblocking(addr).unwrap();
        if status == ConnectStatus::InProgress {
            wait_writable(&client);
        }
        assert!(take_socket_error(&client).unwrap().is_none());
        set_nodelay(&client, true).unwrap();
        assert_eq!(peer_addr(&client).unwrap(), addr);

        let server = {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match accept_nonblocking(&listener) {
                    Ok(fd) => break fd,
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        };
        assert_eq!(peer_addr(&server).unwrap(), local_addr(&client).unwrap());
        // Nagle is off on the listener, and the accepted socket inherits that (which a
        // direct accept, with no descriptor to set it on, relies on).
        assert!(nsock::getsockopt(&listener, sockopt::TcpNoDelay).unwrap());
        assert!(nsock::getsockopt(&server, sockopt::TcpNoDelay).unwrap());

        let mut buf = [0u8; 16];
        assert_eq!(
            recv(&server, &mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );

        let header = [1u8, 2, 3];
        let payload = [4u8, 5, 6, 7];
        let n = sendmsg(&client, &[IoSlice::new(&header), IoSlice::new(&payload)]).unwrap();
        assert_eq!(n, 7);
        assert_eq!(send(&client, &[8]).unwrap(), 1);

        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 8 && Instant::now() < deadline {
            let (mut a, mut b) = ([0u8; 5], [0u8; 5]);
            match readv(
                &server,
                &mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)],
            ) {
                Ok(n) => {
                    let joined: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
                    got.extend_from_slice(&joined[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, [1, 2, 3, 4, 5, 6, 7, 8]);

        // Peer gone: a send is EPIPE/ECONNRESET, not a SIGPIPE that kills the test process.
        drop(server);
        let deadline = Instant::now() + Duration::from_secs(5);
        let err = loop {
            match send(&client, &[0u8; 1024]) {
                Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                Ok(_) => panic!("send kept succeeding after the peer closed"),
                Err(e) => break e,
            }
        };
        assert!(
            is_errno(&err, libc::EPIPE) || is_errno(&err, libc::ECONNRESET),
            "{err}"
        );
    }

    #[test]
    fn connect_to_closed_port_reports_refused() {
        // Bind, learn the port, close: nobody listens there now.
        let addr = {
            let l = listen_tcp(loopback_v4(), 1).unwrap();
            local_addr(&l).unwrap()
        };
        match connect_nonblocking(addr) {
            Ok((fd, ConnectStatus::InProgress)) => {
                wait_writable(&fd);
                let err = take_socket_error(&fd).unwrap().expect("a pending error");
                assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED), "{err}");
                assert!(
                    take_socket_error(&fd).unwrap().is_none(),
                    "SO_ERROR is cleared"
                );
            }
            Ok((_, ConnectStatus::Connected)) => panic!("connected to a closed port"),
            // Loopback may refuse synchronously.
            Err(err) => assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}"),
        }
    }
}
