//! The HDD model: seek curve, rotational position and media transfer of one actuator.
//!
//! Geometry (derived, all integers):
//! - `rev_ns = 60e9 / rpm` — one revolution.
//! - `sectors_per_track = round(media_rate_bytes_per_s * rev_ns / 1e9 / 512)` — the sectors
//!   that pass under the head in one revolution at the media rate (so transfer time and
//!   rotation agree), at least 1.
//! - `sectors_per_cylinder = heads * sectors_per_track`;
//!   `cylinder(lba) = lba / sectors_per_cylinder`; `cylinders = ceil(capacity / spc)`.
//!   One zone only: the outer-zone media rate is used over the whole surface (assumption).
//!
//! Seek time for a cylinder distance `d` (Ruemmler & Wilkes' two-piece curve, anchored at the
//! three datasheet numbers track-to-track `t_tt`, average `t_avg`, full stroke `t_full`),
//! with `D = cylinders - 1` and the boundary `d_b = max(D / 3, 1)` (a random seek's mean
//! distance is a third of the stroke, so `t_avg` is placed there — an approximation):
//! - `d = 0`: 0
//! - `1 <= d <= d_b`: `t_tt + (t_avg - t_tt) * sqrt((d - 1) / (d_b - 1))` (short seek, sqrt)
//! - `d > d_b`: `t_avg + (t_full - t_avg) * (d - d_b) / (D - d_b)` (long seek, linear)
//!
//! Rotation: sector `s = lba mod sectors_per_track` of every track passes under the head at
//! times `t ≡ s * rev_ns / spt (mod rev_ns)` (no track skew). After overhead and seek, at
//! `t1 = start + overhead + seek`, the wait is `(s * rev_ns / spt - t1 mod rev_ns) mod rev_ns`.
//!
//! Transfer: `sectors * rev_ns / spt` (track and cylinder switches inside a request are free).
//!
//! A request whose `lba` equals the end of the previous request continues it: it costs the
//! overhead and the transfer only (no seek, no rotation), whatever the gap in time — the
//! drive's read-ahead and write cache hide the gap.

use super::{DiskModel, Op, SECTOR_BYTES, Service};

/// Parameters of an HDD; all times in nanoseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct HddParams {
    pub(crate) rpm: u64,
    /// Sectors the actuator's full stroke spans (the drive's capacity). The image occupies the
    /// first sectors, like a partition at the start of the drive.
    pub(crate) capacity_sectors: u64,
    /// Recording surfaces (heads); with the track size this gives the cylinder size.
    pub(crate) heads: u64,
    pub(crate) track_to_track_ns: u64,
    pub(crate) average_seek_ns: u64,
    pub(crate) full_stroke_ns: u64,
    /// Sustained media rate of the (outer) zone, bytes per second.
    pub(crate) media_rate_bytes_per_s: u64,
    /// Fixed controller overhead per request.
    pub(crate) overhead_ns: u64,
}

impl HddParams {
    pub(crate) fn rev_ns(&self) -> u64 {
        60_000_000_000 / self.rpm
    }
    pub(crate) fn sectors_per_track(&self) -> u64 {
        let bytes_per_rev = u128::from(self.media_rate_bytes_per_s) * u128::from(self.rev_ns());
        let spt = (bytes_per_rev + 500_000_000 * u128::from(SECTOR_BYTES))
            / (1_000_000_000 * u128::from(SECTOR_BYTES));
        (spt as u64).max(1)
    }
    pub(crate) fn sectors_per_cylinder(&self) -> u64 {
        self.heads * self.sectors_per_track()
    }
    pub(crate) fn cylinders(&self) -> u64 {
        self.capacity_sectors.div_ceil(self.sectors_per_cylinder()).max(1)
    }
    /// Checks the parameters once, at construction: a wrong preset is a bug, a wrong override
    /// is an operating error reported by the caller.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.rpm == 0 || self.heads == 0 || self.media_rate_bytes_per_s == 0 {
            return Err("rpm, heads and media rate must be positive".into());
        }
        if self.capacity_sectors == 0 {
            return Err("capacity must be positive".into());
        }
        if !(self.track_to_track_ns <= self.average_seek_ns
            && self.average_seek_ns <= self.full_stroke_ns)
        {
            return Err(format!(
                "seek times must satisfy track-to-track ({} ns) <= average ({} ns) <= full \
                 stroke ({} ns)",
                self.track_to_track_ns, self.average_seek_ns, self.full_stroke_ns
            ));
        }
        Ok(())
    }

    /// Seek time for a distance of `d` cylinders (see the module docs for the formula).
    #[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]
    pub(crate) fn seek_ns(&self, d: u64) -> u64 {
        let full = self.cylinders() - 1;
        let d = d.min(full);
        if d == 0 {
            return 0;
        }
        let d_b = (full / 3).max(1);
        let (tt, avg, fs) = (
            self.track_to_track_ns as f64,
            self.average_seek_ns as f64,
            self.full_stroke_ns as f64,
        );
        let t = if d <= d_b {
            if d_b == 1 {
                tt
            } else {
                tt + (avg - tt) * (((d - 1) as f64) / ((d_b - 1) as f64)).sqrt()
            }
        } else {
            avg + (fs - avg) * ((d - d_b) as f64) / ((full - d_b) as f64)
        };
        t.round() as u64
    }

    /// Transfer time of `sectors` sectors at the media rate.
    pub(crate) fn transfer_ns(&self, sectors: u64) -> u64 {
        (u128::from(sectors) * u128::from(self.rev_ns()) / u128::from(self.sectors_per_track()))
            as u64
    }

    /// Wait from time `t1_ns` until sector `lba` is under the head.
    pub(crate) fn rotation_ns(&self, t1_ns: u64, lba: u64) -> u64 {
        let rev = self.rev_ns();
        let spt = self.sectors_per_track();
        let target = (u128::from(lba % spt) * u128::from(rev) / u128::from(spt)) as u64;
        let now = t1_ns % rev;
        (target + rev - now) % rev
    }
}

/// An HDD with its head position.
#[derive(Debug, Clone)]
pub(crate) struct Hdd {
    name: String,
    params: HddParams,
    /// The sector right after the previous request; `None` before the first request.
    head_next_lba: Option<u64>,
    /// The cylinder under the head (starts at 0, the outer edge).
    head_cylinder: u64,
}

impl Hdd {
    /// Panics on invalid parameters: callers validate overrides first (`HddParams::validate`).
    pub(crate) fn new(name: &str, params: HddParams) -> Self {
        if let Err(e) = params.validate() {
            panic!("invalid HDD parameters for {name}: {e}");
        }
        Hdd { name: name.to_string(), params, head_next_lba: None, head_cylinder: 0 }
    }
}

impl DiskModel for Hdd {
    fn service(&mut self, start_ns: u64, _op: Op, lba: u64, sectors: u64) -> Service {
        assert!(sectors > 0);
        let p = &self.params;
        let spc = p.sectors_per_cylinder();
        let mut s = Service { overhead_ns: p.overhead_ns, ..Service::default() };
        if self.head_next_lba != Some(lba) {
            let target_cyl = lba / spc;
            s.seek_ns = p.seek_ns(target_cyl.abs_diff(self.head_cylinder));
            s.rotation_ns = p.rotation_ns(start_ns + s.overhead_ns + s.seek_ns, lba);
            s.seek_distance_sectors = lba.abs_diff(self.head_next_lba.unwrap_or(0));
        }
        s.transfer_ns = p.transfer_ns(sectors);
        let end = lba + sectors;
        self.head_next_lba = Some(end);
        self.head_cylinder = (end - 1) / spc;
        s
    }
    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets::{Preset, hdd_params};

    /// A small, round drive so the expectations can be checked by hand:
    /// 6000 rpm -> rev 10 ms; 51.2 MB/s -> 512,000 B per rev -> 1000 sectors per track;
    /// 2 heads -> 2000 sectors per cylinder; 2,000,000 sectors -> 1000 cylinders, D = 999,
    /// `d_b` = 333.
    fn round_drive() -> HddParams {
        HddParams {
            rpm: 6000,
            capacity_sectors: 2_000_000,
            heads: 2,
            track_to_track_ns: 1_000_000,
            average_seek_ns: 8_000_000,
            full_stroke_ns: 15_000_000,
            media_rate_bytes_per_s: 51_200_000,
            overhead_ns: 0,
        }
    }

    #[test]
    fn round_drive_geometry_is_as_documented() {
        let p = round_drive();
        assert_eq!(p.rev_ns(), 10_000_000);
        assert_eq!(p.sectors_per_track(), 1000);
        assert_eq!(p.sectors_per_cylinder(), 2000);
        assert_eq!(p.cylinders(), 1000);
        assert_eq!(p.transfer_ns(1), 10_000);
        assert_eq!(p.transfer_ns(1000), 10_000_000);
    }

    #[test]
    #[allow(clippy::cast_sign_loss)]
    fn seek_curve_hits_the_datasheet_anchors() {
        let p = round_drive();
        // (distance in cylinders, expected seek ns) from the module-doc formulas.
        let table: &[(u64, u64)] = &[
            (0, 0),
            (1, 1_000_000),      // track-to-track
            (333, 8_000_000),    // boundary = average
            (999, 15_000_000),   // full stroke
            (5_000, 15_000_000), // clamped to the stroke
            (84, 1_000_000 + (7_000_000.0f64 * (83.0f64 / 332.0).sqrt()).round() as u64),
            (666, 8_000_000 + (7_000_000.0f64 * 333.0 / 666.0).round() as u64),
        ];
        for &(d, want) in table {
            assert_eq!(p.seek_ns(d), want, "distance {d}");
        }
    }

    #[test]
    fn seek_curve_is_monotonic() {
        let p = round_drive();
        let mut prev = 0;
        for d in 0..1000 {
            let t = p.seek_ns(d);
            assert!(t >= prev, "seek time decreases at {d}");
            prev = t;
        }
    }

    /// One crafted request sequence, each row computed by hand from the module-doc formulas:
    /// `(start_ns, lba, sectors, seek_ns, rotation_ns, transfer_ns)`.
    #[test]
    fn crafted_sequence_matches_the_analytic_model() {
        let mut hdd = Hdd::new("round", round_drive());
        let rows: &[(u64, u64, u64, u64, u64, u64)] = &[
            // First request at LBA 0, time 0: cylinder 0, sector 0 is under the head.
            (0, 0, 8, 0, 0, 80_000),
            // Continues the previous one: transfer only, even after an idle gap.
            (5_000_000, 8, 8, 0, 0, 80_000),
            // Same cylinder, sector 500, at t = 10 ms (phase 0): half a revolution.
            (10_000_000, 500, 1, 0, 5_000_000, 10_000),
            // Next cylinder (lba 2000 = cylinder 1, sector 0) at t = 20 ms: track-to-track
            // 1 ms, then phase is 1 ms, so wait 9 ms for sector 0.
            (20_000_000, 2000, 1, 1_000_000, 9_000_000, 10_000),
            // Cylinder 999 (sector 250) from cylinder 1: d = 998 > d_b = 333, linear part
            // 8 ms + 7 ms * 665/666 = 14_989_489 ns; t1 = 44_989_489, phase 4_989_489,
            // sector 250 passes at 2.5 ms: wait 10 ms - 4_989_489 + 2_500_000.
            (30_000_000, 999 * 2000 + 250, 4, 14_989_489, 7_510_511, 40_000),
        ];
        for (i, &(start, lba, n, seek, rot, xfer)) in rows.iter().enumerate() {
            let s = hdd.service(start, Op::Write, lba, n);
            assert_eq!((s.seek_ns, s.rotation_ns, s.transfer_ns), (seek, rot, xfer), "row {i}");
        }
    }

    #[test]
    fn full_stroke_costs_the_presets_full_stroke_time() {
        for preset in [Preset::Hdd7200, Preset::Hdd15k, Preset::Hdd7200_500g] {
            let p = hdd_params(preset);
            let mut hdd = Hdd::new(preset.name(), p.clone());
            let _ = hdd.service(0, Op::Read, 0, 1);
            let last = p.capacity_sectors - 1;
            let s = hdd.service(1_000_000_000, Op::Read, last, 1);
            assert_eq!(s.seek_ns, p.full_stroke_ns, "{}", preset.name());
            assert_eq!(
                s.rotation_ns,
                p.rotation_ns(1_000_000_000 + p.overhead_ns + s.seek_ns, last)
            );
            assert_eq!(s.seek_distance_sectors, last - 1);
            // And track-to-track for the neighbouring cylinder.
            let mut hdd = Hdd::new(preset.name(), p.clone());
            let _ = hdd.service(0, Op::Read, 0, 1);
            let s = hdd.service(0, Op::Read, p.sectors_per_cylinder(), 1);
            assert_eq!(s.seek_ns, p.track_to_track_ns, "{}", preset.name());
        }
    }

    #[test]
    fn sequential_run_costs_only_transfer() {
        let p = hdd_params(Preset::Hdd15k);
        let mut hdd = Hdd::new("hdd-15k", p.clone());
        let first = hdd.service(0, Op::Write, 4096, 256);
        let mut total = 0;
        for i in 1..100u64 {
            let s = hdd.service(i * 1_000_000, Op::Write, 4096 + i * 256, 256);
            assert_eq!(s.seek_ns + s.rotation_ns, 0);
            total += s.total_ns();
        }
        assert_eq!(total, 99 * (p.overhead_ns + p.transfer_ns(256)));
        assert!(first.total_ns() >= p.transfer_ns(256));
    }

    #[test]
    fn media_rate_of_a_long_run_matches_the_preset() {
        for preset in [Preset::Hdd7200, Preset::Hdd15k, Preset::Hdd7200_500g] {
            let p = hdd_params(preset);
            let bytes = 64u64 << 20;
            let ns = p.transfer_ns(bytes / SECTOR_BYTES);
            #[allow(clippy::cast_precision_loss)]
            let rate = bytes as f64 / (ns as f64 / 1e9);
            #[allow(clippy::cast_precision_loss)]
            let err =
                (rate - p.media_rate_bytes_per_s as f64).abs() / p.media_rate_bytes_per_s as f64;
            assert!(err < 0.01, "{}: {rate} B/s", preset.name());
        }
    }
}
