//! The guest's Rust allocations share QuickJS's size-class allocator
//! (`guest/patches/rquickjs-sys-0.12.2-size-class-allocator.patch`) instead of going to
//! wasi-libc's dlmalloc: a call's JSON text, its WIT lists and strings are small, short-lived
//! blocks like QuickJS's own. Blocks are 8-byte aligned; the rare layout that needs more goes
//! to the C library's allocator, and is freed there because its layout says so again.

use std::alloc::{GlobalAlloc, Layout, System};

unsafe extern "C" {
    fn JS_CorralMalloc(size: usize) -> *mut u8;
    fn JS_CorralFree(ptr: *mut u8);
    fn JS_CorralRealloc(ptr: *mut u8, size: usize) -> *mut u8;
    /// Leaves the blocks freed so far unused, so that a session's blocks are carved from fresh
    /// pages instead of copies of the snapshot's.
    fn JS_CorralForgetFreeBlocks();
}

/// The alignment every block of the size-class allocator has.
const BLOCK_ALIGN: usize = 8;

struct SizeClasses;

// SAFETY: the C functions return blocks of at least the size asked, aligned to `BLOCK_ALIGN`, or
// null; each block is freed or reallocated only through the allocator that made it, chosen by
// the same test on its layout's alignment. Wasm is single-threaded, so the allocator's globals
// are never raced.
unsafe impl GlobalAlloc for SizeClasses {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            // SAFETY: any size may be asked.
            unsafe { JS_CorralMalloc(layout.size()) }
        } else {
            // SAFETY: forwarded as it came.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.align() <= BLOCK_ALIGN {
            // SAFETY: `ptr` came from `JS_CorralMalloc` or `JS_CorralRealloc` (same alignment test).
            unsafe { JS_CorralFree(ptr) }
        } else {
            // SAFETY: `ptr` came from `System` with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= BLOCK_ALIGN {
            // SAFETY: as in `dealloc`; on failure the old block is left as it was.
            unsafe { JS_CorralRealloc(ptr, new_size) }
        } else {
            // SAFETY: forwarded as it came.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

#[global_allocator]
static ALLOCATOR: SizeClasses = SizeClasses;

/// Sets aside the blocks freed while the snapshot was built (see `JS_CorralForgetFreeBlocks`).
pub(crate) fn forget_free_blocks() {
    // SAFETY: touches only the allocator's free lists, between allocations.
    unsafe { JS_CorralForgetFreeBlocks() }
}
