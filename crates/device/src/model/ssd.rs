//! The flash (SSD) model and the zero-cost model.
//!
//! SSD service time: `latency_op + ceil(bytes * 1e9 / rate_op)`; a rate of 0 means "no
//! transfer cost". No position, no seek: `seek_distance_sectors` is always 0. Flash
//! translation (log blocks, erase counts) is not modeled here.

use super::{DiskModel, Op, SECTOR_BYTES, Service};

/// Parameters of an SSD; times in nanoseconds, rates in bytes per second.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct SsdParams {
    pub(crate) read_latency_ns: u64,
    pub(crate) write_latency_ns: u64,
    pub(crate) read_bytes_per_s: u64,
    pub(crate) write_bytes_per_s: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Ssd {
    name: String,
    params: SsdParams,
}

impl Ssd {
    pub(crate) fn new(name: &str, params: SsdParams) -> Self {
        Ssd { name: name.to_string(), params }
    }
}

fn transfer_ns(bytes: u64, rate_bytes_per_s: u64) -> u64 {
    if rate_bytes_per_s == 0 {
        return 0;
    }
    (u128::from(bytes) * 1_000_000_000).div_ceil(u128::from(rate_bytes_per_s)) as u64
}

impl DiskModel for Ssd {
    fn service(&mut self, _start_ns: u64, op: Op, _lba: u64, sectors: u64) -> Service {
        assert!(sectors > 0);
        let bytes = sectors * SECTOR_BYTES;
        let (latency, rate) = match op {
            Op::Read => (self.params.read_latency_ns, self.params.read_bytes_per_s),
            Op::Write => (self.params.write_latency_ns, self.params.write_bytes_per_s),
        };
        Service {
            overhead_ns: latency,
            transfer_ns: transfer_ns(bytes, rate),
            ..Service::default()
        }
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// No cost at all: the device is only a pass-through with counters, cache and trace.
#[derive(Debug, Clone, Default)]
pub(crate) struct NoCost;

impl DiskModel for NoCost {
    fn service(&mut self, _start_ns: u64, _op: Op, _lba: u64, sectors: u64) -> Service {
        assert!(sectors > 0);
        Service::default()
    }
    fn name(&self) -> &'static str {
        "none"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets::{Preset, ssd_params};

    #[test]
    fn ssd_service_is_latency_plus_transfer() {
        let p = SsdParams {
            read_latency_ns: 50_000,
            write_latency_ns: 80_000,
            read_bytes_per_s: 256_000_000,
            write_bytes_per_s: 128_000_000,
        };
        let mut ssd = Ssd::new("t", p);
        // (op, sectors, expected total ns)
        let table = [
            (Op::Read, 8, 50_000 + 16_000),  // 4096 B at 256 MB/s = 16 us
            (Op::Write, 8, 80_000 + 32_000), // 4096 B at 128 MB/s = 32 us
            (Op::Read, 1, 50_000 + 2_000),
            (Op::Write, 3, 80_000 + 12_000),
        ];
        for (op, n, want) in table {
            assert_eq!(ssd.service(0, op, 12345, n).total_ns(), want, "{op:?} {n}");
        }
    }

    #[test]
    fn ssd_has_no_position_cost() {
        let mut ssd = Ssd::new("ssd", ssd_params(Preset::Ssd));
        let a = ssd.service(0, Op::Read, 0, 8);
        let b = ssd.service(0, Op::Read, 1 << 30, 8);
        assert_eq!(a, b);
        assert_eq!(b.seek_distance_sectors, 0);
    }

    #[test]
    fn none_costs_nothing() {
        assert_eq!(NoCost.service(7, Op::Write, 99, 1000).total_ns(), 0);
    }
}
