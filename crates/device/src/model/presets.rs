//! Presets for the papers' drives, and parameter overrides.
//!
//! Sources and assumptions (also in `docs/device.md`):
//! - `hdd-7200`: Maxtor `DiamondMax` Plus 9, 80 GB, 7200 rpm (the thesis / `TempFFS` drive).
//!   Average seek 9.4 ms (datasheet). Track-to-track 0.8 ms, full stroke 17 ms, 55 MB/s
//!   outer-zone media rate and 4 heads are assumptions typical of that generation.
//! - `hdd-15k`: Seagate Cheetah ST336753LW: 15k rpm, 4 ms average seek, 2 ms average
//!   rotational delay, 63 MB/s (as given by the VMA paper). Track-to-track 0.2 ms and full
//!   stroke 7.4 ms (Cheetah 15K datasheet class values), 4 heads: assumptions.
//! - `hdd-7200-500g`: WD RE3 WD5002ABYS, 500 GB, 7200 rpm: average seek 8.9 ms,
//!   track-to-track 0.6 ms, full stroke 21 ms, 113 MB/s sustained (datasheet values as
//!   recalled; verify against the datasheet), 4 heads: assumption.
//! - `ssd`: a 2009-era SATA MLC SSD (Intel X25-M class): read 65 us / 250 MB/s, write
//!   85 us / 70 MB/s — assumption.
//! - `flash`: a NAND chip behind a log-block FTL (`model/flash/`); the chip is chosen by
//!   `--flash-preset` (`k9f1208` small-block, the default, or `k9f1g08` large-block; sources in
//!   `flash/nand.rs` and `docs/device.md`), the log blocks by `--log-blocks` (default 64, the
//!   NVFAT paper's setting); the size of the flash follows the device (`--size`).
//! - `none`: zero cost.
//!
//! Capacities are the IDEMA LBA counts for the nominal size (decimal GB).

use std::fmt;
use std::str::FromStr;

use super::DiskModel;
use super::flash::nand::NandPreset;
use super::flash::{Flash, LOG_BLOCKS_DEFAULT};
use super::hdd::{Hdd, HddParams};
use super::ssd::{NoCost, Ssd, SsdParams};

/// The named device models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Hdd7200,
    Hdd15k,
    Hdd7200_500g,
    Ssd,
    Flash,
    None,
}

impl Preset {
    pub(crate) const ALL: [Preset; 6] = [
        Preset::Hdd7200,
        Preset::Hdd15k,
        Preset::Hdd7200_500g,
        Preset::Ssd,
        Preset::Flash,
        Preset::None,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Preset::Hdd7200 => "hdd-7200",
            Preset::Hdd15k => "hdd-15k",
            Preset::Hdd7200_500g => "hdd-7200-500g",
            Preset::Ssd => "ssd",
            Preset::Flash => "flash",
            Preset::None => "none",
        }
    }
    pub(crate) fn is_hdd(self) -> bool {
        matches!(self, Preset::Hdd7200 | Preset::Hdd15k | Preset::Hdd7200_500g)
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Preset::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = Preset::ALL.iter().map(|p| p.name()).collect();
            format!("unknown model {s:?}; expected one of {}", names.join(", "))
        })
    }
}

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

/// The preset's HDD parameters. Panics for a non-HDD preset (a bug in the caller).
pub(crate) fn hdd_params(p: Preset) -> HddParams {
    match p {
        Preset::Hdd7200 => HddParams {
            rpm: 7200,
            capacity_sectors: 156_301_488,
            heads: 4,
            track_to_track_ns: 800 * US,
            average_seek_ns: 9_400 * US,
            full_stroke_ns: 17 * MS,
            media_rate_bytes_per_s: 55_000_000,
            overhead_ns: 0,
        },
        Preset::Hdd15k => HddParams {
            rpm: 15_000,
            capacity_sectors: 71_687_372,
            heads: 4,
            track_to_track_ns: 200 * US,
            average_seek_ns: 4 * MS,
            full_stroke_ns: 7_400 * US,
            media_rate_bytes_per_s: 63_000_000,
            overhead_ns: 0,
        },
        Preset::Hdd7200_500g => HddParams {
            rpm: 7200,
            capacity_sectors: 976_773_168,
            heads: 4,
            track_to_track_ns: 600 * US,
            average_seek_ns: 8_900 * US,
            full_stroke_ns: 21 * MS,
            media_rate_bytes_per_s: 113_000_000,
            overhead_ns: 0,
        },
        Preset::Ssd | Preset::Flash | Preset::None => panic!("{p} is not an HDD preset"),
    }
}

/// The preset's SSD parameters (the `ssd` preset only).
pub(crate) fn ssd_params(p: Preset) -> SsdParams {
    assert_eq!(p, Preset::Ssd, "{p} is not an SSD preset");
    SsdParams {
        read_latency_ns: 65 * US,
        write_latency_ns: 85 * US,
        read_bytes_per_s: 250_000_000,
        write_bytes_per_s: 70_000_000,
    }
}

/// Overrides of preset parameters; `None` keeps the preset's value. Units: ms for seek times,
/// us for overheads/latencies, MB/s (10^6 bytes) for rates.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct ModelOverrides {
    /// HDD: spindle speed in rpm.
    #[arg(long)]
    pub(crate) rpm: Option<u64>,
    /// HDD: average seek time in ms.
    #[arg(long)]
    pub(crate) avg_seek_ms: Option<f64>,
    /// HDD: track-to-track seek time in ms.
    #[arg(long)]
    pub(crate) track_to_track_ms: Option<f64>,
    /// HDD: full-stroke seek time in ms.
    #[arg(long)]
    pub(crate) full_stroke_ms: Option<f64>,
    /// HDD: media transfer rate in MB/s; SSD: both read and write rate.
    #[arg(long)]
    pub(crate) media_mb_s: Option<f64>,
    /// HDD: number of heads (recording surfaces).
    #[arg(long)]
    pub(crate) heads: Option<u64>,
    /// HDD: capacity spanned by a full stroke, in 512-byte sectors.
    #[arg(long)]
    pub(crate) capacity_sectors: Option<u64>,
    /// Per-request overhead (HDD, flash) or latency (SSD, both directions) in us.
    #[arg(long)]
    pub(crate) overhead_us: Option<f64>,
    /// flash: the NAND chip [default: k9f1208].
    #[arg(long, value_enum)]
    pub(crate) flash_preset: Option<NandPreset>,
    /// flash: log blocks of the log-block FTL [default: 64, as in the NVFAT paper]. Fewer log
    /// blocks force more merges on scattered overwrites.
    #[arg(long)]
    pub(crate) log_blocks: Option<u32>,
}

#[allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]
fn scaled(v: f64, unit: f64, what: &str) -> Result<u64, String> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{what} must be a non-negative number, got {v}"));
    }
    Ok((v * unit).round() as u64)
}

/// Builds the model for a preset with overrides applied, for a device of `device_bytes` (the
/// flash model sizes its FTL by it; the others ignore it).
pub fn build_model(
    p: Preset,
    o: &ModelOverrides,
    device_bytes: u64,
) -> Result<Box<dyn DiskModel>, String> {
    if p != Preset::Flash && (o.flash_preset.is_some() || o.log_blocks.is_some()) {
        return Err(format!("--flash-preset and --log-blocks need --model flash, not {p}"));
    }
    if p.is_hdd() {
        let mut h = hdd_params(p);
        if let Some(v) = o.rpm {
            h.rpm = v;
        }
        if let Some(v) = o.avg_seek_ms {
            h.average_seek_ns = scaled(v, 1e6, "--avg-seek-ms")?;
        }
        if let Some(v) = o.track_to_track_ms {
            h.track_to_track_ns = scaled(v, 1e6, "--track-to-track-ms")?;
        }
        if let Some(v) = o.full_stroke_ms {
            h.full_stroke_ns = scaled(v, 1e6, "--full-stroke-ms")?;
        }
        if let Some(v) = o.media_mb_s {
            h.media_rate_bytes_per_s = scaled(v, 1e6, "--media-mb-s")?;
        }
        if let Some(v) = o.heads {
            h.heads = v;
        }
        if let Some(v) = o.capacity_sectors {
            h.capacity_sectors = v;
        }
        if let Some(v) = o.overhead_us {
            h.overhead_ns = scaled(v, 1e3, "--overhead-us")?;
        }
        h.validate()?;
        Ok(Box::new(Hdd::new(p.name(), h)))
    } else if p == Preset::Ssd {
        let mut s = ssd_params(p);
        if let Some(v) = o.media_mb_s {
            s.read_bytes_per_s = scaled(v, 1e6, "--media-mb-s")?;
            s.write_bytes_per_s = s.read_bytes_per_s;
        }
        if let Some(v) = o.overhead_us {
            s.read_latency_ns = scaled(v, 1e3, "--overhead-us")?;
            s.write_latency_ns = s.read_latency_ns;
        }
        Ok(Box::new(Ssd::new(p.name(), s)))
    } else if p == Preset::Flash {
        let nand = o.flash_preset.unwrap_or_default().params();
        let overhead_ns = o.overhead_us.map_or(Ok(0), |v| scaled(v, 1e3, "--overhead-us"))?;
        let log_blocks = o.log_blocks.unwrap_or(LOG_BLOCKS_DEFAULT);
        Ok(Box::new(Flash::new(p.name(), nand, log_blocks, device_bytes, overhead_ns)?))
    } else {
        Ok(Box::new(NoCost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Op;

    #[test]
    fn every_preset_parses_and_builds() {
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>(), Ok(p));
            let mut m = build_model(p, &ModelOverrides::default(), 1 << 20).unwrap();
            let _ = m.service(0, Op::Read, 0, 8);
            assert_eq!(m.flash_stats().is_some(), p == Preset::Flash);
        }
        assert!("hdd-9000".parse::<Preset>().is_err());
    }

    #[test]
    fn hdd_15k_matches_the_vma_paper_numbers() {
        let p = hdd_params(Preset::Hdd15k);
        assert_eq!(p.rev_ns() / 2, 2 * MS, "average rotational delay 2 ms");
        assert_eq!(p.average_seek_ns, 4 * MS);
        assert_eq!(p.media_rate_bytes_per_s, 63_000_000);
    }

    #[test]
    fn overrides_apply_and_are_validated() {
        let size = 1 << 20;
        let o = ModelOverrides { full_stroke_ms: Some(30.0), ..ModelOverrides::default() };
        assert!(build_model(Preset::Hdd7200, &o, size).is_ok());
        let bad = ModelOverrides { full_stroke_ms: Some(1.0), ..ModelOverrides::default() };
        assert!(build_model(Preset::Hdd7200, &bad, size).is_err());
        let neg = ModelOverrides { rpm: Some(0), ..ModelOverrides::default() };
        assert!(build_model(Preset::Hdd15k, &neg, size).is_err());
    }

    #[test]
    fn flash_options_select_the_chip_and_the_log_blocks() {
        let size = 32 << 20;
        let o = ModelOverrides {
            flash_preset: Some(NandPreset::K9f1g08),
            log_blocks: Some(8),
            ..ModelOverrides::default()
        };
        let st = build_model(Preset::Flash, &o, size).unwrap().flash_stats().unwrap();
        assert_eq!((st.nand, st.page_bytes, st.log_blocks), (NandPreset::K9f1g08, 2048, 8));
        assert_eq!(st.logical_blocks, 256);
        let st = build_model(Preset::Flash, &ModelOverrides::default(), size)
            .unwrap()
            .flash_stats()
            .unwrap();
        assert_eq!((st.nand, st.page_bytes, st.log_blocks), (NandPreset::K9f1208, 512, 64));
        // Flash options on another model, and impossible values, are refused.
        assert!(build_model(Preset::Ssd, &o, size).is_err());
        let zero = ModelOverrides { log_blocks: Some(0), ..ModelOverrides::default() };
        assert!(build_model(Preset::Flash, &zero, size).is_err());
    }
}
