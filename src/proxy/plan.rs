//! What to ask the upstream for, planned before the request with what the store knows: the range
//! a route's stages need, and ranges far apart fetched in stretches.

use http::header;
use rangeway_middleware::chain::ObjectVersion as StageObject;
use rangeway_middleware::rfc9110::{IgnoreReason, RangeSpec, Resolution};

use super::context::RequestCtx;
use crate::range::{ClientRange, PART_GAP, covering};
use crate::representation::StoredFacts;
use crate::routes::Route;
use crate::state::ObjectVersion;

/// On a route with middleware, what to ask the upstream for. A route whose stages only observe
/// asks for the client's range, started earlier when that lets a hash go on from a stored state
/// (the extra bytes are not sent). A route that transforms asks for the origin bytes its chain
/// needs for the client's range, planned against the version the store knows, with If-Range on
/// it; without a known version, a plan or a plain range, it asks for the whole object.
pub(super) fn plan_upstream(
    ctx: &mut RequestCtx,
    route: &Route,
    current: Option<&crate::state::ObjectVersion>,
    known: &StoredFacts,
    request: &http::HeaderMap,
) {
    let observing = route.chain.is_observing_only();
    if !observing {
        ctx.identity.sent_range = None;
    }
    let ClientRange::Bytes(set) = &ctx.identity.client_range else { return };
    if observing {
        if let [spec] = set.specs() {
            let size = current.map(|v| v.size);
            let widened = match *spec {
                RangeSpec::Closed { first, last } => {
                    RangeSpec::Closed { first: known.hash_start(first, size), last }
                }
                RangeSpec::From { first } => {
                    RangeSpec::From { first: known.hash_start(first, size) }
                }
                RangeSpec::Suffix { .. } => *spec,
            };
            ctx.identity.sent_range = Some(widened);
        }
        return;
    }
    let Some(current) = current.filter(|v| v.strong) else { return };
    if request.contains_key(header::IF_RANGE) || route.chain.content_coding().is_some() {
        return;
    }
    let object = StageObject {
        route: &route.name,
        path: &ctx.identity.object_path,
        strong_etag: current.etag.as_deref(),
        len: current.size,
    };
    let learned = known.learned();
    let Some(output_len) = route.chain.output_len(&object, &learned) else { return };
    let covering = match set.resolve(output_len) {
        Resolution::Single(range) => Some(range),
        Resolution::Multiple(ranges) => covering(&ranges),
        Resolution::Unsatisfiable => None,
    };
    let Some(covering) = covering else { return };
    let Ok(plan) = route.chain.plan(covering, &object, &learned) else { return };
    if let Some(last) = plan.origin().last() {
        ctx.identity.sent_range = Some(RangeSpec::Closed { first: plan.origin().start(), last });
        ctx.identity.planned_for = current.etag.clone();
    }
}

/// Ranges far apart are not read through: fetched apart where rangeway knows the object's version
/// to pin them to (the first stretch asked for with `If-Range` on it, the rest after it, see
/// `relay`), else the Range is ignored — a 200 costs what the client takes.
pub(super) fn plan_parts(
    ctx: &mut RequestCtx,
    current: Option<&ObjectVersion>,
    request: &http::HeaderMap,
) {
    let ClientRange::Bytes(set) = &ctx.identity.client_range else { return };
    let fetches = current.map(|version| set.fetches(version.size, PART_GAP));
    let apart = match &fetches {
        Some(fetches) => fetches.len() > 1,
        None => !set.lies_together(PART_GAP),
    };
    if !apart {
        return;
    }
    let pinned = current.filter(|v| v.strong).and_then(|v| v.etag.clone());
    let first = fetches.and_then(|fetches| fetches.first().copied());
    match (first.zip(first.and_then(|f| f.last())), pinned) {
        (Some((first, last)), Some(etag)) if !request.contains_key(header::IF_RANGE) => {
            ctx.identity.sent_range = Some(RangeSpec::Closed { first: first.start(), last });
            ctx.identity.planned_for = Some(etag);
            ctx.identity.part_gap = Some(PART_GAP);
        }
        _ => {
            ctx.identity.client_range = ClientRange::Ignored(IgnoreReason::Sparse);
            ctx.identity.sent_range = None;
        }
    }
}
