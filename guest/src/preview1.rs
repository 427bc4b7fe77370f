//! The guest's own stand-ins for the few `wasi_snapshot_preview1` functions that Rust's standard
//! library and wasi-libc import (the clock, randomness, the environment, stdio and exit).
//!
//! The component must import `corral:sandbox/host` and nothing else, so no WASI adapter is used:
//! `host/guest-build` links each `wasi_snapshot_preview1` import of the core module to the
//! function this module exports as `corral-preview1-stand-in#<name>` (and removes that export),
//! failing the build when an import has no stand-in here. What the guest gets through them is
//! decided by the session config alone:
//!
//! - clocks read `session-config.clock`: a frozen instant, or `host.now-ms` when the host
//!   granted its clock (every clock id, monotonic included, follows the wall clock, so a frozen
//!   clock freezes them all);
//! - randomness (hash-map keys in the standard library) is a stream derived from
//!   `session-config.random-seed`;
//! - the environment is empty, stdin is closed, and what the C library writes to stdout or
//!   stderr is discarded;
//! - `proc_exit` (only reached through `abort`) traps.
#![allow(unsafe_code)]

use crate::{now_ms, with_session};

/// `errno` values of WASI preview1.
const SUCCESS: i32 = 0;
const BADF: i32 = 8;

/// `ciovec` of WASI preview1: a buffer the C library writes from.
#[repr(C)]
struct Ciovec {
    buf: *const u8,
    len: usize,
}

#[unsafe(export_name = "corral-preview1-stand-in#clock_time_get")]
unsafe extern "C" fn clock_time_get(_clock_id: i32, _precision: i64, time: *mut u64) -> i32 {
    let nanos = now_ms().saturating_mul(1_000_000);
    // SAFETY: the C library passes a pointer to a `u64` it owns.
    unsafe { time.write_unaligned(nanos) };
    SUCCESS
}

#[unsafe(export_name = "corral-preview1-stand-in#random_get")]
unsafe extern "C" fn random_get(buf: *mut u8, len: usize) -> i32 {
    for i in 0..len {
        let byte = with_session(|session| {
            if session.entropy_used == 0 {
                session.entropy_state = splitmix(&mut session.entropy_seed);
            }
            let byte = (session.entropy_state >> (8 * session.entropy_used)) as u8;
            session.entropy_used = (session.entropy_used + 1) % 8;
            byte
        });
        // SAFETY: the caller passes a buffer of `len` bytes.
        unsafe { buf.add(i).write(byte) };
    }
    SUCCESS
}

/// splitmix64: turns the seed into the random stream.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut x = *state;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[unsafe(export_name = "corral-preview1-stand-in#environ_sizes_get")]
unsafe extern "C" fn environ_sizes_get(count: *mut usize, size: *mut usize) -> i32 {
    // SAFETY: the C library passes pointers to two `size_t`s it owns.
    unsafe {
        count.write_unaligned(0);
        size.write_unaligned(0);
    }
    SUCCESS
}

#[unsafe(export_name = "corral-preview1-stand-in#environ_get")]
unsafe extern "C" fn environ_get(_environ: *mut *mut u8, _buf: *mut u8) -> i32 {
    // The environment is empty: nothing to write.
    SUCCESS
}

#[unsafe(export_name = "corral-preview1-stand-in#fd_write")]
unsafe extern "C" fn fd_write(
    fd: i32,
    iovs: *const Ciovec,
    iovs_len: usize,
    written: *mut usize,
) -> i32 {
    if fd != 1 && fd != 2 {
        return BADF;
    }
    // Discarded, but reported as written so the C library does not retry.
    let mut total = 0usize;
    for i in 0..iovs_len {
        // SAFETY: the C library passes `iovs_len` valid `ciovec`s.
        total = total.saturating_add(unsafe { iovs.add(i).read_unaligned() }.len);
    }
    // SAFETY: the C library passes a pointer to a `size_t` it owns.
    unsafe { written.write_unaligned(total) };
    SUCCESS
}

#[unsafe(export_name = "corral-preview1-stand-in#fd_read")]
unsafe extern "C" fn fd_read(
    _fd: i32,
    _iovs: *const Ciovec,
    _len: usize,
    _read: *mut usize,
) -> i32 {
    BADF
}

#[unsafe(export_name = "corral-preview1-stand-in#fd_close")]
unsafe extern "C" fn fd_close(_fd: i32) -> i32 {
    BADF
}

#[unsafe(export_name = "corral-preview1-stand-in#fd_seek")]
unsafe extern "C" fn fd_seek(_fd: i32, _offset: i64, _whence: i32, _new_offset: *mut u64) -> i32 {
    BADF
}

#[unsafe(export_name = "corral-preview1-stand-in#fd_fdstat_get")]
unsafe extern "C" fn fd_fdstat_get(_fd: i32, _stat: *mut u8) -> i32 {
    BADF
}

#[unsafe(export_name = "corral-preview1-stand-in#proc_exit")]
unsafe extern "C" fn proc_exit(_code: i32) -> ! {
    core::arch::wasm32::unreachable()
}
