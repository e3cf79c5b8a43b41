//! `[cache]`: the slice cache on local disk (see `crate::cache`), and each route's say in it.

use super::check::{Ctx, complete, folder, read};
use super::raw::{Raw, RawCache, RawRouteCache};
use super::source::Path;
use crate::cache::CacheConfig;
use crate::routes::{Revalidate, RouteCache};

/// Without `max_entries`, one entry per 64 KiB of `max_size`: a cache of large objects never meets
/// it, while one of many small objects (a folder, metadata and a slice each) meets it before
/// `max_size`, which bounds the cache's inodes and the memory of its index.
const BYTES_PER_ENTRY: u64 = 64 << 10;
/// Room for a few objects; past 2³² a number is a mistake.
const ENTRIES: std::ops::RangeInclusive<u64> = 64..=1 << 32;

pub(super) fn check(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawCache>) -> Option<CacheConfig> {
    let r = v.table(at, raw, "[cache] with dir = \"/var/cache/rangeway\"")?;
    let fix = "add dir = \"/var/cache/rangeway\" (a folder rangeway may write), or remove [cache]";
    // A folder that cannot be written turns the cache off at start, not the server.
    let writable = |dir: &str| {
        let fix = "point dir at a folder rangeway may write, or at a path where one can be created";
        folder(dir, fix, false)
    };
    // At least a few slices, at most 1 PiB. Smaller slices cost a file and an origin request each
    // for little; larger ones make a cold small range fetch more than it needs.
    read! { v, at, r;
        dir: parsed("\"/var/cache/rangeway\"", writable).need(v, &at.key("dir"), fix);
        max_size: size(16 << 20..=1 << 50, "\"10GiB\"").or(10 << 30);
        slice_size: size(1 << 20..=8 << 20, "\"4MiB\"").or(4 << 20);
        max_entries: integer(ENTRIES, "100000").opt();
    }
    let (dir, max_size, slice_size, max_entries) = (dir?, max_size?, slice_size?, max_entries?);
    let max_entries =
        max_entries.unwrap_or((max_size / BYTES_PER_ENTRY).clamp(*ENTRIES.start(), *ENTRIES.end()));
    if max_size < 4 * slice_size {
        return v.fail(
            &at.key("max_size"),
            format!("{max_size} bytes hold fewer than four slices of {slice_size}"),
            "make max_size at least four times slice_size",
        );
    }
    Some(CacheConfig { dir, max_size, max_entries, slice_size })
}

pub(super) fn route(v: &mut Ctx<'_>, at: &Path, r: &RawRouteCache) -> Option<RouteCache> {
    let policies = [("rfc9111", Revalidate::Rfc9111), ("each-download", Revalidate::EachDownload)];
    let (example, what) = ("\"each-download\"", "a revalidation policy");
    let fix = "use \"rfc9111\" (when the response's freshness says) or \"each-download\"";
    read! { v, at, r;
        revalidate: choice(example, &policies, what, fix).or(Revalidate::Rfc9111);
        authorized: boolean().or(false);
    }
    complete! { RouteCache { revalidate, authorized } }
}
