//! Trapping stray stores into write-protected region pages (journal mode, docs/design.md
//! section 12).
//!
//! `MmapRegion::protect` maps committed pages `PROT_READ`. A store into such a page that does
//! not come through the `Region` trait (a bug: a wild pointer into the mapping) makes the CPU
//! fault, and the kernel sends SIGSEGV with `si_code = SEGV_ACCERR` and the address. This module
//! installs one process-wide SIGSEGV handler (`sigaction`, `SA_SIGINFO | SA_ONSTACK`) the first
//! time a region is protected; it recognises addresses inside a registered region, counts the
//! trap in that region's `trapped_writes`, and then, by the region's [`TrapPolicy`]:
//!
//! - **Divert** (the default on x86-64 Linux): the faulting page is replaced, for the duration
//!   of one instruction, by a private anonymous copy of itself (`mmap(MAP_FIXED |
//!   MAP_PRIVATE | MAP_ANONYMOUS)`, filled from the committed page); the trap flag (EFLAGS.TF)
//!   is set so that the CPU executes exactly the faulting instruction into the copy and then
//!   raises SIGTRAP; the SIGTRAP handler maps the file page back read-only (`mmap(MAP_FIXED |
//!   MAP_SHARED)` at the same file offset) and clears the flag. The stray bytes go to the
//!   discarded copy: the region file, and every later load, hold the committed bytes. A `rep`
//!   string instruction is stepped iteration by iteration with its copies in place until it
//!   ends (its pages are counted once: one trap per faulting instruction).
//! - **FailStop**: the handler writes one line to stderr, restores the default SIGSEGV action
//!   and returns; the instruction faults again and the process dies by SIGSEGV before the store
//!   happens. Recovery at the next open restores the last group commit.
//!
//! What the diversion does not hide: another thread that loads from that page during the one
//! diverted instruction (microseconds) reads the copy, i.e. it may see the stray bytes then;
//! the file never holds them. A stray store made by the kernel on the process's behalf (a
//! `read(2)` into a wild pointer) fails with EFAULT instead of faulting: not counted here.
//!
//! Exclusion: a diversion changes the mapping of one page, so it must not interleave with
//! `protect` / `unprotect` of the same region (a page unprotected while its copy is mapped
//! would be mapped back read-only). One process-wide owner word serialises them: the diverting
//! thread holds it from its SIGSEGV to its SIGTRAP (one instruction), `protect` / `unprotect`
//! hold it around their `mprotect`. A fault on a thread that holds it for `protect` (a signal
//! handler storing wildly in the middle of an `mprotect` call) cannot wait for itself: that
//! fault is handled fail-stop.
//!
//! Faults that are not ours (another address, or not an access error) go to the handler that
//! was installed before ours (Rust's stack-overflow handler, or the default action); SIGTRAPs
//! that are not a diversion's go to the previous SIGTRAP action likewise.

use std::cell::UnsafeCell;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering};

/// What a trapped stray store does; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TrapPolicy {
    /// The store lands in a discarded copy of its page; the process goes on.
    #[default]
    Divert,
    /// The process stops with SIGSEGV before the store happens.
    FailStop,
}

/// Regions registered at once (each protected `MmapRegion`); more are simply not protected.
const ENTRIES: usize = 16;
/// Pages one diverted instruction may hold copies of at once (a rolling window for longer
/// `rep` stores).
const DIVERT_PAGES: usize = 4;
const PAGE: usize = 4096;
/// `si_code` of a fault on a mapped page without the needed permission.
const SEGV_ACCERR: i32 = 2;
/// EFLAGS.TF: single-step.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const TRAP_FLAG: i64 = 0x100;

/// One registered region. `len` is stored last at registration and cleared first at
/// unregistration, so the handler never uses a half-written entry.
struct Entry {
    used: AtomicBool,
    base: AtomicUsize,
    len: AtomicUsize,
    fd: AtomicI32,
    map_flags: AtomicI32,
    policy: AtomicU8,
    trapped: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    used: AtomicBool::new(false),
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    fd: AtomicI32::new(-1),
    map_flags: AtomicI32::new(0),
    policy: AtomicU8::new(0),
    trapped: AtomicU64::new(0),
};

static REGISTRY: [Entry; ENTRIES] = [EMPTY; ENTRIES];

/// The thread id holding the exclusion (0 = free) and whether it holds it for a diversion.
static OWNER: AtomicI32 = AtomicI32::new(0);
static DIVERTING: AtomicBool = AtomicBool::new(false);
/// The diverted instruction's address and its page copies (valid while `DIVERTING`).
static DIVERT_RIP: AtomicUsize = AtomicUsize::new(0);
static DIVERTED: [AtomicUsize; DIVERT_PAGES] = [const { AtomicUsize::new(0) }; DIVERT_PAGES];
static DIVERTED_ENTRY: [AtomicUsize; DIVERT_PAGES] = [const { AtomicUsize::new(0) }; DIVERT_PAGES];
static DIVERTED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// A page buffer used only by the thread that holds `OWNER` for a diversion.
struct Scratch(UnsafeCell<[u8; PAGE]>);
// SAFETY: only the thread holding the exclusion for a diversion touches it.
unsafe impl Sync for Scratch {}
static SCRATCH: Scratch = Scratch(UnsafeCell::new([0; PAGE]));

/// A saved `sigaction`, written once (under `INSTALL`) before our handler can run.
struct SavedAction(UnsafeCell<std::mem::MaybeUninit<libc::sigaction>>);
// SAFETY: written once inside `INSTALL.call_once`, before the handler that reads it exists.
unsafe impl Sync for SavedAction {}
static OLD_SEGV: SavedAction = SavedAction(UnsafeCell::new(std::mem::MaybeUninit::zeroed()));
static OLD_TRAP: SavedAction = SavedAction(UnsafeCell::new(std::mem::MaybeUninit::zeroed()));
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn policy_code(policy: TrapPolicy) -> u8 {
    match policy {
        TrapPolicy::Divert => 0,
        TrapPolicy::FailStop => 1,
    }
}

/// Registers a mapping so that faults inside it are trapped; installs the handlers the first
/// time. `None` when every entry is taken or the handlers could not be installed.
pub(crate) fn register(
    base: usize,
    len: usize,
    fd: i32,
    map_flags: i32,
    policy: TrapPolicy,
) -> Option<usize> {
    install();
    if !INSTALLED.load(Ordering::Acquire) {
        return None;
    }
    for (i, entry) in REGISTRY.iter().enumerate() {
        if entry.used.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            entry.base.store(base, Ordering::Relaxed);
            entry.fd.store(fd, Ordering::Relaxed);
            entry.map_flags.store(map_flags, Ordering::Relaxed);
            entry.policy.store(policy_code(policy), Ordering::Relaxed);
            entry.trapped.store(0, Ordering::Relaxed);
            entry.len.store(len, Ordering::Release);
            return Some(i);
        }
    }
    None
}

/// Forgets a mapping (before it is unmapped).
pub(crate) fn unregister(index: usize) {
    let entry = &REGISTRY[index];
    let _guard = Exclusion::take();
    entry.len.store(0, Ordering::Release);
    entry.used.store(false, Ordering::Release);
}

/// Stray stores trapped in the mapping registered as `index`.
pub(crate) fn trapped(index: usize) -> u64 {
    REGISTRY[index].trapped.load(Ordering::Relaxed)
}

/// Counts a stray store refused before it faulted (a `Region::write` to a protected page).
pub(crate) fn count(index: usize) {
    REGISTRY[index].trapped.fetch_add(1, Ordering::Relaxed);
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions and is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// The exclusion between diversions and `protect` / `unprotect`, taken from normal context.
pub(crate) struct Exclusion;

impl Exclusion {
    pub(crate) fn take() -> Exclusion {
        let me = gettid();
        assert!(OWNER.load(Ordering::Acquire) != me, "protection exclusion taken twice");
        while OWNER.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed).is_err() {
            // Held for one diverted instruction or one mprotect: short.
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        Exclusion
    }
}

impl Drop for Exclusion {
    fn drop(&mut self) {
        OWNER.store(0, Ordering::Release);
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction with fully initialised structures; the saved actions are written
        // by the kernel into our statics before either handler can run.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&raw mut action.sa_mask);
            action.sa_sigaction = on_trap as *const () as usize;
            if libc::sigaction(libc::SIGTRAP, &raw const action, (*OLD_TRAP.0.get()).as_mut_ptr())
                != 0
            {
                return;
            }
            action.sa_sigaction = on_segv as *const () as usize;
            if libc::sigaction(libc::SIGSEGV, &raw const action, (*OLD_SEGV.0.get()).as_mut_ptr())
                != 0
            {
                return;
            }
        }
        INSTALLED.store(true, Ordering::Release);
    });
}

/// The registered region holding `addr`, if any.
fn find(addr: usize) -> Option<usize> {
    REGISTRY.iter().position(|e| {
        let len = e.len.load(Ordering::Acquire);
        let base = e.base.load(Ordering::Relaxed);
        len != 0 && addr >= base && addr - base < len
    })
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext; everything below uses atomics,
    // raw syscalls and the scratch page guarded by the exclusion (async-signal-safe).
    unsafe {
        let addr = (*info).si_addr() as usize;
        if (*info).si_code == SEGV_ACCERR
            && let Some(index) = find(addr)
        {
            if !divert(index, addr, ctx) {
                fail_stop(index, addr);
            }
            return;
        }
        chain(&OLD_SEGV, sig, info, ctx);
    }
}

extern "C" fn on_trap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as in `on_segv`.
    unsafe {
        if DIVERTING.load(Ordering::Acquire) && OWNER.load(Ordering::Acquire) == gettid() {
            end_diversion(ctx);
            return;
        }
        chain(&OLD_TRAP, sig, info, ctx);
    }
}

/// Starts (or extends) the diversion of the faulting instruction; false = handle fail-stop.
///
/// # Safety
/// Signal context only: `ctx` is the ucontext of the faulting thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn divert(index: usize, addr: usize, ctx: *mut libc::c_void) -> bool {
    let entry = &REGISTRY[index];
    if entry.policy.load(Ordering::Relaxed) != policy_code(TrapPolicy::Divert) {
        entry.trapped.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let me = gettid();
    // SAFETY: the kernel's ucontext for this signal.
    let uc = unsafe { &mut *ctx.cast::<libc::ucontext_t>() };
    #[allow(clippy::cast_sign_loss)] // a register's bits, reinterpreted
    let rip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
    if OWNER.load(Ordering::Acquire) == me {
        if !DIVERTING.load(Ordering::Acquire) {
            // This thread holds the exclusion for protect/unprotect: it cannot wait for itself.
            entry.trapped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // The diverted instruction goes on into another page (same instruction: not counted
        // again).
    } else {
        while OWNER.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        DIVERTING.store(true, Ordering::Release);
        DIVERT_RIP.store(rip, Ordering::Relaxed);
        entry.trapped.fetch_add(1, Ordering::Relaxed);
    }
    if DIVERTED_COUNT.load(Ordering::Relaxed) == DIVERT_PAGES {
        // A long rep store: map the oldest copies back; the instruction refaults on them if it
        // ever returns there (the same instruction: not counted again).
        // SAFETY: we hold the exclusion for a diversion.
        if !unsafe { restore_pages() } {
            return false;
        }
    }
    let page = addr & !(PAGE - 1);
    let scratch = SCRATCH.0.get().cast::<u8>();
    // SAFETY: the page is mapped readable (PROT_READ); the scratch page is ours while we hold
    // the exclusion; the anonymous mapping replaces exactly one page of the registered mapping.
    unsafe {
        std::ptr::copy_nonoverlapping(page as *const u8, scratch, PAGE);
        let copy = libc::mmap(
            page as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if copy as usize != page {
            return false;
        }
        std::ptr::copy_nonoverlapping(scratch, page as *mut u8, PAGE);
    }
    let n = DIVERTED_COUNT.load(Ordering::Relaxed);
    DIVERTED[n].store(page, Ordering::Relaxed);
    DIVERTED_ENTRY[n].store(index, Ordering::Relaxed);
    DIVERTED_COUNT.store(n + 1, Ordering::Relaxed);
    uc.uc_mcontext.gregs[libc::REG_EFL as usize] |= TRAP_FLAG;
    true
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
unsafe fn divert(index: usize, _addr: usize, _ctx: *mut libc::c_void) -> bool {
    REGISTRY[index].trapped.fetch_add(1, Ordering::Relaxed);
    false
}

/// Maps every diverted page back from its file, read-only. False if a mapping failed.
///
/// # Safety
/// Only the thread holding the exclusion for a diversion may call it.
unsafe fn restore_pages() -> bool {
    let n = DIVERTED_COUNT.load(Ordering::Relaxed);
    for i in 0..n {
        let page = DIVERTED[i].load(Ordering::Relaxed);
        let entry = &REGISTRY[DIVERTED_ENTRY[i].load(Ordering::Relaxed)];
        let offset = page - entry.base.load(Ordering::Relaxed);
        // SAFETY: remaps one page of the registered mapping from its own file, at its own
        // offset, with the protection it had when it faulted (read-only: nobody may change it
        // while we hold the exclusion).
        let back = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                PAGE,
                libc::PROT_READ,
                libc::MAP_FIXED | entry.map_flags.load(Ordering::Relaxed),
                entry.fd.load(Ordering::Relaxed),
                #[allow(clippy::cast_possible_wrap)] // inside a mapping: far below 2^63
                {
                    offset as libc::off_t
                },
            )
        };
        if back as usize != page {
            return false;
        }
    }
    DIVERTED_COUNT.store(0, Ordering::Relaxed);
    true
}

/// The single step after a diverted instruction: keep stepping a `rep` store that has not
/// finished, else map the pages back, clear the trap flag and release the exclusion.
///
/// # Safety
/// Signal context of the diverting thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn end_diversion(ctx: *mut libc::c_void) {
    // SAFETY: the kernel's ucontext for this signal.
    let uc = unsafe { &mut *ctx.cast::<libc::ucontext_t>() };
    #[allow(clippy::cast_sign_loss)] // a register's bits, reinterpreted
    let rip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
    if rip == DIVERT_RIP.load(Ordering::Relaxed) {
        return; // a rep iteration: the instruction is not done, TF stays set
    }
    // SAFETY: we hold the exclusion for a diversion.
    if !unsafe { restore_pages() } {
        // The committed view cannot be put back: stop rather than run on a wrong mapping.
        report(b"nvstack: could not map a diverted NVRAM page back; aborting\n");
        // SAFETY: abort is async-signal-safe.
        unsafe { libc::abort() };
    }
    uc.uc_mcontext.gregs[libc::REG_EFL as usize] &= !TRAP_FLAG;
    DIVERTING.store(false, Ordering::Release);
    OWNER.store(0, Ordering::Release);
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
unsafe fn end_diversion(_ctx: *mut libc::c_void) {}

/// Reports the trap and arranges for the process to die by SIGSEGV when the handler returns
/// (the instruction faults again under the default action, before its store happens).
///
/// # Safety
/// Signal context.
unsafe fn fail_stop(index: usize, addr: usize) {
    let base = REGISTRY[index].base.load(Ordering::Relaxed);
    let mut line = [0u8; 160];
    let mut n = 0;
    for part in [
        &b"nvstack: stray store to a write-protected NVRAM page at region offset 0x"[..],
        &hex((addr - base) as u64)[..],
        &b": stopping (fail-stop); the next open recovers the last group commit\n"[..],
    ] {
        let take = part.len().min(line.len() - n);
        line[n..n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    report(&line[..n]);
    // SAFETY: restoring the default action is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
    }
}

/// 16 hex digits, without allocating (signal context).
fn hex(v: u64) -> [u8; 16] {
    let mut out = [b'0'; 16];
    for (i, digit) in out.iter_mut().enumerate() {
        let nibble = (v >> (60 - 4 * i)) & 0xf;
        *digit = b"0123456789abcdef"[nibble as usize];
    }
    out
}

fn report(msg: &[u8]) {
    // SAFETY: write(2) to stderr is async-signal-safe; a short write only shortens the message.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

/// Passes a signal that is not ours to the action installed before ours.
///
/// # Safety
/// Signal context; `saved` was written by `install`.
unsafe fn chain(
    saved: &SavedAction,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    // SAFETY: written once by `install` before this handler was installed.
    let old = unsafe { (*saved.0.get()).assume_init_ref() };
    let handler = old.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: async-signal-safe calls. SIGSEGV refaults under the default action when we
        // return; a SIGTRAP is raised again to get its default action (core dump).
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            if sig != libc::SIGSEGV && handler == libc::SIG_DFL {
                libc::raise(sig);
            }
        }
        return;
    }
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO: this is its signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous handler is a plain `void (*)(int)`.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_sixteen_lowercase_digits() {
        assert_eq!(&hex(0x1234_abcd), b"000000001234abcd");
        assert_eq!(&hex(u64::MAX), b"ffffffffffffffff");
    }
}
