//! A real nginx serving a directory: the reference origin that rangeway's answers are compared to.

use std::fmt::Write as _;
use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use super::ports::free_port;
use super::tls::TlsFiles;
use super::tmp::TempDir;

/// What [`Nginx::start`] serves.
#[derive(Clone, Debug)]
pub(crate) struct NginxOptions {
    /// Directory served as the document root, with nginx's own static file handling: ranges,
    /// strong ETags (`"<mtime hex>-<size hex>"`), Last-Modified, sendfile.
    pub(crate) root: PathBuf,
    /// Serve HTTPS with this certificate instead of plain HTTP.
    pub(crate) tls: Option<TlsFiles>,
    /// Answer every request with the whole file (`max_ranges 0`), as origins without range
    /// support do.
    pub(crate) ignore_range: bool,
}

impl NginxOptions {
    /// Plain HTTP, ranges supported: nginx as most origins run it.
    pub(crate) fn serving(root: &std::path::Path) -> NginxOptions {
        NginxOptions { root: root.to_owned(), tls: None, ignore_range: false }
    }
}

/// A running nginx, killed (and waited for) on drop.
#[derive(Debug)]
pub(crate) struct Nginx {
    child: Child,
    addr: SocketAddr,
    tls: bool,
    // Holds the config, logs and temp paths; removed with the fields, after `drop` killed nginx.
    dir: TempDir,
}

/// How long nginx gets to start accepting connections; it takes milliseconds when healthy.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Tries with fresh ports when another process took the chosen one before nginx bound it.
const BIND_ATTEMPTS: usize = 5;

impl Nginx {
    /// Starts nginx and waits until it accepts connections.
    ///
    /// Panics with nginx's error log when it does not start.
    pub(crate) fn start(options: NginxOptions) -> Nginx {
        for _ in 0..BIND_ATTEMPTS {
            let dir = TempDir::new("nginx");
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let config = dir.join("nginx.conf");
            std::fs::write(&config, config_text(&dir, addr, &options)).expect("write nginx.conf");
            let stderr = File::create(dir.join("stderr.log")).expect("create nginx stderr log");
            let child = Command::new(nginx_binary())
                .arg("-p")
                .arg(dir.path())
                // -e sets the log for messages before the config is read; nginx 1.22's default
                // is a system path that a non-root user cannot open.
                .arg("-e")
                .arg(dir.join("error.log"))
                .arg("-c")
                .arg(&config)
                .args(["-g", "daemon off;"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|err| panic!("spawn {}: {err}", nginx_binary().display()));
            let mut nginx = Nginx { child, addr, tls: options.tls.is_some(), dir };
            match nginx.wait_until_listening() {
                Ok(()) => return nginx,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("nginx did not start on {addr}:\n{log}"),
            }
        }
        panic!("nginx found no free port in {BIND_ATTEMPTS} attempts");
    }

    /// The address nginx listens on (always 127.0.0.1).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, or with TLS `https://localhost:PORT`: the certificates of
    /// [`super::tls::TestPki`] name `localhost` (and 127.0.0.1, for clients that connect by IP).
    pub(crate) fn base_url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// [`Self::base_url`] followed by `path` (which starts with `/`).
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// nginx's error log so far, for assertions and failure messages.
    pub(crate) fn error_log(&self) -> String {
        read_log(&self.dir.join("error.log"))
    }

    /// The access log so far: one line per finished request, in the format
    /// `METHOD URI STATUS BODY_BYTES "RANGE" "IF-RANGE" "IF-MATCH"` (`"-"` for an absent header),
    /// so tests can see what a proxy asked nginx for.
    pub(crate) fn access_log(&self) -> String {
        read_log(&self.dir.join("access.log"))
    }

    /// Polls for the port while checking that nginx is still alive, so that a broken config fails
    /// at once with the reason rather than after the timeout.
    fn wait_until_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    return Err(format!("nginx exited with {status}\n{}", self.logs()));
                }
                Ok(None) => {}
                Err(err) => return Err(format!("cannot wait for nginx: {err}")),
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "nginx did not listen within {START_TIMEOUT:?}\n{}",
                    self.logs()
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn logs(&self) -> String {
        format!(
            "--- error.log ---\n{}--- stderr ---\n{}",
            self.error_log(),
            read_log(&self.dir.join("stderr.log"))
        )
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // With `master_process off` nginx is this one process, so SIGKILL leaves nothing behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nginx` from PATH, else Debian's /usr/sbin/nginx (not on a normal user's PATH).
fn nginx_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let sbin = Path::new("/usr/sbin/nginx");
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .map(|dir| dir.join("nginx"))
            .find(|candidate| candidate.is_file())
            .or_else(|| sbin.is_file().then(|| sbin.to_path_buf()))
            .expect("nginx not found on PATH or at /usr/sbin/nginx: run scripts/deps.sh")
    })
}

fn config_text(dir: &TempDir, addr: SocketAddr, options: &NginxOptions) -> String {
    let prefix = dir.path().display();
    let mut text = String::new();
    // One process, so a single kill on drop leaves nothing behind. Workers started as root
    // would switch to `nobody`, who may not read the test's files, hence `user root` for root;
    // any other user gets a warning for `user`, so it is left out then.
    text.push_str("master_process off;\n");
    if running_as_root() {
        text.push_str("user root;\n");
    }
    let _ = writeln!(text, "pid {prefix}/nginx.pid;");
    let _ = writeln!(text, "error_log {prefix}/error.log info;");
    text.push_str("events { worker_connections 1024; }\n");
    text.push_str("http {\n");
    let _ = writeln!(
        text,
        "  log_format ranges '$request_method $uri $status $body_bytes_sent \
         \"$http_range\" \"$http_if_range\" \"$http_if_match\"';"
    );
    let _ = writeln!(text, "  access_log {prefix}/access.log ranges;");
    // Every temp path nginx has goes in the prefix: the compiled-in defaults are system
    // directories that a non-root user cannot create.
    for (directive, module) in TEMP_PATHS {
        if module.is_none_or(|module| !built_without(module)) {
            let _ = writeln!(text, "  {directive} {prefix}/{directive};");
        }
    }
    text.push_str(
        "  types {\n    text/html html;\n    text/plain txt;\n    application/json json;\n    \
         application/gzip gz;\n  }\n",
    );
    text.push_str("  default_type application/octet-stream;\n");
    text.push_str("  sendfile on;\n  etag on;\n");
    let _ = writeln!(
        text,
        "  server {{\n    listen {addr}{};\n    server_name localhost;",
        if options.tls.is_some() { " ssl" } else { "" }
    );
    if let Some(tls) = &options.tls {
        let _ = writeln!(text, "    ssl_certificate {};", tls.cert.display());
        let _ = writeln!(text, "    ssl_certificate_key {};", tls.key.display());
    }
    let _ = writeln!(text, "    root {};", options.root.display());
    if options.ignore_range {
        text.push_str("    max_ranges 0;\n");
    }
    text.push_str("    location / { }\n  }\n}\n");
    text
}

/// nginx's temp path directives, with the module that must be built in for each to exist.
const TEMP_PATHS: [(&str, Option<&str>); 5] = [
    ("client_body_temp_path", None),
    ("proxy_temp_path", Some("proxy")),
    ("fastcgi_temp_path", Some("fastcgi")),
    ("uwsgi_temp_path", Some("uwsgi")),
    ("scgi_temp_path", Some("scgi")),
];

/// Whether the nginx binary was configured `--without-http_<module>_module` (lighter builds
/// drop some), in which case the module's directives are unknown and would fail the config.
fn built_without(module: &str) -> bool {
    static CONFIGURE_ARGUMENTS: OnceLock<String> = OnceLock::new();
    CONFIGURE_ARGUMENTS
        .get_or_init(|| {
            let output = Command::new(nginx_binary()).arg("-V").output().expect("run nginx -V");
            // nginx -V prints its configure arguments on stderr.
            String::from_utf8_lossy(&output.stderr).into_owned()
        })
        .contains(&format!("--without-http_{module}_module"))
}

/// The effective uid, read from /proc/self (owned by it) since std does not expose geteuid.
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

fn read_log(path: &Path) -> String {
    std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}
