//! `[cache]`: the slice cache on local disk (see `crate::cache`), and each route's say in it.

use std::path::PathBuf;

use super::read::{Ctx, Field, Read, Table};
use super::tree::{Kind, Node, Origin};

/// 1 MiB to 8 MiB: smaller slices cost a file and an origin request each for little; larger ones
/// make a cold small range fetch more than it needs.
const MIN_SLICE: u64 = 1 << 20;
const MAX_SLICE: u64 = 8 << 20;
const DEFAULT_SLICE: u64 = 4 << 20;
/// At least a few slices; at most 1 PiB, past which a number is a mistake.
const MIN_SIZE: u64 = 16 << 20;
const MAX_SIZE: u64 = 1 << 50;
const DEFAULT_SIZE: u64 = 10 << 30;
/// Without `max_entries`, one entry (a file or a folder) for each 64 KiB of `max_size`: a slice
/// of the default size is one entry for 4 MiB, so a cache of large objects never meets the bound,
/// while one of many small objects (three entries each: a folder, its metadata, a slice) meets
/// it before `max_size` — which bounds the cache's inodes and rangeway's memory for its index.
const BYTES_PER_ENTRY: u64 = 64 << 10;
/// Room for a few objects' folders, metadata and slices; at most 2³², past which a number is a
/// mistake.
const MIN_ENTRIES: u64 = 64;
const MAX_ENTRIES: u64 = 1 << 32;

/// `[cache]`: present when the section is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheConfig {
    /// Where slices are kept; created at start when missing.
    pub dir: PathBuf,
    /// The most the cache may take on disk, in bytes, as `du` counts them: its slices, their
    /// metadata files and its folders, in whole blocks. Default 10 GiB.
    pub max_size: u64,
    /// The most files and folders the cache may keep (and records its index holds). Default
    /// `max_size` / 64 KiB, at least 64.
    pub max_entries: u64,
    /// The bytes of an object each slice holds (the last one of an object fewer). Default 4 MiB.
    pub slice_size: u64,
}

/// A route's use of the cache (`cache = true | false | { ... }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteCache {
    /// When a stored response is validated with the origin before it is served.
    pub revalidate: Revalidate,
    /// Whether the answers to requests carrying `Authorization` may be stored and served (they
    /// are for one client unless the route says so; RFC 9111 §3.5 lets the origin say so too).
    pub authorized: bool,
}

impl Default for RouteCache {
    fn default() -> Self {
        Self { revalidate: Revalidate::Rfc9111, authorized: false }
    }
}

/// When a stored response is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revalidate {
    /// When RFC 9111 says it must be: once it is stale, or when it or the request says `no-cache`.
    Rfc9111,
    /// Also at the start of every new download: a request that is not a resume of a download
    /// session is validated with a conditional request (no body) before it is served.
    EachDownload,
}

pub(super) fn read(ctx: &mut Ctx<'_>, node: Option<Node>) -> Read<Option<CacheConfig>> {
    let Some(node) = node else { return Ok(None) };
    let example = "[cache] with dir = \"/var/cache/rangeway\"";
    let mut table = Table::new(ctx, "cache", "[cache]", node, example)?;
    let dir = match table.take("dir") {
        Some(field) => read_dir(ctx, field),
        None => Err(ctx.report_at(
            "cache.dir",
            "is missing",
            "add dir = \"/var/cache/rangeway\" (a folder rangeway may write), or remove [cache]",
        )),
    };
    let max_size = table
        .take("max_size")
        .map_or(Ok(DEFAULT_SIZE), |f| f.size(ctx, MIN_SIZE..=MAX_SIZE, "\"10GiB\""));
    let slice_size = table
        .take("slice_size")
        .map_or(Ok(DEFAULT_SLICE), |f| f.size(ctx, MIN_SLICE..=MAX_SLICE, "\"4MiB\""));
    let max_entries =
        table.take("max_entries").map(|f| f.integer(ctx, MIN_ENTRIES..=MAX_ENTRIES, "100000"));
    table.finish(ctx);
    let (dir, max_size, slice_size) = (dir?, max_size?, slice_size?);
    let max_entries = match max_entries {
        Some(read) => read?,
        None => (max_size / BYTES_PER_ENTRY).clamp(MIN_ENTRIES, MAX_ENTRIES),
    };
    if max_size < 4 * slice_size {
        return Err(ctx.report_at(
            "cache.max_size",
            format!("{max_size} bytes hold fewer than four slices of {slice_size}"),
            "make max_size at least four times slice_size",
        ));
    }
    Ok(Some(CacheConfig { dir, max_size, max_entries, slice_size }))
}

fn read_dir(ctx: &mut Ctx<'_>, field: Field) -> Read<PathBuf> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let dir = field.string(ctx, "\"/var/cache/rangeway\"")?;
    let fix = "point dir at a folder rangeway may write, or at a path where one can be created";
    if dir.is_empty() || dir.contains('\0') {
        return Err(ctx.report(&path, &origin, "is not a usable path", fix));
    }
    match std::fs::metadata(&dir) {
        Ok(meta) if !meta.is_dir() => {
            Err(ctx.report(&path, &origin, format!("{dir:?} exists but is not a directory"), fix))
        }
        // A folder that cannot be written is found at start, and turns the cache off rather than
        // the server: downloads go on from the origin.
        _ => Ok(dir.into()),
    }
}

/// A route's `cache`: `None` when the route does not use the cache. Without the key, a route
/// uses it when there is a `[cache]` and its upstream is not a local folder (which a cache would
/// only copy).
pub(super) fn read_route(
    ctx: &mut Ctx<'_>,
    field: Option<Field>,
    default_on: bool,
) -> Read<Option<RouteCache>> {
    let Some(field) = field else { return Ok(default_on.then(RouteCache::default)) };
    let switch = matches!(
        (&field.node.kind, field.origin()),
        (Kind::Bool(_), _) | (Kind::Str(_), Origin::Env(_))
    );
    if switch {
        return Ok(field.boolean(ctx)?.then(RouteCache::default));
    }
    let header = format!("[{}]", field.path);
    let example = "[routes.cache] with revalidate = \"each-download\"";
    let mut table = Table::new(ctx, &field.path, header, field.node, example)?;
    let revalidate = table.take("revalidate").map_or(Ok(Revalidate::Rfc9111), |f| {
        let (path, origin) = (f.path.clone(), f.origin().clone());
        match f.string(ctx, "\"each-download\"")?.as_str() {
            "rfc9111" => Ok(Revalidate::Rfc9111),
            "each-download" => Ok(Revalidate::EachDownload),
            other => Err(ctx.report(
                &path,
                &origin,
                format!("{other:?} is not a revalidation policy"),
                "use \"rfc9111\" (when the response's freshness says) or \"each-download\"",
            )),
        }
    });
    let authorized = table.take("authorized").map_or(Ok(false), |f| f.boolean(ctx));
    table.finish(ctx);
    Ok(Some(RouteCache { revalidate: revalidate?, authorized: authorized? }))
}
