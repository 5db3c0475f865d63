//! [`PipelineSettings`]: how far a [`Pipeline`](super::Pipeline) may run ahead of its PS
//! tasks.

use std::time::Duration;

use crate::error::Error;
use crate::wire::DType;

/// Most pushes a [`Pipeline`](super::Pipeline) may keep in flight (its gradient blocks are
/// kept per push in flight and per PS).
pub const MAX_PUSHES_IN_FLIGHT: u32 = 64;

/// How far a [`Pipeline`](super::Pipeline) runs ahead: its staleness bound, the pushes
/// it keeps in flight, and the time its requests are given; and how its rows travel: the
/// wire dtype and the loss scale of pushes. Fields are private and every
/// setter checks nothing; [`Pipeline::new`](super::Pipeline::new) refuses settings out of
/// range, naming the setting.
///
/// ```
/// use starwire::rows::PipelineSettings;
/// use std::time::Duration;
///
/// let s = PipelineSettings::default()
///     .staleness(2)
///     .max_pushes_in_flight(3)
///     .timeout(Some(Duration::from_secs(10)));
/// assert_eq!((s.staleness_bound(), s.pushes_in_flight_bound()), (2, 3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSettings {
    staleness: u32,
    max_pushes_in_flight: u32,
    timeout: Option<Duration>,
    wire: Option<DType>,
    /// The loss scale's f32 bits (checked by the pipeline).
    loss_scale: Option<u32>,
    cache_bytes: usize,
}

impl Default for PipelineSettings {
    /// Staleness 1, 2 pushes in flight, requests given 60 s, rows travelling as the
    /// table's dtype, no loss scale, no row cache.
    fn default() -> PipelineSettings {
        PipelineSettings {
            staleness: 1,
            max_pushes_in_flight: 2,
            timeout: Some(Duration::from_secs(60)),
            wire: None,
            loss_scale: None,
            cache_bytes: 0,
        }
    }
}

impl PipelineSettings {
    /// The staleness bound `s`: the rows a step uses may miss at most `s` of this
    /// worker's own most recent pushes (see [`Pipeline`](super::Pipeline) for exactly
    /// what a row reflects). 0: each pull waits for the previous push to be answered, the
    /// rows equal [`Sharded`](crate::Sharded)'s. Any value; default 1.
    pub fn staleness(mut self, s: u32) -> PipelineSettings {
        self.staleness = s;
        self
    }

    /// The most pushes in flight (sent, not yet answered by every PS they went to): push
    /// `n` waits until push `n - max_pushes_in_flight` has been answered. 1 to
    /// [`MAX_PUSHES_IN_FLIGHT`]; default 2.
    pub fn max_pushes_in_flight(mut self, n: u32) -> PipelineSettings {
        self.max_pushes_in_flight = n;
        self
    }

    /// The time each request is given, from when it is sent, before it fails with
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout); `None`: no limit (a PS that
    /// stops answering without closing its connection then holds a wait forever). At
    /// least 1 ms when set; default 60 s.
    pub fn timeout(mut self, timeout: Option<Duration>) -> PipelineSettings {
        self.timeout = timeout;
        self
    }

    /// The dtype rows travel as: `None` (the default), the table's; for an f32, bf16 or
    /// f16 table, any of the three (the caller's rows stay in the table's dtype; see
    /// [`Sharded`](crate::Sharded#rows-in-another-float-format-on-the-wire), which does the
    /// same).
    pub fn wire_dtype(mut self, wire: Option<DType>) -> PipelineSettings {
        self.wire = wire;
        self
    }

    /// The factor pushed gradients were multiplied by (a loss scale, 2^-126 to 2^126),
    /// which the PS divides out before applying them; `None` (the default): none. For f32,
    /// bf16 and f16 tables.
    pub fn loss_scale(mut self, scale: Option<f32>) -> PipelineSettings {
        self.loss_scale = scale.map(f32::to_bits);
        self
    }

    /// The bytes of the worker's row cache ([`RowCache`](crate::rows::RowCache): its rows
    /// and their index, all allocated when the pipeline is made); 0 (the default): no
    /// cache, every row of every step pulled. With a staleness bound `s ≥ 1`, a row the
    /// cache holds that misses at most `s` of this worker's pushes when used is served
    /// from it, not pulled (see [`Pipeline`](super::Pipeline#the-row-cache)); with `s = 0`
    /// the cache serves nothing without asking. Either way the rows it holds too old are
    /// named in the pull with their versions, and a PS with `row_versions` sends only
    /// those that changed. Not 0: at least the bytes of one row with its entry.
    pub fn cache_bytes(mut self, bytes: usize) -> PipelineSettings {
        self.cache_bytes = bytes;
        self
    }

    /// The bytes of the row cache; 0: none.
    pub fn cache_capacity(&self) -> usize {
        self.cache_bytes
    }

    /// The dtype rows travel as, when set.
    pub fn wire(&self) -> Option<DType> {
        self.wire
    }

    /// The loss scale pushes are sent with, when set.
    pub fn scale(&self) -> Option<f32> {
        self.loss_scale.map(f32::from_bits)
    }

    /// The staleness bound.
    pub fn staleness_bound(&self) -> u32 {
        self.staleness
    }

    /// The most pushes in flight.
    pub fn pushes_in_flight_bound(&self) -> u32 {
        self.max_pushes_in_flight
    }

    /// The time each request is given.
    pub fn request_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Why these settings cannot run, naming the setting.
    pub(crate) fn check(&self) -> Result<(), Error> {
        if !(1..=MAX_PUSHES_IN_FLIGHT).contains(&self.max_pushes_in_flight) {
            return Err(Error::invalid(&format!(
                "pipeline: max_pushes_in_flight is {}; it must be 1 to {MAX_PUSHES_IN_FLIGHT}",
                self.max_pushes_in_flight
            )));
        }
        if self.timeout.is_some_and(|t| t < Duration::from_millis(1)) {
            return Err(Error::invalid(&format!(
                "pipeline: timeout is {:?}; it must be at least 1 ms, or none",
                self.timeout.unwrap_or_default()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn out_of_range_settings_name_themselves() {
        assert!(PipelineSettings::default().check().is_ok());
        let e = PipelineSettings::default()
            .max_pushes_in_flight(0)
            .check()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.remote_message().unwrap().contains("max_pushes_in_flight"));
        let e = PipelineSettings::default()
            .max_pushes_in_flight(MAX_PUSHES_IN_FLIGHT + 1)
            .check()
            .unwrap_err();
        assert!(e.remote_message().unwrap().contains("64"));
        let e = PipelineSettings::default()
            .timeout(Some(Duration::from_micros(10)))
            .check()
            .unwrap_err();
        assert!(e.remote_message().unwrap().contains("timeout"));
        let ok = PipelineSettings::default()
            .staleness(u32::MAX)
            .max_pushes_in_flight(MAX_PUSHES_IN_FLIGHT)
            .timeout(None);
        assert!(ok.check().is_ok());
    }
}
