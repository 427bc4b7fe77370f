//! Sessions map only the snapshot pages they read, not their neighbours (Linux 6.7 and later).
//!
//! A session's linear memory starts as a copy-on-write mapping of the guest's snapshot image:
//! the compiled guest file, or a memfd when the guest was compiled in memory. On a read fault
//! in such a file-backed mapping, Linux maps up to 16 neighbouring pages that are in the page
//! cache along with the one read ("fault-around", `fault_around_bytes`). Those pages are
//! shared with every other session, but each is counted in the RSS of every mapping of it: it
//! made 276 of the 365 KiB of RSS one more live session added, against 89 KiB of pages the
//! session wrote. The kernel skips fault-around in a mapping registered with userfaultfd for
//! write-protect tracking (`uffd_disable_fault_around` in `mm/memory.c`), so each slot's image
//! mapping is registered that way, in asynchronous mode (`UFFD_FEATURE_WP_ASYNC`, the only mode
//! that accepts mappings of regular files) and with no page ever write-protected: no fault is
//! ever delivered to the process, every fault is handled as before, only without neighbours.
//! The guest sees the same memory; what changes is how many shared pages a session maps.
//!
//! Wasmtime maps the image into a pool slot when the slot is first used, and maps it again only
//! if a memory of another module used the slot in between; a registration lasts as long as the
//! mapping. Slot addresses are not visible through wasmtime's API, so after an instantiation
//! that may have used a slot no session used before (the pool's count of slots in use or warm
//! grew), [`ImageMappings::register_new`] looks for image mappings it has not registered yet.
//! Wasmtime hands out unused slots in address order, so it first asks the kernel
//! (`PROCMAP_QUERY`, Linux 6.11) for the mapping just after the last image registered: about
//! 3 µs. When that finds too few, it walks every private writable file mapping of the process
//! (about 0.5 µs each), or reads `/proc/self/maps` where `PROCMAP_QUERY` is missing. A session
//! in a warm slot pays nothing; one in a new slot (with up to 100 sessions alive) measured 89
//! to 107 µs over four whole benchmark runs, against 86 to 121 µs with fault-around. Where userfaultfd is missing or refused (before Linux 6.7, or under a
//! seccomp filter), nothing is registered and sessions map pages as before: the cost is RSS,
//! never correctness.
//!
//! With the on-demand allocator (`SandboxConfig::pool` off) each session maps its memory anew,
//! so registering would mean reading `/proc/self/maps` for every session; it is not done.
#![allow(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use linux_raw_sys::general::{
    procmap_query,
    procmap_query_flags::{
        PROCMAP_QUERY_COVERING_OR_NEXT_VMA, PROCMAP_QUERY_FILE_BACKED_VMA,
        PROCMAP_QUERY_VMA_READABLE, PROCMAP_QUERY_VMA_SHARED, PROCMAP_QUERY_VMA_WRITABLE,
    },
};
use wasmtime::Engine;

/// The process's userfaultfd context, shared by every sandbox: `None` where the kernel refuses
/// one with asynchronous write-protect tracking.
fn userfaultfd() -> Option<&'static OwnedFd> {
    static CONTEXT: OnceLock<Option<OwnedFd>> = OnceLock::new();
    CONTEXT.get_or_init(open_userfaultfd).as_ref()
}

fn open_userfaultfd() -> Option<OwnedFd> {
    use linux_raw_sys::general::{
        UFFD_API, UFFD_FEATURE_WP_ASYNC, UFFD_USER_MODE_ONLY, uffdio_api,
    };
    use rustix::mm::UserfaultfdFlags;
    // User-mode faults only: that is all there is to see here, and an unprivileged process may
    // not ask for more (`vm.unprivileged_userfaultfd` defaults to 0).
    let flags = UserfaultfdFlags::CLOEXEC
        | UserfaultfdFlags::NONBLOCK
        | UserfaultfdFlags::from_bits_retain(UFFD_USER_MODE_ONLY);
    // SAFETY: creating the descriptor has no effect on memory; only the registrations below
    // do, and they never write-protect a page, so no fault is ever held for this descriptor.
    let fd = unsafe { rustix::mm::userfaultfd(flags) }.ok()?;
    let mut api = uffdio_api {
        api: UFFD_API.into(),
        features: UFFD_FEATURE_WP_ASYNC.into(),
        ioctls: 0,
    };
    // SAFETY: `UFFDIO_API` reads and writes exactly one `uffdio_api`, which `api` is.
    let handshake = unsafe {
        rustix::ioctl::ioctl(
            &fd,
            rustix::ioctl::Updater::<{ linux_raw_sys::ioctl::UFFDIO_API as _ }, uffdio_api>::new(
                &mut api,
            ),
        )
    };
    handshake.ok()?;
    Some(fd)
}

/// Registers `[start, end)` for write-protect tracking, which turns fault-around off there.
fn register(fd: &OwnedFd, start: u64, end: u64) -> bool {
    use linux_raw_sys::general::{UFFDIO_REGISTER_MODE_WP, uffdio_range, uffdio_register};
    let mut registration = uffdio_register {
        range: uffdio_range {
            start,
            len: end - start,
        },
        mode: UFFDIO_REGISTER_MODE_WP.into(),
        ioctls: 0,
    };
    // SAFETY: `UFFDIO_REGISTER` reads and writes exactly one `uffdio_register`. Registering
    // changes no page's contents or protection: with no page write-protected, faults in the
    // range are handled by the kernel as before (the descriptor has asynchronous tracking).
    let registered = unsafe {
        rustix::ioctl::ioctl(
            fd,
            rustix::ioctl::Updater::<
                { linux_raw_sys::ioctl::UFFDIO_REGISTER as _ },
                uffdio_register,
            >::new(&mut registration),
        )
    };
    registered.is_ok()
}

/// One sandbox's record of the image mappings it registered.
#[derive(Debug, Default)]
pub(crate) struct ImageMappings {
    /// Instantiations under way, whose slots may be counted by the pool but not mapped yet.
    instantiating: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Pool slots (in use or warm) known to have their image mapping registered.
    slots_registered: usize,
    /// Address ranges registered, so a later scan skips them.
    registered: HashSet<(u64, u64)>,
    /// `/proc/self/maps`, kept open to query mappings one at a time (`PROCMAP_QUERY`).
    maps: Option<std::fs::File>,
    /// Where each run of registered images ends (see [`State::extend_runs`]).
    run_ends: Vec<u64>,
    /// Set when the kernel has no `PROCMAP_QUERY` (before Linux 6.11): scans read the text.
    text_only: bool,
    /// Whether a file (device major, minor, inode) is a memory image, as its name said.
    image_files: HashMap<(u32, u32, u64), bool>,
}

/// Held across one instantiation; see [`ImageMappings::instantiating`].
#[derive(Debug)]
pub(crate) struct Instantiating<'a> {
    mappings: &'a ImageMappings,
}

impl Drop for Instantiating<'_> {
    fn drop(&mut self) {
        self.mappings.instantiating.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ImageMappings {
    /// Call before instantiating a session; keep the guard until [`ImageMappings::register_new`].
    pub(crate) fn instantiating(&self) -> Instantiating<'_> {
        self.instantiating.fetch_add(1, Ordering::AcqRel);
        Instantiating { mappings: self }
    }

    /// Call after a session was instantiated in the pool and before the guest runs: registers
    /// the image mappings of slots used for the first time.
    pub(crate) fn register_new(&self, engine: &Engine, instantiated: Instantiating<'_>) {
        let Some(fd) = userfaultfd() else {
            return;
        };
        let Some(metrics) = engine.pooling_allocator_metrics() else {
            return;
        };
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let slots = metrics.memories() + metrics.unused_warm_memories() as usize;
        let others = self.instantiating.load(Ordering::Acquire).saturating_sub(1);
        drop(instantiated);
        if slots <= state.slots_registered {
            // No slot was used for the first time. (Fewer slots are counted while a finished
            // session's slot waits in wasmtime's decommit queue; counting down lets the scan
            // run again when the count grows back, which finds nothing new and costs a walk.)
            state.slots_registered = slots;
            return;
        }
        let needed = slots - state.slots_registered;
        state.scan(fd, needed);
        // The slots of instantiations still under way may be counted but not mapped yet: they
        // are left for their own instantiation to find.
        state.slots_registered = slots.saturating_sub(others);
    }
}

impl State {
    /// Registers image mappings not registered yet, at least `needed` of them if there are as
    /// many.
    fn scan(&mut self, uffd: &OwnedFd, needed: usize) {
        if self.maps.is_none() {
            self.maps = std::fs::File::open("/proc/self/maps").ok();
        }
        if !self.text_only && self.extend_runs(uffd) >= needed {
            return;
        }
        let mut found = Vec::new();
        if self.text_only || !self.query_mappings(&mut found) {
            self.text_only = true;
            found.clear();
            read_mappings(&mut found);
        }
        // The end of each run of images (the last image before a mapping of another file, or
        // the last of all): where the pool's next slots are.
        self.run_ends = found
            .iter()
            .enumerate()
            .filter(|&(i, &(_, is_image))| is_image && found.get(i + 1).is_none_or(|next| !next.1))
            .map(|(_, &((_, end), _))| end)
            .collect();
        let images: HashSet<(u64, u64)> = found
            .into_iter()
            .filter_map(|(range, is_image)| is_image.then_some(range))
            .collect();
        for &range in &images {
            if !self.registered.contains(&range) && register(uffd, range.0, range.1) {
                self.registered.insert(range);
            }
        }
        // Forget ranges that are gone, so a mapping made again at the same address is
        // registered again.
        self.registered.retain(|range| images.contains(range));
    }

    /// The quick path: wasmtime hands out a pool's unused slots in address order, so a slot
    /// used for the first time is usually the mapping right after the end of a run of images
    /// already registered. Asks the kernel for the mapping after each run's end, and
    /// registers it if it is an image, as long as there are new images there. Returns how
    /// many it registered.
    fn extend_runs(&mut self, uffd: &OwnedFd) -> usize {
        let Some(maps) = &self.maps else {
            return 0;
        };
        let mut registered = 0;
        for end in &mut self.run_ends {
            while let Some(next) = query_mapping(maps, *end, None) {
                let range = (next.vma_start, next.vma_end);
                if is_shared(&next)
                    || self.image_files.get(&file_of(&next)) != Some(&true)
                    || self.registered.contains(&range)
                    || !register(uffd, range.0, range.1)
                {
                    break;
                }
                self.registered.insert(range);
                registered += 1;
                *end = range.1;
            }
        }
        registered
    }

    /// Lists the process's private writable file mappings in address order, each with whether
    /// it is an image, with `PROCMAP_QUERY`: the kernel walks to each in turn, about 0.5 µs
    /// apiece, where reading `/proc/self/maps` as text costs about 2 µs per mapping of any
    /// kind (with 100 sessions alive, 30 against 190 µs). A file's name is asked for only the
    /// first time it is seen. False if the kernel has no `PROCMAP_QUERY` (before Linux 6.11).
    fn query_mappings(&mut self, found: &mut Vec<((u64, u64), bool)>) -> bool {
        let Some(maps) = &self.maps else {
            return false;
        };
        let mut address = 0;
        let mut answered = false;
        while let Some(mapping) = query_mapping(maps, address, None) {
            answered = true;
            address = mapping.vma_end;
            if is_shared(&mapping) {
                continue;
            }
            let file = file_of(&mapping);
            let is_image = match self.image_files.get(&file) {
                Some(&is_image) => is_image,
                None => {
                    let mut name = [0u8; 4096];
                    let Some(named) = query_mapping(maps, mapping.vma_start, Some(&mut name))
                    else {
                        continue;
                    };
                    let length = (named.vma_name_size as usize).saturating_sub(1);
                    let is_image = std::str::from_utf8(&name[..length.min(name.len())])
                        .is_ok_and(is_image_path);
                    self.image_files.insert(file, is_image);
                    is_image
                }
            };
            found.push(((mapping.vma_start, mapping.vma_end), is_image));
        }
        // No answer at all means no `PROCMAP_QUERY`: a process always has writable file
        // mappings (its own data segment).
        answered
    }
}

/// Whether a mapping is shared (`MAP_SHARED`): never a copy-on-write memory image.
fn is_shared(mapping: &procmap_query) -> bool {
    mapping.vma_flags & u64::from(PROCMAP_QUERY_VMA_SHARED as u32) != 0
}

/// The file a mapping maps: (device major, minor, inode).
fn file_of(mapping: &procmap_query) -> (u32, u32, u64) {
    (mapping.dev_major, mapping.dev_minor, mapping.inode)
}

/// The writable, readable, file-backed mapping at or after `address`, with its file's name in
/// `name` when given.
fn query_mapping(
    maps: &std::fs::File,
    address: u64,
    name: Option<&mut [u8; 4096]>,
) -> Option<procmap_query> {
    let flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA as u32
        | PROCMAP_QUERY_FILE_BACKED_VMA as u32
        | PROCMAP_QUERY_VMA_READABLE as u32
        | PROCMAP_QUERY_VMA_WRITABLE as u32;
    let (name_size, name_address) = match name {
        Some(name) => (name.len() as u32, name.as_mut_ptr() as u64),
        None => (0, 0),
    };
    let mut query = procmap_query {
        size: std::mem::size_of::<procmap_query>() as u64,
        query_flags: flags.into(),
        query_addr: address,
        vma_start: 0,
        vma_end: 0,
        vma_flags: 0,
        vma_page_size: 0,
        vma_offset: 0,
        inode: 0,
        dev_major: 0,
        dev_minor: 0,
        vma_name_size: name_size,
        build_id_size: 0,
        vma_name_addr: name_address,
        build_id_addr: 0,
    };
    const PROCMAP_QUERY: rustix::ioctl::Opcode =
        rustix::ioctl::opcode::read_write::<procmap_query>(b'f', 17);
    // SAFETY: `PROCMAP_QUERY` reads and writes exactly one `procmap_query`, and writes at most
    // `vma_name_size` bytes at `vma_name_addr`, which is `name` (borrowed mutably until the
    // call returns) or nothing.
    unsafe {
        rustix::ioctl::ioctl(
            maps,
            rustix::ioctl::Updater::<PROCMAP_QUERY, procmap_query>::new(&mut query),
        )
    }
    .ok()?;
    Some(query)
}

/// Lists the image mappings in `/proc/self/maps` as text (kernels before 6.11), in address
/// order, marked as images.
fn read_mappings(found: &mut Vec<((u64, u64), bool)>) {
    let Ok(maps) = std::fs::read("/proc/self/maps") else {
        return;
    };
    found.extend(
        maps.split(|&b| b == b'\n')
            .filter_map(image_mapping)
            .map(|range| (range, true)),
    );
}

/// The address range of a `/proc/self/maps` line that is a wasm memory image mapped
/// copy-on-write: readable and writable, private, backed by a compiled module file (`.cwasm`)
/// or by wasmtime's memfd.
fn image_mapping(line: &[u8]) -> Option<(u64, u64)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split_ascii_whitespace();
    let range = fields.next()?;
    if fields.next()? != "rw-p" {
        return None;
    }
    // The range, permissions, offset, device and inode hold no '/'; the path (which may hold
    // spaces) is the rest of the line.
    let path = line[line.find('/')?..].trim_end();
    if !is_image_path(path) {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    (start < end).then_some((start, end))
}

/// Whether a mapped file is a wasm memory image: a compiled module (`.cwasm`, mapped from the
/// cache) or wasmtime's memfd (a module compiled in memory).
fn is_image_path(path: &str) -> bool {
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    path.ends_with(".cwasm") || path == "/memfd:wasm-memory-image"
}

/// Whether this process can register image mappings (for tests and reports).
pub fn available() -> bool {
    userfaultfd().is_some()
}

#[cfg(test)]
mod tests {
    use super::image_mapping;

    #[test]
    fn only_private_writable_image_mappings_are_taken() {
        let memfd = b"7f0000000000-7f0000100000 rw-p 00000000 00:01 2049  /memfd:wasm-memory-image (deleted)";
        assert_eq!(
            image_mapping(memfd),
            Some((0x7f00_0000_0000, 0x7f00_0010_0000))
        );
        let file = b"7f0000200000-7f0000300000 rw-p 00400000 fd:01 77 /home/a user/.cache/corral/guest-1.cwasm";
        assert_eq!(
            image_mapping(file),
            Some((0x7f00_0020_0000, 0x7f00_0030_0000))
        );
        // The module's code, read-only data, other files and anonymous memory are left alone.
        let code =
            b"7f0000200000-7f0000300000 r-xp 00400000 fd:01 77 /home/u/.cache/corral/guest-1.cwasm";
        let shared = b"7f0000200000-7f0000300000 rw-s 00000000 00:01 2049 /memfd:wasm-memory-image";
        let other = b"7f0000200000-7f0000300000 rw-p 00000000 fd:01 78 /usr/lib/libc.so.6";
        let anonymous = b"7f0000200000-7f0000300000 rw-p 00000000 00:00 0";
        for line in [&code[..], shared, other, anonymous, b""] {
            assert_eq!(image_mapping(line), None);
        }
    }
}
