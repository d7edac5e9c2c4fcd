//! The NAND chip: geometry, operation times and energies, and the presets.
//!
//! A chip is an array of erase blocks of `pages_per_block` pages of `page_bytes` bytes (the
//! spare area of each page is not modeled). Three array operations exist, and one bus:
//!
//! | operation | time | energy |
//! |---|---|---|
//! | page read (host) | `t_R + page_bytes * t_byte` | `Vcc * I_read * time` |
//! | page program (host) | `page_bytes * t_byte + t_PROG` | `Vcc * I_program * time` |
//! | copy-back (merge) | `t_R + t_PROG` (no bus transfer) | `Vcc * (I_read * t_R + I_program * t_PROG)` |
//! | block erase | `t_BERS` | `Vcc * I_erase * t_BERS` |
//!
//! `t_R` moves a page from the array into the page register, `t_byte` (= tRC = tWC) moves one
//! byte over the 8-bit bus, `t_PROG` programs the register into the array. A copy-back (the
//! chip's internal page move, which merges use) reads into the register and programs it
//! elsewhere without crossing the bus. The datasheets give supply currents, not energies: the
//! energy of an operation is `Vcc * Icc(typical) * its time` (the same model the NVFAT paper
//! applies through Du et al.'s per-operation energies: counts times energy per operation).
//!
//! Units: times in ns, voltage in mV, currents in uA, so `mV * uA * ns / 1000` is femtojoules
//! (fJ); every product is computed in `u128` and exact for the presets.

use serde::{Deserialize, Serialize};

use super::ftl::NandOps;

/// The NAND presets (`--flash-preset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum NandPreset {
    /// Samsung K9F1208U0B, 512 Mbit SLC small-block NAND (512 B pages, 32 pages = 16 KiB per
    /// block): the 64 MiB class of chip on the paper's PXA255 board, the kind of NAND the
    /// log-block FTL was designed for.
    #[default]
    K9f1208,
    /// Samsung K9F1G08U0A, 1 Gbit SLC large-block NAND (2 KiB pages, 64 pages = 128 KiB per
    /// block).
    K9f1g08,
}

impl NandPreset {
    pub(crate) fn name(self) -> &'static str {
        match self {
            NandPreset::K9f1208 => "k9f1208",
            NandPreset::K9f1g08 => "k9f1g08",
        }
    }

    /// The preset's parameters. Sources and assumptions: see `docs/device.md` ("Flash").
    pub(crate) fn params(self) -> NandParams {
        const US: u64 = 1_000;
        const MS: u64 = 1_000_000;
        match self {
            NandPreset::K9f1208 => NandParams {
                preset: self,
                chip: "Samsung K9F1208U0B (512 Mbit SLC, small block)",
                page_bytes: 512,
                pages_per_block: 32,
                read_ns: 15 * US,
                program_ns: 200 * US,
                erase_ns: 2 * MS,
                bus_ns_per_byte: 50,
                vcc_mv: 3300,
                read_ua: 10_000,
                program_ua: 10_000,
                erase_ua: 10_000,
            },
            NandPreset::K9f1g08 => NandParams {
                preset: self,
                chip: "Samsung K9F1G08U0A (1 Gbit SLC, large block)",
                page_bytes: 2048,
                pages_per_block: 64,
                read_ns: 25 * US,
                program_ns: 200 * US,
                erase_ns: 2 * MS,
                bus_ns_per_byte: 25,
                vcc_mv: 3300,
                read_ua: 15_000,
                program_ua: 15_000,
                erase_ua: 15_000,
            },
        }
    }
}

impl std::fmt::Display for NandPreset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One NAND chip's geometry, times (ns) and supply (mV, uA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct NandParams {
    pub(crate) preset: NandPreset,
    pub(crate) chip: &'static str,
    /// Data bytes per page (the spare area is not modeled); a multiple of 512.
    pub(crate) page_bytes: u64,
    pub(crate) pages_per_block: u64,
    /// t_R: array to page register.
    pub(crate) read_ns: u64,
    /// t_PROG: page register to array.
    pub(crate) program_ns: u64,
    /// t_BERS: one block erase.
    pub(crate) erase_ns: u64,
    /// tRC = tWC: one byte over the 8-bit bus.
    pub(crate) bus_ns_per_byte: u64,
    pub(crate) vcc_mv: u64,
    /// Typical supply current while reading (ICC1, serial access included).
    pub(crate) read_ua: u64,
    /// Typical supply current while programming (ICC2).
    pub(crate) program_ua: u64,
    /// Typical supply current while erasing (ICC3).
    pub(crate) erase_ua: u64,
}

/// The price of a batch of NAND operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Cost {
    /// Host page reads and programs (bus transfer included).
    pub(crate) host_ns: u64,
    /// Merge work: copy-backs and erases.
    pub(crate) merge_ns: u64,
    pub(crate) energy_fj: u64,
}

fn energy_fj(mv: u64, ua: u64, ns: u64) -> u128 {
    u128::from(mv) * u128::from(ua) * u128::from(ns) / 1000
}

impl NandParams {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.page_bytes == 0 || self.page_bytes % 512 != 0 {
            return Err(format!(
                "page size {} must be a positive multiple of 512",
                self.page_bytes
            ));
        }
        if self.pages_per_block == 0 {
            return Err("pages per block must be positive".into());
        }
        Ok(())
    }
    pub(crate) fn block_bytes(&self) -> u64 {
        self.page_bytes * self.pages_per_block
    }
    /// One page over the bus.
    pub(crate) fn bus_ns(&self) -> u64 {
        self.page_bytes * self.bus_ns_per_byte
    }
    pub(crate) fn host_read_ns(&self) -> u64 {
        self.read_ns + self.bus_ns()
    }
    pub(crate) fn host_program_ns(&self) -> u64 {
        self.bus_ns() + self.program_ns
    }
    pub(crate) fn copy_back_ns(&self) -> u64 {
        self.read_ns + self.program_ns
    }
    pub(crate) fn host_read_fj(&self) -> u128 {
        energy_fj(self.vcc_mv, self.read_ua, self.host_read_ns())
    }
    pub(crate) fn host_program_fj(&self) -> u128 {
        energy_fj(self.vcc_mv, self.program_ua, self.host_program_ns())
    }
    pub(crate) fn copy_back_fj(&self) -> u128 {
        energy_fj(self.vcc_mv, self.read_ua, self.read_ns)
            + energy_fj(self.vcc_mv, self.program_ua, self.program_ns)
    }
    pub(crate) fn erase_fj(&self) -> u128 {
        energy_fj(self.vcc_mv, self.erase_ua, self.erase_ns)
    }

    /// Time and energy of `ops`. Saturates instead of overflowing (a `u64` of fJ holds 18 kJ,
    /// a `u64` of ns 584 years).
    pub(crate) fn cost(&self, ops: &NandOps) -> Cost {
        let sat = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        let n = u128::from;
        let host = n(ops.host_page_reads) * n(self.host_read_ns())
            + n(ops.host_page_programs) * n(self.host_program_ns());
        let merge =
            n(ops.copy_backs) * n(self.copy_back_ns()) + n(ops.block_erases) * n(self.erase_ns);
        let energy = n(ops.host_page_reads) * self.host_read_fj()
            + n(ops.host_page_programs) * self.host_program_fj()
            + n(ops.copy_backs) * self.copy_back_fj()
            + n(ops.block_erases) * self.erase_fj();
        Cost { host_ns: sat(host), merge_ns: sat(merge), energy_fj: sat(energy) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_operation_costs_are_as_documented() {
        // (preset, host read ns, host program ns, copy-back ns, erase ns,
        //  host read fJ, host program fJ, copy-back fJ, erase fJ), by hand from the table in
        // the module docs: e.g. K9F1208 read = 15 us + 512 * 50 ns = 40.6 us at
        // 3.3 V * 10 mA = 33 mW -> 1.3398 uJ.
        let table: [(NandPreset, [u64; 4], [u128; 4]); 2] = [
            (
                NandPreset::K9f1208,
                [40_600, 225_600, 215_000, 2_000_000],
                [1_339_800_000, 7_444_800_000, 7_095_000_000, 66_000_000_000],
            ),
            (
                NandPreset::K9f1g08,
                [76_200, 251_200, 225_000, 2_000_000],
                [3_771_900_000, 12_434_400_000, 11_137_500_000, 99_000_000_000],
            ),
        ];
        for (preset, ns, fj) in table {
            let p = preset.params();
            p.validate().unwrap();
            assert_eq!(
                [p.host_read_ns(), p.host_program_ns(), p.copy_back_ns(), p.erase_ns],
                ns,
                "{preset}"
            );
            assert_eq!([p.host_read_fj(), p.host_program_fj(), p.copy_back_fj(), p.erase_fj()], fj);
        }
    }

    #[test]
    fn cost_sums_every_operation() {
        let p = NandPreset::K9f1g08.params();
        let ops = NandOps {
            host_page_reads: 2,
            host_page_programs: 3,
            copy_backs: 4,
            block_erases: 1,
            ..NandOps::default()
        };
        let c = p.cost(&ops);
        assert_eq!(c.host_ns, 2 * 76_200 + 3 * 251_200);
        assert_eq!(c.merge_ns, 4 * 225_000 + 2_000_000);
        assert_eq!(
            u128::from(c.energy_fj),
            2 * 3_771_900_000 + 3 * 12_434_400_000 + 4 * 11_137_500_000 + 99_000_000_000
        );
    }
}
