//! The doorbell: a non-blocking eventfd a producer rings to wake a parked loop.
//!
//! Producers hold an `Arc<Doorbell>`; the loop waits on [`Doorbell::as_raw_fd`] (epoll
//! readiness, or an io_uring `PollAdd`/`Read` with `USER_DATA_DOORBELL`) and drains it when
//! woken. Whether to ring at all ("ring once, not per message") is the caller's decision,
//! made on the loop's parked flag.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use nix::errno::Errno;
use nix::sys::eventfd::{EfdFlags, EventFd};

/// A non-blocking, close-on-exec eventfd. `Send + Sync`.
#[derive(Debug)]
pub struct Doorbell {
    fd: EventFd,
}

impl Doorbell {
    /// Creates the eventfd (`EFD_NONBLOCK | EFD_CLOEXEC`, counter 0).
    pub fn new() -> io::Result<Doorbell> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Doorbell { fd })
    }

    /// Adds 1 to the counter, waking a waiter. Never blocks: a counter at its maximum
    /// (EAGAIN) is already ringing, so that is success. Other errors cannot happen on a
    /// valid eventfd; they are logged, not returned, so producers stay infallible.
    pub fn ring(&self) {
        loop {
            match self.fd.write(1) {
                Ok(_) | Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => continue,
                Err(err) => {
                    log::error!("doorbell: eventfd write failed: {err}");
                    return;
                }
            }
        }
    }

    /// Resets the counter and returns how many rings it held (0 when it was not ringing).
    pub fn drain(&self) -> u64 {
        loop {
            match self.fd.read() {
                Ok(n) => return n,
                Err(Errno::EAGAIN) => return 0,
                Err(Errno::EINTR) => continue,
                Err(err) => {
                    log::error!("doorbell: eventfd read failed: {err}");
                    return 0;
                }
            }
        }
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Doorbell>();
    }

    #[test]
    fn ring_then_drain_counts() {
        let bell = Doorbell::new().unwrap();
        assert_eq!(bell.drain(), 0);
        bell.ring();
        bell.ring();
        assert_eq!(bell.drain(), 2);
        assert_eq!(bell.drain(), 0);
    }

    #[test]
    fn ring_at_saturation_is_fine() {
        let bell = Doorbell::new().unwrap();
        // Push the counter to its maximum (u64::MAX - 1); a further ring gets EAGAIN.
        bell.fd.write(u64::MAX - 1).unwrap();
        bell.ring();
        assert_eq!(bell.drain(), u64::MAX - 1);
    }
}
