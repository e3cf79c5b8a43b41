//! The downloads under way on each route, for its concurrent-download limits
//! (`[routes.download_limits]`): a download is admitted or refused (429) before its origin is
//! asked, and holds its place until its response ends. Per instance: each instance counts what
//! it serves.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::{Count, DownloadLimits};

/// Every route's downloads under way, by route name.
#[derive(Debug, Default)]
pub(crate) struct UnderWay {
    routes: Mutex<HashMap<String, RouteDownloads>>,
    /// Makes each request a download of its own where limits count requests.
    requests: AtomicU64,
}

#[derive(Debug, Default)]
struct RouteDownloads {
    /// Requests in flight, by download.
    requests: HashMap<Download, usize>,
    /// Downloads under way, by client address.
    per_client: HashMap<IpAddr, usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Download {
    key: String,
    client: Option<IpAddr>,
}

/// Which limit refused a download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    PerClient(usize),
    PerRoute(usize),
}

impl Limit {
    /// Its name in `rangeway_downloads_limited_total{limit}`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::PerClient(_) => "per_client",
            Self::PerRoute(_) => "per_route",
        }
    }
}

/// A download's place among those under way; given back when dropped (with the request).
#[derive(Debug)]
pub(crate) struct Place {
    under_way: Arc<UnderWay>,
    route: String,
    download: Download,
}

impl UnderWay {
    /// A place for a request of `download` (its id and object) from `client` on `route`, or the
    /// limit it would break. A request of a download already under way joins it (when `limits`
    /// count downloads): pieces fetched in parallel are one download.
    pub(crate) fn admit(
        self: &Arc<Self>,
        route: &str,
        limits: &DownloadLimits,
        client: Option<IpAddr>,
        download: &str,
    ) -> Result<Place, Limit> {
        let key = match limits.count {
            Count::Download => download.to_owned(),
            Count::Request => {
                format!("{download}#{}", self.requests.fetch_add(1, Ordering::Relaxed))
            }
        };
        let download = Download { key, client };
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let under_way = routes.entry(route.to_owned()).or_default();
        if let Some(requests) = under_way.requests.get_mut(&download) {
            *requests += 1;
        } else {
            let client_has =
                client.map_or(0, |ip| under_way.per_client.get(&ip).copied().unwrap_or(0));
            if let Some(limit) =
                limits.per_client.filter(|limit| client.is_some() && client_has >= *limit)
            {
                return Err(Limit::PerClient(limit));
            }
            if let Some(limit) = limits.per_route.filter(|limit| under_way.requests.len() >= *limit)
            {
                return Err(Limit::PerRoute(limit));
            }
            under_way.requests.insert(download.clone(), 1);
            if let Some(ip) = client {
                *under_way.per_client.entry(ip).or_default() += 1;
            }
        }
        Ok(Place { under_way: Arc::clone(self), route: route.to_owned(), download })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut routes = self.under_way.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(under_way) = routes.get_mut(&self.route) else { return };
        let Some(requests) = under_way.requests.get_mut(&self.download) else { return };
        *requests -= 1;
        if *requests > 0 {
            return;
        }
        under_way.requests.remove(&self.download);
        if let Some(ip) = self.download.client
            && let Some(count) = under_way.per_client.get_mut(&ip)
        {
            *count -= 1;
            if *count == 0 {
                under_way.per_client.remove(&ip);
            }
        }
        if under_way.requests.is_empty() {
            routes.remove(&self.route);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_client: Option<usize>, per_route: Option<usize>, count: Count) -> DownloadLimits {
        DownloadLimits { per_client, per_route, count }
    }

    #[test]
    fn a_client_past_its_limit_waits_for_one_to_end() {
        let under_way = Arc::new(UnderWay::default());
        let per_client = limits(Some(2), None, Count::Download);
        let (a, b) = (Some(IpAddr::from([192, 0, 2, 1])), Some(IpAddr::from([192, 0, 2, 2])));
        let first = under_way.admit("/", &per_client, a, "id|x").expect("first");
        // Pieces of the first download: the same download.
        let pieces: Vec<_> = (0..8)
            .map(|_| under_way.admit("/", &per_client, a, "id|x").expect("a piece"))
            .collect();
        let second = under_way.admit("/", &per_client, a, "id|y").expect("second");
        assert_eq!(under_way.admit("/", &per_client, a, "id|z").err(), Some(Limit::PerClient(2)));
        // Another client, another route: their own counts.
        assert!(under_way.admit("/", &per_client, b, "id|z").is_ok());
        assert!(under_way.admit("/other/", &per_client, a, "id|z").is_ok());
        drop(first);
        assert!(under_way.admit("/", &per_client, a, "id|z").is_err(), "its pieces still run");
        drop(pieces);
        let third = under_way.admit("/", &per_client, a, "id|z").expect("a place came free");
        drop((second, third));
        assert!(under_way.routes.lock().expect("lock").is_empty(), "nothing left behind");
    }

    #[test]
    fn route_limits_and_counting_requests() {
        let under_way = Arc::new(UnderWay::default());
        let per_route = limits(None, Some(2), Count::Download);
        let ip = |n| Some(IpAddr::from([192, 0, 2, n]));
        let _one = under_way.admit("/", &per_route, ip(1), "a").expect("one");
        let _two = under_way.admit("/", &per_route, ip(2), "b").expect("two");
        assert_eq!(under_way.admit("/", &per_route, ip(3), "c").err(), Some(Limit::PerRoute(2)));
        let each = limits(Some(1), None, Count::Request);
        let _piece = under_way.admit("/each/", &each, ip(1), "a").expect("one request");
        assert_eq!(under_way.admit("/each/", &each, ip(1), "a").err(), Some(Limit::PerClient(1)));
    }
}
