//! One libFuzzer binary for every target in `voxide::fuzz`; `VOXIDE_FUZZ_TARGET` names the one
//! it runs. A single allocation over 64 MB aborts, so libFuzzer reports the input that asked
//! for it.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

/// The most one allocation may take.
const MAX_ALLOCATION: usize = 64 << 20;

struct Capped;

// SAFETY: every call is forwarded to the system allocator unchanged, after the size check.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        // SAFETY: as for `alloc`; `ptr` came from this allocator, which is `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn check(size: usize) {
    if size > MAX_ALLOCATION {
        // No allocation here: write the message with the raw syscall-backed stderr.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "one allocation of {size} bytes (over 64 MB)"
        );
        std::process::abort();
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;

static TARGET: OnceLock<voxide::fuzz::Target> = OnceLock::new();

fn target() -> voxide::fuzz::Target {
    *TARGET.get_or_init(|| {
        let name = std::env::var("VOXIDE_FUZZ_TARGET").unwrap_or_default();
        voxide::fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = voxide::fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
            eprintln!(
                "VOXIDE_FUZZ_TARGET={name:?} is not a target; the targets: {}",
                names.join(", ")
            );
            std::process::exit(2);
        })
    })
}

fuzz_target!(|data: &[u8]| {
    target()(data);
});
