//! `txn-wild PATH SEED WILD divert|fail-stop|null|int3|overflow`: plays a buggy component
//! storing through wild pointers into a journal-mode region (the test `wild_writes.rs` runs it
//! as a child process and checks the region file). Not installed; a test helper only.
//!
//! It opens the region file at PATH in journal mode, runs the seeded workload (30 transactions,
//! a group commit, 3 more: a running group), then:
//! - `divert` / `fail-stop`: makes WILD stray stores into seeded write-protected pages of the
//!   mapping, each one x86-64 store instruction chosen among byte, aligned and page-crossing
//!   quadword, 16-byte vector, and `rep stosb` stores, bypassing `Region`. It prints
//!   `trapped=T wild=W changed=C` (C = bytes of the region file that differ from before), then
//!   runs 5 more transactions, commits the group and closes the pool. Under fail-stop the
//!   first store ends the process (SIGSEGV).
//! - `null` / `int3` / `overflow`: a fault that is not ours (a store to address 16, a
//!   breakpoint, a stack overflow) after the handlers are installed: it must end the process
//!   as it would have without them.

use std::io::Write;
use std::sync::Arc;

use nvram::layout::PAGE_SIZE;
use nvram::{MmapOptions, MmapRegion, Region, TrapPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use txn::testkit::{Workload, WorkloadConfig};
use txn::{Consistency, Pool};

/// One stray store instruction of kind `kind` at `at` (see the module docs).
#[cfg(target_arch = "x86_64")]
fn stray_store(kind: u32, at: *mut u8) {
    // SAFETY: none - this is the bug being simulated: a store through a pointer into the
    // region's mapping that no transaction made writable. The trap handler keeps it from the
    // committed bytes (or stops the process).
    unsafe {
        match kind {
            0 => std::arch::asm!("mov byte ptr [{p}], 0x5a", p = in(reg) at),
            1 | 2 => std::arch::asm!(
                "mov qword ptr [{p}], {v}", p = in(reg) at, v = in(reg) 0xdead_beef_u64
            ),
            3 => std::arch::asm!(
                "pcmpeqb xmm0, xmm0", "movdqu xmmword ptr [{p}], xmm0",
                p = in(reg) at, out("xmm0") _
            ),
            _ => std::arch::asm!(
                "rep stosb", inout("rdi") at => _, inout("rcx") 64usize => _, in("al") 0xa5u8
            ),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn stray_store(_kind: u32, at: *mut u8) {
    // SAFETY: as above.
    unsafe { at.write_volatile(0x5a) };
}

#[allow(unconditional_recursion)]
fn overflow(depth: u64) -> u64 {
    let pad = std::hint::black_box([depth; 64]);
    overflow(pad[0] + 1) + pad[1]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() == 5, "usage: txn-wild PATH SEED WILD divert|fail-stop|null|int3|overflow");
    let path = std::path::Path::new(&args[1]);
    let seed: u64 = args[2].parse().expect("SEED is a number");
    let wild: u64 = args[3].parse().expect("WILD is a number");
    let what = args[4].as_str();
    let trap = if what == "fail-stop" { TrapPolicy::FailStop } else { TrapPolicy::Divert };
    let mapping = Arc::new(
        MmapRegion::open(path, MmapOptions { trap, ..MmapOptions::default() }).expect("open"),
    );
    let region: Arc<dyn Region> = mapping.clone();
    let (pool, _) = Pool::open(region.clone(), Consistency::Journal).expect("recover");
    assert!(pool.stats().journal.protection, "the mapping cannot be protected");
    let mut workload = Workload::new(seed, WorkloadConfig::default());
    for _ in 0..30 {
        workload.step(&pool);
    }
    pool.group_commit();
    for _ in 0..3 {
        workload.step(&pool);
    }
    match what {
        // SAFETY: none - each of these is a fault that is not a stray store to the region.
        "null" => unsafe { (16 as *mut u64).write_volatile(1) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        "int3" => unsafe { std::arch::asm!("int3") },
        "overflow" => println!("{}", overflow(0)),
        _ => {}
    }
    let protected: Vec<u64> = (0..mapping.len() / PAGE_SIZE - 1)
        .map(|p| p * PAGE_SIZE)
        .filter(|&p| mapping.is_protected(p) && mapping.is_protected(p + PAGE_SIZE))
        .collect();
    let before = std::fs::read(path).expect("read the region file");
    let trapped_before = region.counters().trapped_writes;
    println!("ready protected_pages={}", protected.len());
    std::io::stdout().flush().expect("stdout");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let base = mapping.base_ptr().cast_mut();
    for _ in 0..wild {
        let page = protected[rng.random_range(0..protected.len())];
        let kind = rng.random_range(0..5u32);
        let at = match kind {
            // Across the end of the page into the next (also protected) one.
            2 => page + PAGE_SIZE - rng.random_range(1..8),
            3 => page + rng.random_range(0..=PAGE_SIZE - 16),
            4 => page + rng.random_range(0..=PAGE_SIZE - 64),
            _ => page + rng.random_range(0..PAGE_SIZE / 8) * 8,
        };
        // SAFETY: inside the mapping (the address arithmetic only).
        stray_store(kind, unsafe { base.add(at as usize) });
    }
    let after = std::fs::read(path).expect("read the region file");
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    let view_changed = (0..mapping.len() / PAGE_SIZE)
        .map(|p| p * PAGE_SIZE)
        .filter(|&p| {
            let n = PAGE_SIZE as usize;
            mapping.read_vec(p, n) != after[p as usize..p as usize + n]
        })
        .count();
    println!(
        "trapped={} wild={wild} changed={changed} view_changed={view_changed}",
        region.counters().trapped_writes - trapped_before
    );
    for _ in 0..5 {
        workload.step(&pool);
    }
    pool.check_invariants().expect("invariants after the stray stores");
    pool.close();
    println!("closed");
}
