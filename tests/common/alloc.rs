//! A counting global allocator for the test binaries that bound heap use
//! (`fuzz`, `memory_guard`, `trace_memory`): the system allocator, keeping
//! the bytes live now and their peak.
//!
//! Include it with `#[path = "common/alloc.rs"] mod alloc;`: it installs
//! itself as the binary's `#[global_allocator]`, so it belongs in a test
//! binary of its own, whose allocations are only its tests'. To measure the
//! heap some code needs, reset the peak to the live count, run the code,
//! and take the new peak less that start:
//!
//! ```ignore
//! let base = LIVE.load(Relaxed);
//! PEAK.store(base, Relaxed);
//! work();
//! let peak = PEAK.load(Relaxed) - base;
//! ```
//!
//! The counters are process-wide: a measurement sees every thread's
//! allocations, so tests that measure run one at a time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The system allocator, counting live bytes and their peak.
pub struct Counting;

/// Bytes allocated and not yet freed.
pub static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The highest [`LIVE`] has been since it was last reset (by storing into it).
pub static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;
