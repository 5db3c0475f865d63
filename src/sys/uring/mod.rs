//! io_uring: [`Ring`], one instance owned by one loop thread (the single submission site,
//! ring pressure, parking) with the probe of what the kernel offers ([`Capabilities`]);
//! the driver's io_uring half ([`UringDriver`]: slots, multishot receives, direct sockets);
//! the ring of provided receive buffers ([`BufRing`]); and the registered file table
//! ([`FixedFiles`]).

mod bufring;
mod direct;
mod driver;
mod files;
mod ring;
mod ring_fd;
#[cfg(test)]
pub use bufring::RECV_BUF_SIZE;
pub use bufring::{BufRing, BUF_GROUP};
#[cfg(test)]
pub use driver::STASH_MIN;
pub use driver::{RecvRing, UringDriver, UringOptions};
pub(crate) use files::on_socket;
pub use files::{FixedFiles, Removed, DIRECT_TABLE, FILE_TABLE};
pub use ring::{kernel_at_least, Capabilities, Ring, SetupFlags, USER_DATA_RESERVED_MIN};
#[cfg(test)]
pub use ring::{kernel_release, URING_FLAGS_ENV};
