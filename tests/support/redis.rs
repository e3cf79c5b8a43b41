//! Real Redis servers: one on its own, or three masters of a Redis Cluster.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::ports::free_port;
use super::tmp::TempDir;

/// How long a server gets to start listening, and a cluster to agree on its slots; both take
/// well under a second when healthy.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Tries with fresh ports when another process took the chosen one before Redis bound it.
const BIND_ATTEMPTS: usize = 5;

/// The `[state]` key that gives rangeway, with Redis, its download-id key: a file written once per
/// test process, so that every instance a test starts derives the same ids, as one deployment's
/// do. One file for all test processes (they write the same key), in the build's own scratch
/// folder rather than the system's.
pub(crate) fn id_key_line() -> String {
    static FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let file = FILE.get_or_init(|| {
        let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("rangeway-test-id-key");
        std::fs::write(&file, "a-test-download-id-key-of-more-than-32-characters\n")
            .expect("write the id key file");
        file
    });
    format!("id_key_file = {:?}\n", file.display().to_string())
}

/// A running redis-server on 127.0.0.1, without persistence, killed (and waited for) on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// `--cluster-enabled yes` and the cluster bus port, for a cluster node.
    cluster_bus: Option<u16>,
    // The working directory and log; removed after `drop` killed the server.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a standalone server and waits until it answers.
    ///
    /// Panics with the server's log when it does not start.
    pub(crate) fn start() -> RedisServer {
        Self::start_with(false)
    }

    fn start_with(cluster: bool) -> RedisServer {
        for _ in 0..BIND_ATTEMPTS {
            let port = free_port();
            // The cluster bus defaults to port + 10000, which may be taken or past 65535.
            let cluster_bus = cluster.then(free_port);
            let mut server =
                RedisServer { child: None, port, cluster_bus, dir: TempDir::new("redis") };
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("redis-server did not start on port {port}:\n{log}"),
            }
        }
        panic!("redis-server found no free port in {BIND_ATTEMPTS} attempts");
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub(crate) fn url(&self) -> String {
        format!("redis://{}/0", self.addr())
    }

    /// A `[state]` section that puts rangeway's state in this server.
    pub(crate) fn state_section(&self) -> String {
        format!("[state]\nbackend = \"redis\"\nredis_url = \"{}\"\n{}", self.url(), id_key_line())
    }

    /// Kills the server (SIGKILL: no goodbye to its clients) and waits for it to exit.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server (SIGSTOP): its connections stay open, and nothing on them is answered,
    /// as with a server that hangs.
    pub(crate) fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server is running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {} failed", child.id());
    }

    /// Starts the server again on the same port, empty (nothing is persisted). Panics when it does
    /// not start.
    pub(crate) fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.spawn_and_wait() {
            panic!("redis-server did not restart on port {}:\n{log}", self.port);
        }
    }

    /// Runs `redis-cli` against this server and returns its output; panics when it fails.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// The server's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read(self.dir.join("redis.log"))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            // The tests start and kill servers; a protected-mode refusal would only confuse them.
            .args(["--protected-mode", "no"])
            // `DEBUG SLEEP` makes a server that hangs for a while (off by default since 7.0).
            .args(["--enable-debug-command", "yes"]);
        if let Some(bus) = self.cluster_bus {
            command
                .args(["--cluster-enabled", "yes", "--cluster-port", &bus.to_string()])
                .arg("--cluster-config-file")
                .arg(self.dir.join(format!("nodes-{port}.conf")));
        }
        let stderr = File::create(self.dir.join("stderr.log")).map_err(|e| e.to_string())?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn redis-server (run scripts/deps.sh): {err}"));
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// Polls until the server answers PING, checking that it is still alive so that a failed start
    /// reports at once with the reason.
    fn wait_until_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        self.child = None;
                        return Err(format!("redis-server exited with {status}\n{}", self.logs()));
                    }
                    Ok(None) => {}
                    Err(err) => return Err(format!("cannot wait for redis-server: {err}")),
                }
            }
            if TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_ok()
                && try_redis_cli(self.port, &["PING"]).is_some_and(|out| out.trim() == "PONG")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "redis-server did not answer within {START_TIMEOUT:?}\n{}",
                    self.logs()
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn logs(&self) -> String {
        let stderr = std::fs::read(self.dir.join("stderr.log"))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        format!("--- redis.log ---\n{}--- stderr ---\n{stderr}", self.log())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three masters forming a Redis Cluster, no replicas; every node is killed on drop.
#[derive(Debug)]
pub(crate) struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them with `redis-cli --cluster create`, and
    /// waits until every node reports `cluster_state:ok`.
    pub(crate) fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(true)).collect();
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let output = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("spawn redis-cli (run scripts/deps.sh): {err}"));
        let cluster = RedisCluster { nodes };
        if !output.status.success() {
            panic!(
                "redis-cli --cluster create failed ({}):\n{}{}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                cluster.logs()
            );
        }
        cluster.wait_until_ok();
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("redis://{}", n.addr())).collect()
    }

    pub(crate) fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Kills every node.
    pub(crate) fn kill(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }

    /// Starts node `index` again on its port, empty (as [`Self::restart`] does every node), and
    /// waits until the cluster is whole.
    pub(crate) fn restart_node(&mut self, index: usize) {
        self.nodes[index].restart();
        self.wait_until_ok();
    }

    /// Starts every node again on its port; each reads its cluster config back, so the cluster
    /// re-forms with the same slots (and no data). Waits until it is whole.
    pub(crate) fn restart(&mut self) {
        for node in &mut self.nodes {
            node.restart();
        }
        self.wait_until_ok();
    }

    fn wait_until_ok(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        for node in &self.nodes {
            loop {
                let info = try_redis_cli(node.port, &["CLUSTER", "INFO"]).unwrap_or_default();
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    break;
                }
                if Instant::now() >= deadline {
                    panic!(
                        "node {} did not report cluster_state:ok within {START_TIMEOUT:?}:\n\
                         {info}\n{}",
                        node.addr(),
                        self.logs()
                    );
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn logs(&self) -> String {
        self.nodes.iter().map(|n| format!("=== node {} ===\n{}", n.addr(), n.logs())).collect()
    }
}

/// `redis-cli -p PORT ARGS...`; panics when it cannot run or fails.
fn redis_cli(port: u16, args: &[&str]) -> String {
    try_redis_cli(port, args)
        .unwrap_or_else(|| panic!("redis-cli -p {port} {} failed", args.join(" ")))
}

fn try_redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}
