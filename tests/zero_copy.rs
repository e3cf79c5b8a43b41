//! Passthrough bodies cross rangeway without a copy. A large untouched body is spliced from the
//! origin's socket to the client's and never enters the process: the bytes allocated while it
//! streams through are a sliver of it. When rangeway cuts a range out of an origin's whole-object
//! answer, or a checksum stage looks at each chunk, the body is read once into pingora's buffers
//! (about one object's worth of allocation) and handed on without a second copy: the cut is a
//! `Bytes::slice`.
//!
//! nginx and curl run as separate processes, so the counting allocator sees rangeway alone.

// A global allocator is unsafe by definition; this one only counts and forwards to `System`.
#![allow(unsafe_code)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use support::clients::run;
use support::data::test_bytes;
use support::nginx::{Nginx, NginxOptions};
use support::proxy::Proxy;
use support::tmp::TempDir;

struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const LEN: usize = 64 * 1024 * 1024;

/// Bytes allocated by this process while curl fetches `url` with `range`.
fn allocated_during(url: &str, range: Option<&str>, expect_len: usize) -> u64 {
    let before = ALLOCATED.load(Ordering::Relaxed);
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}"]);
    if let Some(range) = range {
        curl.args(["-r", range]);
    }
    curl.arg(url);
    let out = run(curl, std::time::Duration::from_secs(120));
    out.assert_success();
    let after = ALLOCATED.load(Ordering::Relaxed);
    let (status, size) = out.stdout.trim().split_once(' ').expect("status and size");
    assert_eq!(size.parse::<usize>().expect("size"), expect_len, "status {status}");
    after - before
}

#[test]
fn passthrough_bodies_are_spliced_and_sliced_ones_not_copied() {
    let root = TempDir::new("zero-copy");
    std::fs::write(root.join("big.bin"), test_bytes(LEN, 11)).expect("write big.bin");

    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let proxy = Proxy::in_front_of(&nginx.base_url());
    let passthrough = allocated_during(&proxy.url("/big.bin"), None, LEN);

    let ignoring =
        Nginx::start(NginxOptions { ignore_range: true, ..NginxOptions::serving(root.path()) });
    let slicing = Proxy::in_front_of(&ignoring.base_url());
    // The last half, cut by rangeway out of the whole object nginx sends.
    let half = LEN / 2;
    let sliced = allocated_during(&slicing.url("/big.bin"), Some(&format!("{half}-")), half);

    // A route whose only stage is a checksum: the stage looks at each chunk and hands it on.
    let checksum = Proxy::start(&format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n  algorithms = [\"sha256\", \"crc32\"]\n",
        nginx.base_url()
    ));
    let checksummed = allocated_during(&checksum.url("/big.bin"), None, LEN);

    // A route that continues broken bodies: spliced too, continuations included.
    let resuming = Proxy::start(&format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\nupstream_resume = true\n",
        nginx.base_url()
    ));
    let relayed = allocated_during(&resuming.url("/big.bin"), None, LEN);

    let per_byte = |allocated: u64| allocated as f64 / LEN as f64;
    eprintln!(
        "allocated per body byte read from the origin: passthrough {:.3}, sliced {:.3}, checksum {:.3}, relayed {:.3}",
        per_byte(passthrough),
        per_byte(sliced),
        per_byte(checksummed),
        per_byte(relayed)
    );
    // Spliced: what is allocated is per request (headers, the first chunk), not per byte.
    assert!(per_byte(relayed) < 0.05, "relayed allocated {relayed} bytes for {LEN}");
    assert!(per_byte(passthrough) < 0.05, "passthrough allocated {passthrough} bytes for {LEN}");
    // One copy of the body would double these; 1.5 leaves room for pingora's buffer sizing.
    assert!(per_byte(sliced) < 1.5, "sliced allocated {sliced} bytes for {LEN}");
    assert!(per_byte(checksummed) < 1.5, "checksum allocated {checksummed} bytes for {LEN}");
}
