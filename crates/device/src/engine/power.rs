//! The power of the modeled drive: a state machine with three states, driven by the requests.
//!
//! - `On`: requests are served; `Engine::write` holds data volatile, `Engine::flush` makes it
//!   durable.
//! - `Armed { .. }` (still on): [`Engine::arm_cut`] set a trigger; after `flushes` more flushes
//!   and then `writes` more writes (or at the next flush, whichever comes first) the engine
//!   cuts itself ([`Engine::armed_flush`], [`Engine::armed_write`], called before a request is
//!   served, make the transition).
//! - `Off` (after [`Engine::cut`]): held writes were torn/dropped; every later write, flush
//!   and discard is discarded (the drive has no power), reads return what the image holds.
//!
//! `Off` is final for this engine: a second cut returns the first report, and arming is
//! refused. The NVRAM cache is not touched by a cut (it is non-volatile); the next engine
//! recovers it.

use std::io;

use serde::Serialize;

use super::Engine;
use crate::cache::{CutMode, CutReport};

/// A pending automatic cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct ArmedCut {
    pub(crate) flushes: u64,
    pub(crate) writes: u64,
    pub(crate) seed: u64,
    pub(crate) mode: CutMode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Power {
    On,
    Armed(ArmedCut),
    Off(CutReport),
}

impl Engine {
    pub(crate) fn is_off(&self) -> bool {
        matches!(self.power, Power::Off(_))
    }

    /// Power failure now. A second cut is a no-op that returns the first report.
    pub fn cut(&mut self, seed: u64, mode: CutMode) -> io::Result<CutReport> {
        if let Power::Off(r) = &self.power {
            return Ok(r.clone());
        }
        let r = self.cache.cut(seed, mode)?;
        self.power = Power::Off(r.clone());
        Ok(r)
    }

    /// Arms an automatic cut (see the module docs). Refused when the power is already off.
    pub(crate) fn arm_cut(&mut self, a: ArmedCut) -> Result<(), &'static str> {
        if self.is_off() {
            return Err("the power is already cut");
        }
        self.power = Power::Armed(a);
        Ok(())
    }

    /// A write arrives: an armed cut whose flushes ran out counts it down, and fires instead
    /// of serving it when its writes ran out too.
    pub(super) fn armed_write(&mut self) -> io::Result<()> {
        if let Power::Armed(a) = &mut self.power {
            if a.flushes == 0 {
                if a.writes == 0 {
                    let (seed, mode) = (a.seed, a.mode);
                    self.cut(seed, mode)?;
                } else {
                    a.writes -= 1;
                }
            }
        }
        Ok(())
    }

    /// A flush arrives: an armed cut counts it down, and fires instead of serving it when its
    /// flushes ran out (whatever writes it still waited for).
    pub(super) fn armed_flush(&mut self) -> io::Result<()> {
        if let Power::Armed(a) = &mut self.power {
            if a.flushes == 0 {
                let (seed, mode) = (a.seed, a.mode);
                self.cut(seed, mode)?;
            } else {
                a.flushes -= 1;
            }
        }
        Ok(())
    }
}
