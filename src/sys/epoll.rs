//! Edge-triggered epoll, the fallback backend.
//!
//! Every registration is edge-triggered (`EPOLLET`): an event means "the state changed", so
//! the loop must read (or write) until `WouldBlock` before it waits again, and should try
//! the syscall eagerly before registering interest at all.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// What a registration waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Interest(u8);

impl Interest {
    /// Readable, or the peer closed its write side (`EPOLLIN | EPOLLRDHUP`).
    pub const READABLE: Interest = Interest(1);
    /// Writable (`EPOLLOUT`).
    pub const WRITABLE: Interest = Interest(2);
    /// Both.
    pub const BOTH: Interest = Interest(3);

    /// The union of two interests.
    pub const fn add(self, other: Interest) -> Interest {
        Interest(self.0 | other.0)
    }

    /// Whether readability is asked for.
    pub const fn is_readable(self) -> bool {
        self.0 & 1 != 0
    }

    /// Whether writability is asked for.
    pub const fn is_writable(self) -> bool {
        self.0 & 2 != 0
    }

    fn flags(self) -> EpollFlags {
        let mut flags = EpollFlags::EPOLLET;
        if self.is_readable() {
            flags |= EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        }
        if self.is_writable() {
            flags |= EpollFlags::EPOLLOUT;
        }
        flags
    }
}

/// One readiness event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event(EpollEvent);

impl Event {
    /// The token given at registration.
    pub fn token(&self) -> u64 {
        self.0.data()
    }

    /// Data to read, or the read side is closed (reading will say which).
    pub fn is_readable(&self) -> bool {
        self.0
            .events()
            .intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLPRI | EpollFlags::EPOLLRDHUP)
    }

    /// Room to write, or an error to collect by writing.
    pub fn is_writable(&self) -> bool {
        self.0.events().contains(EpollFlags::EPOLLOUT)
    }

    /// The socket has a pending error (`EPOLLERR`); `take_socket_error` says which.
    pub fn is_error(&self) -> bool {
        self.0.events().contains(EpollFlags::EPOLLERR)
    }

    /// The peer shut down its write side, or the connection is gone.
    pub fn is_read_closed(&self) -> bool {
        self.0
            .events()
            .intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP)
    }

    /// Both directions are closed (`EPOLLHUP`).
    pub fn is_hup(&self) -> bool {
        self.0.events().contains(EpollFlags::EPOLLHUP)
    }
}

/// A fixed-capacity buffer of events, filled by [`Poller::wait`]; allocated once.
#[derive(Debug)]
pub struct Events {
    buf: Box<[EpollEvent]>,
    len: usize,
}

impl Events {
    /// Room for `capacity` events per wait (at least one).
    pub fn with_capacity(capacity: usize) -> Events {
        Events {
            buf: vec![EpollEvent::empty(); capacity.max(1)].into_boxed_slice(),
            len: 0,
        }
    }

    /// Event `i` of the last wait.
    pub fn get(&self, i: usize) -> Option<Event> {
        self.buf[..self.len].get(i).map(|e| Event(*e))
    }

    /// Events delivered by the last wait.
    pub fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.buf[..self.len].iter().map(|e| Event(*e))
    }

    /// How many events the last wait delivered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the last wait delivered nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most events one wait can deliver.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Forgets the last wait's events.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// An epoll instance owned by one loop thread.
#[derive(Debug)]
pub struct Poller {
    epoll: Epoll,
}

impl Poller {
    /// Creates an epoll instance (`EPOLL_CLOEXEC`).
    pub fn new() -> io::Result<Poller> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        Ok(Poller { epoll })
    }

    /// Registers `fd`, edge-triggered, reporting `token` in its events.
    pub fn add(&self, fd: impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        self.epoll
            .add(fd, EpollEvent::new(interest.flags(), token))
            .map_err(io::Error::from)
    }

    /// Changes the token or interest of a registered `fd`.
    pub fn modify(&self, fd: impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        let mut event = EpollEvent::new(interest.flags(), token);
        self.epoll.modify(fd, &mut event).map_err(io::Error::from)
    }

    /// Deregisters `fd` (closing it also does, once no other fd refers to the socket).
    pub fn delete(&self, fd: impl AsFd) -> io::Result<()> {
        self.epoll.delete(fd).map_err(io::Error::from)
    }

    /// Waits for events up to `timeout` (`None`: no limit) and returns how many were
    /// delivered into `events`. A signal (EINTR) returns `Ok(0)`: a wakeup like a timeout.
    ///
    /// Timeouts are rounded up to whole milliseconds so a short timeout never becomes a
    /// busy poll; longer than `i32::MAX` ms is clamped.
    pub fn wait(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<usize> {
        events.len = 0;
        let timeout = match timeout {
            None => EpollTimeout::NONE,
            Some(d) => {
                let mut ms = d.as_millis();
                if Duration::from_millis(ms as u64) < d {
                    ms += 1;
                }
                EpollTimeout::try_from(ms.min(i32::MAX as u128) as i32).unwrap_or(EpollTimeout::MAX)
            }
        };
        match self.epoll.wait(&mut events.buf, timeout) {
            Ok(n) => {
                events.len = n;
                Ok(n)
            }
            Err(Errno::EINTR) => Ok(0),
            Err(err) => Err(err.into()),
        }
    }
}

impl AsRawFd for Poller {
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::doorbell::Doorbell;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    #[test]
    fn timeout_with_no_events() {
        let mut poller = Poller::new().unwrap();
        let mut events = Events::with_capacity(8);
        let t = Instant::now();
        assert_eq!(
            poller
                .wait(&mut events, Some(Duration::from_millis(30)))
                .unwrap(),
            0
        );
        assert!(t.elapsed() >= Duration::from_millis(29));
        assert!(events.is_empty());
        // Sub-millisecond timeouts still wait rather than spin.
        assert_eq!(
            poller
                .wait(&mut events, Some(Duration::from_micros(10)))
                .unwrap(),
            0
        );
    }

    #[test]
    fn edge_triggered_readiness_on_unix_pair() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut poller = Poller::new().unwrap();
        let mut events = Events::with_capacity(4);
        poller.add(&b, 7, Interest::READABLE).unwrap();

        a.write_all(b"hello").unwrap();
        assert_eq!(
            poller
                .wait(&mut events, Some(Duration::from_secs(1)))
                .unwrap(),
            1
        );
        let ev = events.iter().next().unwrap();
        assert_eq!(ev.token(), 7);
        assert!(ev.is_readable() && !ev.is_writable());

        // Edge-triggered: no new edge, no new event, although the bytes are still unread.
        assert_eq!(
            poller
                .wait(&mut events, Some(Duration::from_millis(20)))
                .unwrap(),
            0
        );

        let mut buf = [0u8; 16];
        assert_eq!(b.read(&mut buf).unwrap(), 5);
        a.write_all(b"again").unwrap();
        assert_eq!(
            poller
                .wait(&mut events, Some(Duration::from_secs(1)))
                .unwrap(),
            1
        );

        // Interest change and peer close.
        poller.modify(&b, 8, Interest::BOTH).unwrap();
        drop(a);
        let n = poller
            .wait(&mut events, Some(Duration::from_secs(1)))
            .unwrap();
        assert_eq!(n, 1);
        let ev = events.iter().next().unwrap();
        assert_eq!(ev.token(), 8);
        assert!(ev.is_read_closed() && ev.is_writable());
        poller.delete(&b).unwrap();
    }

    #[test]
    fn readiness_on_tcp_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut poller = Poller::new().unwrap();
        let mut events = Events::with_capacity(2);
        poller
            .add(&server, 1, Interest::READABLE.add(Interest::WRITABLE))
            .unwrap();
        // A fresh socket is writable at once.
        assert_eq!(
            poller
                .wait(&mut events, Some(Duration::from_secs(1)))
                .unwrap(),
            1
        );
        assert!(events.iter().next().unwrap().is_writable());
        client.write_all(&[1, 2, 3]).unwrap();
        assert_eq!(
            poller
                .wait(&mut events, Some(Duration::from_secs(1)))
                .unwrap(),
            1
        );
        let ev = events.iter().next().unwrap();
        assert!(ev.is_readable());
    }

    #[test]
    fn doorbell_from_another_thread_wakes_a_wait() {
        let bell = std::sync::Arc::new(Doorbell::new().unwrap());
        let mut poller = Poller::new().unwrap();
        let mut events = Events::with_capacity(1);
        poller
            .add(&*bell, u64::MAX - 1, Interest::READABLE)
            .unwrap();
        let producer = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            })
        };
        let t = Instant::now();
        let n = poller
            .wait(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        producer.join().unwrap();
        assert_eq!(n, 1);
        assert!(t.elapsed() < Duration::from_secs(4));
        assert_eq!(events.iter().next().unwrap().token(), u64::MAX - 1);
        assert_eq!(bell.drain(), 1);
        assert_eq!(bell.drain(), 0);
    }
}
