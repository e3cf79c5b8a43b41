//! `[routes.rate_limit]`: how fast a route's responses go out — each response, each client's
//! together, the route's together — and the origin header that may slow one down.

use http::HeaderName;

use super::read::{Ctx, Field, Read, Table};

const EXAMPLE: &str = "[routes.rate_limit] with rate = \"2MiB\" (bytes per second)";
/// The slowest rate worth shaping to, and the fastest worth naming (bytes per second).
const RATES: std::ops::RangeInclusive<u64> = 1024..=(1 << 40);

/// A route's bandwidth limits, in bytes per second. Bodies are paced in steps of at most 50 ms
/// of the slowest rate that applies, so no 100 ms window carries more than twice the rate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// Each response. `None`: only what the origin's header asks, or the shared rates.
    pub rate: Option<u64>,
    /// The first bytes of each response that go out unshaped (a fast start). Default 0.
    pub after: u64,
    /// All of one client address's responses on the route together.
    pub per_client: Option<u64>,
    /// All of the route's responses together, a fair share each.
    pub per_route: Option<u64>,
    /// A response field by which the origin may lower one response's rate (never raise it
    /// above `rate`), as nginx's `X-Accel-Limit-Rate`: bytes per second. Not sent to clients.
    pub origin_header: Option<HeaderName>,
}

pub(super) fn read(ctx: &mut Ctx<'_>, field: Field) -> Read<RateLimit> {
    let path = field.path.clone();
    let header = format!("[{path}]");
    let mut table = Table::new(ctx, &field.path, header, field.node, EXAMPLE)?;
    let mut rate = |ctx: &mut Ctx<'_>, key: &'static str| {
        table.take(key).map(|f| f.size(ctx, RATES, "\"2MiB\" (per second)")).transpose()
    };
    let per_response = rate(ctx, "rate");
    let per_client = rate(ctx, "per_client");
    let per_route = rate(ctx, "per_route");
    let after = table.take("after").map_or(Ok(0), |f| f.size(ctx, 0..=(1 << 50), "\"4MiB\""));
    let origin_header = table
        .take("origin_header")
        .map(|f| {
            let (at, origin) = (f.path.clone(), f.origin().clone());
            let name = f.string(ctx, "\"X-Accel-Limit-Rate\"")?;
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                ctx.report(
                    &at,
                    &origin,
                    format!("{name:?} is not a header name"),
                    "write a field name, e.g. \"X-Accel-Limit-Rate\"",
                )
            })
        })
        .transpose();
    table.finish(ctx);
    let limit = RateLimit {
        rate: per_response?,
        after: after?,
        per_client: per_client?,
        per_route: per_route?,
        origin_header: origin_header?,
    };
    if limit.rate.is_none()
        && limit.per_client.is_none()
        && limit.per_route.is_none()
        && limit.origin_header.is_none()
    {
        return Err(ctx.report_at(
            &path,
            "sets no rate",
            "add rate = \"2MiB\" (per response, per second), per_client or per_route, or remove the table",
        ));
    }
    Ok(limit)
}
