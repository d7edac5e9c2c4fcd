//! A limit that depends on the region: a share of a whole counted in frames (4 KiB pages), as
//! the mount's percentages say (`--dirty-high`, `--tempfile-share`, ...), or a fixed number of
//! frames (tests, small fixed caches).
//!
//! The configurations hold shares, not frame counts, because their defaults cannot know the
//! region: `Engine::new` resolves each against the region's frames once, with
//! [`Share::of`], into the limits the engine runs with (`CacheLimits`, `TempLimits`), which
//! `nvstack stat --json` shows.

/// See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// This percent of the whole (0 to 100).
    Percent(u64),
    /// This many frames, whatever the whole.
    Frames(u64),
}

impl Share {
    /// The frames this share is of `whole` frames: `whole x percent / 100`, rounded down.
    pub fn of(self, whole: u64) -> u64 {
        match self {
            Share::Percent(p) => {
                assert!(p <= 100, "a share of {p} percent");
                whole * p / 100
            }
            Share::Frames(n) => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Share;

    #[test]
    fn a_percentage_rounds_down_and_frames_ignore_the_whole() {
        assert_eq!(Share::Percent(80).of(1000), 800);
        assert_eq!(Share::Percent(60).of(7), 4, "4.2 frames: 4");
        assert_eq!(Share::Percent(100).of(7), 7);
        assert_eq!(Share::Percent(0).of(7), 0);
        assert_eq!(Share::Frames(12).of(7), 12);
    }
}
