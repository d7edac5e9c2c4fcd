//! Device models: pure, deterministic service-time functions and the one actuator that serves
//! requests in arrival order on a modeled clock.
//!
//! No wall clock is read here. Time enters as an argument (`arrival_ns`, nanoseconds on the
//! modeled clock); the caller decides whether the modeled clock follows the wall clock
//! (`sleep` timing) or simply advances by the service times (`account` timing).
//!
//! Invariants:
//! 1. A [`DiskModel`] is a function of its own state (head position, platter phase derived
//!    from the start time) and the request; the same sequence of `(start_ns, op, lba, sectors)`
//!    always yields the same services.
//! 2. `Actuator::submit` serves requests strictly in submission order: a request starts at
//!    `max(arrival_ns, busy_until_ns)` and the actuator is busy until `start + service`.
//! 3. `busy_ns` is the sum of all service times; it never exceeds `busy_until_ns`.

pub(crate) mod flash;
pub(crate) mod hdd;
pub mod presets;
pub(crate) mod ssd;

use serde::Serialize;

/// Sector size of every model, in bytes: LBAs count 512-byte sectors.
pub(crate) const SECTOR_BYTES: u64 = 512;

/// The direction of a media request. Flushes and discards cost nothing on the media model
/// (writes are charged when they arrive, see `docs/device.md`), so they are not requests of a
/// model; a discard only informs a model with a mapping layer ([`DiskModel::discard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Op {
    Read,
    Write,
}

/// Where the service time of one request went, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Service {
    /// Fixed per-request controller overhead.
    pub(crate) overhead_ns: u64,
    /// Head movement.
    pub(crate) seek_ns: u64,
    /// Waiting for the first sector to rotate under the head.
    pub(crate) rotation_ns: u64,
    /// Media transfer of all sectors.
    pub(crate) transfer_ns: u64,
    /// |lba - head position| for a request that does not continue the previous one; 0 otherwise.
    pub(crate) seek_distance_sectors: u64,
    /// Flash: merge work of the FTL (copy-backs and erases) this request forced.
    pub(crate) merge_ns: u64,
}

impl Service {
    pub(crate) fn total_ns(&self) -> u64 {
        self.overhead_ns + self.seek_ns + self.rotation_ns + self.transfer_ns + self.merge_ns
    }
}

/// A device model: given the modeled time at which the actuator starts a request, returns how
/// long the request occupies it. Implementations keep their own head state.
pub trait DiskModel: Send + std::fmt::Debug {
    /// Service of a request of `sectors` sectors at `lba` that starts at `start_ns`.
    /// Precondition: `sectors > 0`.
    fn service(&mut self, start_ns: u64, op: Op, lba: u64, sectors: u64) -> Service;
    /// A discard (TRIM) of sectors `[lba, lba + sectors)`. It takes no time on any model; a
    /// model with a mapping layer (flash) forgets the discarded data. Default: nothing.
    fn discard(&mut self, _lba: u64, _sectors: u64) {}
    /// The flash model's counters; `None` for every other model.
    fn flash_stats(&self) -> Option<flash::FlashStats> {
        None
    }
    /// The preset or model name, for stats.
    fn name(&self) -> &str;
}

/// The start and end of one request on the modeled clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Interval {
    pub(crate) arrival_ns: u64,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) service: Service,
}

/// One actuator serving requests in arrival order (FIFO, no reordering) on a modeled clock.
#[derive(Debug)]
pub struct Actuator {
    model: Box<dyn DiskModel>,
    /// Modeled time at which the current request (if any) completes.
    busy_until_ns: u64,
    /// Sum of service times (modeled busy time).
    busy_ns: u64,
    seek_distance_sectors: u64,
    /// Requests that needed a seek or rotation (did not continue the previous request).
    positionings: u64,
}

impl Actuator {
    pub fn new(model: Box<dyn DiskModel>) -> Self {
        Actuator { model, busy_until_ns: 0, busy_ns: 0, seek_distance_sectors: 0, positionings: 0 }
    }

    /// Serves one request. `arrival_ns` is the modeled arrival time; `None` means "right after
    /// the previous request" (the `account` timing, where the clock is the actuator itself).
    pub(crate) fn submit(
        &mut self,
        arrival_ns: Option<u64>,
        op: Op,
        lba: u64,
        sectors: u64,
    ) -> Interval {
        assert!(sectors > 0, "empty request reached the actuator");
        let arrival_ns = arrival_ns.unwrap_or(self.busy_until_ns);
        let start_ns = arrival_ns.max(self.busy_until_ns);
        let service = self.model.service(start_ns, op, lba, sectors);
        let end_ns = start_ns + service.total_ns();
        self.busy_until_ns = end_ns;
        self.busy_ns += service.total_ns();
        self.seek_distance_sectors += service.seek_distance_sectors;
        if service.seek_ns + service.rotation_ns > 0 || service.seek_distance_sectors > 0 {
            self.positionings += 1;
        }
        debug_assert!(self.busy_ns <= self.busy_until_ns);
        Interval { arrival_ns, start_ns, end_ns, service }
    }

    /// Passes a discard of whole sectors to the model; no time passes.
    pub(crate) fn discard(&mut self, lba: u64, sectors: u64) {
        if sectors > 0 {
            self.model.discard(lba, sectors);
        }
    }

    pub(crate) fn busy_ns(&self) -> u64 {
        self.busy_ns
    }
    pub(crate) fn busy_until_ns(&self) -> u64 {
        self.busy_until_ns
    }
    pub(crate) fn seek_distance_sectors(&self) -> u64 {
        self.seek_distance_sectors
    }
    pub(crate) fn positionings(&self) -> u64 {
        self.positionings
    }
    pub(crate) fn model_name(&self) -> &str {
        self.model.name()
    }
    pub(crate) fn flash_stats(&self) -> Option<flash::FlashStats> {
        self.model.flash_stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ssd::{Ssd, SsdParams};

    fn fixed() -> Actuator {
        // 1 ms per request whatever its size: the simplest model for FIFO tests.
        let params = SsdParams {
            read_latency_ns: 1_000_000,
            write_latency_ns: 1_000_000,
            read_bytes_per_s: 0,
            write_bytes_per_s: 0,
        };
        Actuator::new(Box::new(Ssd::new("fixed", params)))
    }

    #[test]
    fn fifo_request_arriving_while_busy_waits_for_the_actuator() {
        let mut a = fixed();
        // (arrival, expected start, expected end)
        let table = [
            (0, 0, 1_000_000),
            (500_000, 1_000_000, 2_000_000),
            (5_000_000, 5_000_000, 6_000_000),
            (5_100_000, 6_000_000, 7_000_000),
        ];
        for (arrival, start, end) in table {
            let iv = a.submit(Some(arrival), Op::Write, 0, 8);
            assert_eq!((iv.start_ns, iv.end_ns), (start, end), "arrival {arrival}");
        }
        assert_eq!(a.busy_ns(), 4_000_000);
    }

    #[test]
    fn account_timing_runs_back_to_back() {
        let mut a = fixed();
        for i in 0..3 {
            let iv = a.submit(None, Op::Read, 0, 1);
            assert_eq!(iv.start_ns, i * 1_000_000);
        }
        assert_eq!(a.busy_until_ns(), 3_000_000);
    }
}
