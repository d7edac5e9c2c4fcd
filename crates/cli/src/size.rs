//! Human sizes: parsing (one parser for every subcommand, defined by the device layer that the
//! CLI sits on) and rendering for messages.

pub use device::cli::parse_size;

/// `1.5 MiB`-style rendering for messages.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        let table = [
            ("4096", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("256M", 256 << 20),
            ("256MiB", 256 << 20),
            ("256MB", 256 << 20),
            ("1G", 1 << 30),
            ("2T", 2 << 40),
        ];
        for (text, bytes) in table {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for bad in ["", "M", "12Q", "-1", "1.5G", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn human_sizes_read_well() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(256 << 20), "256.0 MiB");
    }
}
