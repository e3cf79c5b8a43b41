//! What rangeway counts and what it has in flight: written by every layer that serves (admission,
//! the proxy, the cache), read by the admin listener (`/metrics`, the admin API, the live page).
//! It imports nothing of those layers, so that counting never points back up.

pub mod live;
pub mod metrics;
