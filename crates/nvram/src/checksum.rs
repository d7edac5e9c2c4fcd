//! The one checksum used for every persistent record: XXH3-64.
//!
//! 64 bits make the chance that a torn or flipped record passes as valid negligible (2^-64 per
//! record read), which matters because recovery trusts every record whose checksum matches.

/// Checksum of `parts`, concatenated.
pub fn checksum(parts: &[&[u8]]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.digest()
}
