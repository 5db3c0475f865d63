//! Shared helpers of the integration tests.
#![allow(dead_code)]

use starwire::config::ConfigBuilder;
use starwire::{Config, Error, Runtime};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A config for `job` with the backend from `STARWIRE_BACKEND` (CI runs every test once per
/// backend) and `loops` loops.
pub fn config(job: &str, loops: usize) -> ConfigBuilder {
    ConfigBuilder::from_env(job, 0)
        .expect("environment")
        .loops(loops)
}

pub fn server(loops: usize) -> Runtime {
    server_with(config("ps", loops).build().unwrap())
}

pub fn server_with(cfg: Config) -> Runtime {
    Runtime::start(cfg, Some("127.0.0.1:0".parse().unwrap())).expect("server starts")
}

pub fn client(loops: usize) -> Runtime {
    Runtime::start(config("worker", loops).build().unwrap(), None).expect("client starts")
}

pub fn secs(n: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(n))
}

/// Pings `addr` once and returns the result.
pub fn ping_once(
    rt: &Runtime,
    addr: SocketAddr,
    deadline: Option<Instant>,
) -> Result<Duration, Error> {
    let mut h = rt.handle(8);
    let t = h.ping(addr, 16, deadline)?;
    h.wait(t)
}
