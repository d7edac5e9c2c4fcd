//! `nvstack device`: the block layer for evaluation.
//!
//! An image file is served through FUSE as a single file (`disk.img`); a loop device on that
//! file carries a real kernel file system (ext2, ext4, vfat). Every request the loop device
//! sends passes through:
//!
//! 1. [`model`] — the modeled drive (HDD seek curve + rotation + transfer, SSD, none) behind one
//!    FIFO actuator with a modeled clock;
//! 2. [`cache`] — the drive's volatile write cache: writes are held until a flush (the loop
//!    device's FUSE fsync), and a power cut drops or tears them;
//! 3. `trace` — an optional per-request trace and a per-LBN write histogram.
//!
//! [`engine`] ties these together without FUSE; `serve` is the FUSE front end; [`attach`]
//! orchestrates losetup/mkfs/mount; `userfat` serves a FAT volume on the device in user space
//! where the kernel has no vfat (the NVFAT experiment); [`cli`] is the `nvstack device` command
//! line. See
//! `docs/device.md` for the formulas, presets and power-cut semantics.

pub mod attach;
pub mod cache;
pub mod classify;
pub mod cli;
pub mod engine;
mod error;
pub mod model;
pub mod nvcache;
mod serve;
mod trace;
mod userfat;

pub use cli::{DeviceCommand, run};
pub use error::DeviceError;
