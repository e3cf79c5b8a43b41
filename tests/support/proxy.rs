//! rangeway itself, started in-process on free ports in front of the upstreams a test names.

use std::net::SocketAddr;

use rangeway::config::Config;
use rangeway::server::Running;
use rangeway_middleware::chain::StageRegistry;

use super::ports::free_ports;

/// A running rangeway; stopped (without grace period) when dropped.
pub(crate) struct Proxy {
    running: Running,
}

impl Proxy {
    /// Starts rangeway with `body` (the `[upstreams.*]` and `[[routes]]` of a config) on free
    /// ports, with the default everything else.
    pub(crate) fn start(body: &str) -> Proxy {
        Proxy::start_with_server(body, "")
    }

    /// Like [`Proxy::start`], with extra `[server]` keys.
    pub(crate) fn start_with_server(body: &str, server_keys: &str) -> Proxy {
        Proxy::start_with_registry(body, server_keys, &StageRegistry::new())
    }

    /// Like [`Proxy::start_with_server`], with the middleware kinds of `registry` (a library
    /// user's own stages, say).
    pub(crate) fn start_with_registry(
        body: &str,
        server_keys: &str,
        registry: &StageRegistry,
    ) -> Proxy {
        // RUST_LOG=rangeway=debug shows rangeway's logs in a failing test's output.
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        let (text, _, _) = config_text(server_keys, body);
        let config = Config::from_toml_str(&text, registry)
            .unwrap_or_else(|errors| panic!("test config is invalid:\n{errors}\n---\n{text}"));
        let running = Running::start(&config, registry)
            .unwrap_or_else(|e| panic!("rangeway did not start: {e}"));
        Proxy { running }
    }

    /// Starts rangeway with one route, `/` (nothing stripped), to an http upstream at `base_url`.
    pub(crate) fn in_front_of(base_url: &str) -> Proxy {
        Proxy::start(&format!(
            "[upstreams.origin]\nurl = \"{base_url}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n"
        ))
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.running.endpoints.proxy
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    pub(crate) fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.running.endpoints.admin)
    }

    pub(crate) fn admin_addr(&self) -> SocketAddr {
        self.running.endpoints.admin
    }

    /// See [`Instance::metric`].
    pub(crate) fn metric(&self, name: &str, label: &str) -> u64 {
        Instance::metric(self, name, label)
    }

    /// [`metric`](Self::metric) once it is at least `least`, or after 5 s: counts made when a
    /// response is logged, which is after its last byte went to the client.
    pub(crate) fn metric_at_least(&self, name: &str, label: &str, least: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let value = self.metric(name, label);
            if value >= least || std::time::Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A rangeway a test talks to, in-process or a process of its own.
pub(crate) trait Instance {
    fn url(&self, path: &str) -> String;
    fn admin_url(&self, path: &str) -> String;

    /// The sum of the series of metric `name` whose labels include `label` ("" for all), as
    /// `/metrics` shows them now.
    fn metric(&self, name: &str, label: &str) -> u64 {
        let text = super::http::get(&self.admin_url("/metrics"), &[]).body;
        String::from_utf8(text)
            .expect("metrics are text")
            .lines()
            .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// What the admin API lists of the cache for `query` (`path=…` or `prefix=…`): its JSON,
    /// `{"objects": [...]}` — none for a path the cache does not hold (which it answers 404).
    fn cache_listing(&self, query: &str) -> serde_json::Value {
        let listed = super::http::get(&self.admin_url(&format!("/v1/cache?{query}")), &[]);
        let text = String::from_utf8_lossy(&listed.body);
        let json: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("/v1/cache?{query}: not JSON ({e}): {text}"));
        match listed.status {
            200 => json,
            404 if json["error"] == "not in the cache" => serde_json::json!({ "objects": [] }),
            status => panic!("/v1/cache?{query}: {status}: {text}"),
        }
    }
}

impl Instance for Proxy {
    fn url(&self, path: &str) -> String {
        Proxy::url(self, path)
    }
    fn admin_url(&self, path: &str) -> String {
        Proxy::admin_url(self, path)
    }
}

impl Instance for ProxyProcess {
    fn url(&self, path: &str) -> String {
        ProxyProcess::url(self, path)
    }
    fn admin_url(&self, path: &str) -> String {
        ProxyProcess::admin_url(self, path)
    }
}

/// A config on free ports for tests: `[server]` with `server_keys` added, then `body`; with the
/// chosen proxy and admin ports.
fn config_text(server_keys: &str, body: &str) -> (String, u16, u16) {
    let [listen, admin] = free_ports::<2>();
    // No grace period unless the test gives one.
    let grace = if server_keys.contains("grace_period") { "" } else { "grace_period = \"0s\"\n" };
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\nthreads = 2\n{grace}{server_keys}\n{body}"
    );
    (text, listen, admin)
}

/// rangeway as a process of its own: the built binary, run with a config file.
pub(crate) struct ProxyProcess {
    child: std::process::Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    /// The config's `[server]` section, which [`ProxyProcess::rewrite`] keeps.
    server_section: String,
    dir: super::tmp::TempDir,
}

impl ProxyProcess {
    /// Runs `rangeway serve` with `body` (upstreams, routes, state) on free ports and waits until
    /// it listens.
    pub(crate) fn start(body: &str) -> ProxyProcess {
        ProxyProcess::start_with(body, "", &[])
    }

    /// Like [`ProxyProcess::start`], with extra `[server]` keys and environment variables (the
    /// admin token, which rangeway reads from its environment only).
    pub(crate) fn start_with(body: &str, server_keys: &str, env: &[(&str, &str)]) -> ProxyProcess {
        ProxyProcess::spawn(body, server_keys, env, std::process::Stdio::null())
    }

    /// Like [`ProxyProcess::start_with`], writing the process's log (stderr) to `log`.
    pub(crate) fn start_logged(
        body: &str,
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> ProxyProcess {
        ProxyProcess::start_logged_with(body, "", env, log)
    }

    /// Like [`ProxyProcess::start_logged`], with extra `[server]` keys.
    pub(crate) fn start_logged_with(
        body: &str,
        server_keys: &str,
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> ProxyProcess {
        let file = std::fs::File::create(log).expect("create the log file");
        ProxyProcess::spawn(body, server_keys, env, std::process::Stdio::from(file))
    }

    fn spawn(
        body: &str,
        server_keys: &str,
        env: &[(&str, &str)],
        stderr: std::process::Stdio,
    ) -> ProxyProcess {
        let (text, listen, admin) = config_text(server_keys, body);
        let dir = super::tmp::TempDir::new("rangeway-process");
        let config = dir.join("rangeway.toml");
        std::fs::write(&config, &text).expect("write the config");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_rangeway"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .envs(env.iter().copied())
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn rangeway");
        let (proxy, admin) =
            (SocketAddr::from(([127, 0, 0, 1], listen)), SocketAddr::from(([127, 0, 0, 1], admin)));
        for addr in [proxy, admin] {
            super::ports::wait_for_port(addr, std::time::Duration::from_secs(20))
                .expect("rangeway listens");
        }
        let server_section = text[..text.len() - body.len()].to_owned();
        ProxyProcess { child, proxy, admin, server_section, dir }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy)
    }

    pub(crate) fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.proxy
    }

    /// Replaces the config file's upstreams and routes (etc.) with `body`, keeping `[server]`;
    /// the process reads it at its next SIGHUP.
    pub(crate) fn rewrite(&self, body: &str) {
        let text = format!("{}{body}", self.server_section);
        std::fs::write(self.dir.join("rangeway.toml"), text).expect("rewrite the config");
    }

    /// Starts a second rangeway with this one's config and `--upgrade`, logging to `log`: it
    /// takes the listening sockets over once this one gets SIGQUIT.
    pub(crate) fn upgrade(&self, log: &std::path::Path) -> ProxyProcess {
        self.successor(&["--upgrade"], log)
    }

    /// Starts rangeway again with this one's config, once this one has exited, and waits until
    /// it listens; logging to `log`.
    pub(crate) fn restart(&self, log: &std::path::Path) -> ProxyProcess {
        let next = self.successor(&[], log);
        for addr in [next.proxy, next.admin] {
            super::ports::wait_for_port(addr, std::time::Duration::from_secs(20))
                .expect("rangeway listens");
        }
        next
    }

    fn successor(&self, args: &[&str], log: &std::path::Path) -> ProxyProcess {
        let dir = super::tmp::TempDir::new("rangeway-successor");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_rangeway"))
            .arg("serve")
            .arg("--config")
            .arg(self.dir.join("rangeway.toml"))
            .args(args)
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).expect("create the log file"))
            .spawn()
            .expect("spawn rangeway");
        ProxyProcess {
            child,
            proxy: self.proxy,
            admin: self.admin,
            server_section: self.server_section.clone(),
            dir,
        }
    }

    /// The process id, to read its /proc entries.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the process `signal` (`TERM`, `INT`, ...), as `kill -s` does.
    pub(crate) fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args(["-s", signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -s {signal} failed");
    }

    /// Waits up to `within` for the process to exit; its status, or `None` if it still runs.
    pub(crate) fn wait_exit(
        &mut self,
        within: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident and peak memory (KiB) and CPU time (user + system, clock ticks) of process `pid`.
pub(crate) fn usage(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let kib = |key: &str| {
        let line = status.lines().find(|l| l.starts_with(key)).expect("the field");
        line.split_whitespace().nth(1).expect("its value").parse::<u64>().expect("its value")
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let fields: Vec<&str> =
        stat.rsplit_once(')').expect("the stat line").1.split_whitespace().collect();
    let ticks = fields[11].parse::<u64>().expect("the times")
        + fields[12].parse::<u64>().expect("the times");
    (kib("VmRSS:"), kib("VmHWM:"), ticks)
}

/// A rangeway config with a cache of 1 MiB slices in `cache_dir`, at most `max_size`, and a
/// route `/` to `origin`.
pub(crate) fn cache_config(origin: &str, cache_dir: &std::path::Path, max_size: &str) -> String {
    format!(
        "[cache]\ndir = \"{}\"\nslice_size = \"1MiB\"\nmax_size = \"{max_size}\"\n\n\
         [upstreams.origin]\nurl = \"{origin}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        cache_dir.display()
    )
}
