//! Syscalls: io_uring, epoll, eventfd, CPU affinity. The only module that may use `unsafe`
//! freely; every block carries a `// SAFETY:` comment.
#![allow(unsafe_code)]
