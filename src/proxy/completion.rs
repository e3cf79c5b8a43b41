//! Finishing the digests a download's pieces left unfinished.
//!
//! A resumed piece continues the hash from a stored state within [`MAX_HASH_GAP`] of its start;
//! pieces that come out of order, farther from any state (the last piece of a parallel download
//! first, say), cannot. When such a download completes and a stage still lacks the digest of its
//! whole input, rangeway reads the rest of the object from the origin itself, from the latest state
//! its stages share, runs the stages over it and records what they learn. Nothing of it is sent
//! to a client; at most one such pass runs per object on an instance.
//!
//! [`MAX_HASH_GAP`]: crate::representation::MAX_HASH_GAP

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use http::header;
use pingora_error::{Error, ErrorType, Result};
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::ObjectVersion as StageObject;
use tracing::Instrument as _;
use tracing::{debug, info};

use crate::representation::{ChainPass, StoredFacts, version_key};
use crate::routes::Route;
use crate::routes::UpstreamResume;
use crate::routes::origin_client::{OriginClient, Pin, Pinned, Tries};
use crate::state::{self, StateStore};

/// What a completion pass needs to know, taken from the request that finished the download.
#[derive(Debug)]
pub(super) struct Unfinished {
    pub(super) route: Arc<Route>,
    /// The object's key in the store.
    pub(super) object: String,
    /// The client path, as the stages are told it.
    pub(super) path: String,
    /// The upstream path and query.
    pub(super) target: String,
    pub(super) version: state::ObjectVersion,
}

/// The completion passes of one instance.
pub(super) struct Completions {
    client: Arc<OriginClient>,
    /// Objects with a pass running.
    running: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Completions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions").finish_non_exhaustive()
    }
}

impl Completions {
    pub(super) fn new(client: Arc<OriginClient>) -> Self {
        Self { client, running: Mutex::new(HashSet::new()) }
    }

    /// Starts a pass for `unfinished` in the background, unless one runs for its object.
    pub(super) fn start(self: &Arc<Self>, store: Arc<dyn StateStore>, unfinished: Unfinished) {
        let key = unfinished.object.clone();
        if !self.lock().insert(key.clone()) {
            return;
        }
        // Removes the key however the pass ends, a panic included: a key left behind would keep
        // its object from ever having another pass on this instance.
        let running = Running { completions: Arc::clone(self), key };
        tokio::spawn(async move {
            let route = unfinished.route.name.clone();
            let object = &running.key;
            match running.completions.run(store.as_ref(), unfinished).await {
                Ok(true) => {
                    info!(route, %object, "finished the digests a download's pieces left unfinished")
                }
                Ok(false) => debug!(route, %object, "the digests were complete already"),
                Err(error) => debug!(route, %object, %error, "could not finish the digests"),
            }
        }
        // In the trace of the response that started it, when it has one.
        .in_current_span());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the pass: `true` when it learned what was missing, `false` when nothing was.
    async fn run(&self, store: &dyn StateStore, unfinished: Unfinished) -> Result<bool> {
        let Unfinished { route, object, path, target, version } = unfinished;
        let Some(etag) = version.etag.as_deref().filter(|_| version.strong) else {
            return Ok(false);
        };
        // What the store knows now, from every instance: perhaps all of it already.
        let found = store
            .lookup("", &object, &route.stage_keys)
            .await
            .map_err(|e| Error::because(ErrorType::InternalError, "the store", e))?;
        let known = StoredFacts::of(version_key(&version), found.facts);
        let Some(from) = known.completion_start(&route.chain, version.size) else {
            return Ok(false);
        };
        let mut request = route.upstream.request("GET", &target, route.upstream.choose())?;
        request.insert_header(header::ACCEPT_ENCODING, "identity")?;
        let stream = ByteRange::new(from, version.size).ok_or_else(|| {
            Error::explain(ErrorType::InternalError, "a completion pass past the object's end")
        })?;
        let pinned = Pinned { by: Pin::ETag(etag), len: version.size };
        let (once, mut tries) = (&UpstreamResume::ONCE, Tries::new());
        let (mut exchange, _) = self
            .client
            .fetch(&route.upstream, &request, stream, pinned, once, &mut tries)
            .await
            .map_err(|e| {
                let why = format!("the origin gave no answer for the rest of the object: {e:?}");
                Error::explain(ErrorType::InvalidHTTPHeader, why)
            })?;
        let upstream = &mut exchange.session;
        let object_version = StageObject {
            route: &route.name,
            path: &path,
            strong_etag: Some(etag),
            len: version.size,
        };
        let plan = route
            .chain
            .plan(stream, &object_version, &known.learned())
            .map_err(|e| Error::because(ErrorType::InternalError, "planning", e))?;
        let mut pass =
            ChainPass::start(&route.chain, &plan, &object_version, known, stream.start())
                .map_err(|e| Error::because(ErrorType::InternalError, "starting the stages", e))?;
        while let Some(chunk) = upstream.read_response_body().await? {
            pass.push(chunk).map_err(|e| Error::because(ErrorType::InternalError, "a stage", e))?;
        }
        self.client.release(exchange).await;
        pass.finish().map_err(|e| Error::because(ErrorType::InternalError, "a stage", e))?;
        pass.record(store, &route.stage_keys, &object)
            .await
            .map_err(|e| Error::because(ErrorType::InternalError, "the store", e))?;
        Ok(true)
    }
}

/// A pass running for an object: while it lives, no other pass starts for that object.
struct Running {
    completions: Arc<Completions>,
    key: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.completions.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass that panics still lets its object have another.
    #[tokio::test]
    async fn a_pass_that_panics_releases_its_object() {
        let completions = Arc::new(Completions::new(Arc::new(OriginClient::new())));
        assert!(completions.lock().insert("files|/a".to_owned()));
        let running = Running { completions: Arc::clone(&completions), key: "files|/a".to_owned() };
        let pass = tokio::spawn(async move {
            let _running = running;
            panic!("a stage panicked");
        });
        assert!(pass.await.is_err(), "the pass panicked");
        assert!(completions.lock().is_empty(), "the object is free for another pass");
    }
}
