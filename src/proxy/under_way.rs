//! The downloads under way on each route, for its concurrent-download limits
//! (`[routes.download_limits]`): a download is admitted or refused (429) before its origin is
//! asked, and holds its place until its response ends.
//!
//! Each instance counts what it serves; with a shared store (Redis) the instances also count
//! together: a download's first request on an instance holds it in the store
//! ([`StateStore::hold`]), which refuses it when the client or the route has its limit's worth
//! under way on all the instances. The hold is released when the instance's last request of the
//! download ends, and renewed meanwhile; one whose instance died lapses with its lease. When the
//! store does not answer, the instance's own count decides (and the store reports the outage).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::state::{Count, DownloadHold, DownloadLimits, Held, StateStore};

/// Every route's downloads under way, by route name.
#[derive(Debug)]
pub(crate) struct UnderWay {
    routes: Mutex<HashMap<String, RouteDownloads>>,
    /// Makes each request a download of its own where limits count requests.
    requests: AtomicU64,
    /// Tells this instance's requests apart from other instances' where limits count requests.
    instance: u64,
    /// Where the instances count together, if the store is shared.
    store: Option<Arc<dyn StateStore>>,
    /// Whether the task renewing this instance's holds runs.
    renewing: AtomicBool,
}

#[derive(Debug, Default)]
struct RouteDownloads {
    /// Requests in flight, by download.
    requests: HashMap<Download, InFlight>,
    /// Downloads under way, by client address.
    per_client: HashMap<IpAddr, usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Download {
    key: String,
    client: Option<IpAddr>,
}

#[derive(Debug)]
struct InFlight {
    requests: usize,
    /// Whether the shared store holds the download for this instance.
    held: bool,
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
    /// Downloads counted by this instance alone, and by `store` with every instance sharing it.
    pub(crate) fn new(store: Option<Arc<dyn StateStore>>) -> Self {
        let mut instance = [0u8; 8];
        // Without randomness, instances counting requests may take one another's for their own:
        // a count too low, never a refusal too many.
        let _ = getrandom::fill(&mut instance);
        Self {
            routes: Mutex::default(),
            requests: AtomicU64::new(0),
            instance: u64::from_le_bytes(instance),
            store: store.filter(|store| store.hold_lease().is_some()),
            renewing: AtomicBool::new(false),
        }
    }

    /// A place for a request of `download` (its id and object) from `client` on `route`, or the
    /// limit it would break, here or across the instances. A request of a download already under
    /// way joins it (when `limits` count downloads): pieces fetched in parallel are one download.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        route: &str,
        limits: &DownloadLimits,
        client: Option<IpAddr>,
        download: &str,
    ) -> Result<Place, Limit> {
        let (place, first) = self.admit_here(route, limits, client, download)?;
        let Some(store) = self.store.as_ref().filter(|_| first) else { return Ok(place) };
        match store.hold(&place.hold(), limits).await {
            Ok(Held::Shared) => {
                self.set_held(&place);
                self.keep_renewing(store);
            }
            Ok(Held::OverClientLimit) => {
                return Err(Limit::PerClient(limits.per_client.unwrap_or_default()));
            }
            Ok(Held::OverRouteLimit) => {
                return Err(Limit::PerRoute(limits.per_route.unwrap_or_default()));
            }
            // The instance's own count decides; the store reports its outage.
            Ok(Held::Here) | Err(_) => {}
        }
        Ok(place)
    }

    /// The place by this instance's count alone, and whether it is the download's first here.
    fn admit_here(
        self: &Arc<Self>,
        route: &str,
        limits: &DownloadLimits,
        client: Option<IpAddr>,
        download: &str,
    ) -> Result<(Place, bool), Limit> {
        let key = match limits.count {
            Count::Download => download.to_owned(),
            Count::Request => format!(
                "{download}#{:x}-{}",
                self.instance,
                self.requests.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let download = Download { key, client };
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let under_way = routes.entry(route.to_owned()).or_default();
        let first = match under_way.requests.get_mut(&download) {
            Some(in_flight) => {
                in_flight.requests += 1;
                false
            }
            None => {
                let client_has =
                    client.map_or(0, |ip| under_way.per_client.get(&ip).copied().unwrap_or(0));
                if let Some(limit) =
                    limits.per_client.filter(|limit| client.is_some() && client_has >= *limit)
                {
                    return Err(Limit::PerClient(limit));
                }
                if let Some(limit) =
                    limits.per_route.filter(|limit| under_way.requests.len() >= *limit)
                {
                    return Err(Limit::PerRoute(limit));
                }
                under_way.requests.insert(download.clone(), InFlight { requests: 1, held: false });
                if let Some(ip) = client {
                    *under_way.per_client.entry(ip).or_default() += 1;
                }
                true
            }
        };
        Ok((Place { under_way: Arc::clone(self), route: route.to_owned(), download }, first))
    }

    fn set_held(&self, place: &Place) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(in_flight) =
            routes.get_mut(&place.route).and_then(|r| r.requests.get_mut(&place.download))
        {
            in_flight.held = true;
        }
    }

    /// The downloads the shared store holds for this instance.
    fn held(&self) -> Vec<DownloadHold> {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        routes
            .iter()
            .flat_map(|(route, downloads)| {
                downloads
                    .requests
                    .iter()
                    .filter(|(_, in_flight)| in_flight.held)
                    .map(|(download, _)| hold(route, download))
            })
            .collect()
    }

    /// Starts, once, the task that renews this instance's holds a few times a lease, for as long
    /// as this value lives.
    fn keep_renewing(self: &Arc<Self>, store: &Arc<dyn StateStore>) {
        let Some(lease) = store.hold_lease() else { return };
        if self.renewing.swap(true, Ordering::Relaxed) {
            return;
        }
        let (under_way, store) = (Arc::downgrade(self), Arc::clone(store));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(lease / 3);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(holds) = Weak::upgrade(&under_way).map(|u| u.held()) else { return };
                if !holds.is_empty() {
                    // A failed renewal is tried again at the next tick, before the lease lapses.
                    let _ = store.renew(&holds).await;
                }
            }
        });
    }
}

fn hold(route: &str, download: &Download) -> DownloadHold {
    DownloadHold {
        route: route.to_owned(),
        client: download.client,
        download: download.key.clone(),
    }
}

impl Place {
    fn hold(&self) -> DownloadHold {
        hold(&self.route, &self.download)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut routes = self.under_way.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(under_way) = routes.get_mut(&self.route) else { return };
        let Some(in_flight) = under_way.requests.get_mut(&self.download) else { return };
        in_flight.requests -= 1;
        if in_flight.requests > 0 {
            return;
        }
        let held = in_flight.held;
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
        drop(routes);
        if held
            && let Some(store) = self.under_way.store.clone()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Unreleased (a failed call, no runtime), the hold lapses with its lease.
            let hold = self.hold();
            runtime.spawn(async move { store.release(&[hold]).await });
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
        let under_way = Arc::new(UnderWay::new(None));
        let per_client = limits(Some(2), None, Count::Download);
        let (a, b) = (Some(IpAddr::from([192, 0, 2, 1])), Some(IpAddr::from([192, 0, 2, 2])));
        let first = under_way.admit_here("/", &per_client, a, "id|x").expect("first").0;
        // Pieces of the first download: the same download.
        let pieces: Vec<_> = (0..8)
            .map(|_| under_way.admit_here("/", &per_client, a, "id|x").expect("a piece").0)
            .collect();
        let second = under_way.admit_here("/", &per_client, a, "id|y").expect("second").0;
        assert_eq!(
            under_way.admit_here("/", &per_client, a, "id|z").err(),
            Some(Limit::PerClient(2))
        );
        // Another client, another route: their own counts.
        assert!(under_way.admit_here("/", &per_client, b, "id|z").is_ok());
        assert!(under_way.admit_here("/other/", &per_client, a, "id|z").is_ok());
        drop(first);
        assert!(under_way.admit_here("/", &per_client, a, "id|z").is_err(), "its pieces still run");
        drop(pieces);
        let third = under_way.admit_here("/", &per_client, a, "id|z").expect("a place came free").0;
        drop((second, third));
        assert!(under_way.routes.lock().expect("lock").is_empty(), "nothing left behind");
    }

    #[test]
    fn route_limits_and_counting_requests() {
        let under_way = Arc::new(UnderWay::new(None));
        let per_route = limits(None, Some(2), Count::Download);
        let ip = |n| Some(IpAddr::from([192, 0, 2, n]));
        let _one = under_way.admit_here("/", &per_route, ip(1), "a").expect("one").0;
        let _two = under_way.admit_here("/", &per_route, ip(2), "b").expect("two").0;
        assert_eq!(
            under_way.admit_here("/", &per_route, ip(3), "c").err(),
            Some(Limit::PerRoute(2))
        );
        let each = limits(Some(1), None, Count::Request);
        let _piece = under_way.admit_here("/each/", &each, ip(1), "a").expect("one request").0;
        assert_eq!(
            under_way.admit_here("/each/", &each, ip(1), "a").err(),
            Some(Limit::PerClient(1))
        );
    }
}
