//! `[routes.download_limits]`: how many downloads may be under way at once, per client and per
//! route.

use super::read::{Ctx, Field, Read, Table};

const EXAMPLE: &str = "[routes.download_limits] with per_client = 10";

/// Concurrent-download limits of a route. A download is what the download id names (one
/// session); past a limit a new one is answered 429 before the origin is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DownloadLimits {
    /// Downloads one client address may have under way. `None`: no limit.
    pub per_client: Option<usize>,
    /// Downloads all clients together may have under way on the route. `None`: no limit.
    pub per_route: Option<usize>,
    /// What is counted: each download once however many requests carry its pieces
    /// (`"download"`, the default), or each request (`"request"`).
    pub count: Count,
}

/// What a download limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A download once, however many ranged requests fetch its pieces at the same time
    /// (`aria2c -x16`).
    Download,
    /// Every request.
    Request,
}

pub(super) fn read(ctx: &mut Ctx<'_>, field: Field) -> Read<DownloadLimits> {
    let path = field.path.clone();
    let header = format!("[{path}]");
    let mut table = Table::new(ctx, &field.path, header, field.node, EXAMPLE)?;
    let mut limit = |ctx: &mut Ctx<'_>, key: &'static str| {
        table.take(key).map(|f| f.integer(ctx, 1..=1_000_000usize, "10")).transpose()
    };
    let per_client = limit(ctx, "per_client");
    let per_route = limit(ctx, "per_route");
    let count = table.take("count").map_or(Ok(Count::Download), |f| {
        let (path, origin) = (f.path.clone(), f.origin().clone());
        match f.string(ctx, "\"download\"")?.as_str() {
            "download" => Ok(Count::Download),
            "request" => Ok(Count::Request),
            other => Err(ctx.report(
                &path,
                &origin,
                format!("{other:?} is not what a limit counts"),
                "use \"download\" (each download once, however many pieces) or \"request\"",
            )),
        }
    });
    table.finish(ctx);
    let limits = DownloadLimits { per_client: per_client?, per_route: per_route?, count: count? };
    if limits.per_client.is_none() && limits.per_route.is_none() {
        return Err(ctx.report_at(
            &path,
            "sets no limit",
            "add per_client = 10 or per_route = 1000, or remove the table",
        ));
    }
    Ok(limits)
}
