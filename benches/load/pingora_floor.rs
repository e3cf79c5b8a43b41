//! pingora's proxy with nothing of rangeway's: the load harness's floor for any proxy built on
//! pingora. As rangeway runs it: one worker thread, pingora's defaults otherwise (its upstream
//! pool included); every request to one origin, no hook but the one that names it.
//!
//!     pingora-floor LISTEN ORIGIN        e.g. pingora-floor 127.0.0.1:8080 127.0.0.1:9000
//!
//! Not a proxy to use: it checks nothing and forwards everything.

use async_trait::async_trait;
use pingora_core::server::Server;
use pingora_core::server::configuration::ServerConf;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};

struct Floor {
    origin: String,
}

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora_error::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.origin.as_str(), false, String::new())))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, origin] = args.as_slice() else {
        eprintln!("usage: pingora-floor LISTEN ORIGIN");
        std::process::exit(2);
    };
    // Stopped at once on SIGTERM: pingora's default grace is five minutes, which the harness's
    // cleanup would sit through after every run.
    let conf = ServerConf {
        threads: 1,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service =
        pingora_proxy::http_proxy_service(&server.configuration, Floor { origin: origin.clone() });
    service.add_tcp(listen);
    server.add_service(service);
    server.run_forever();
}
