//! A real S3-compatible server: s3s-fs (installed by scripts/deps.sh), which checks SigV4 with
//! the access key it is started with and keeps buckets as folders of files.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::ports::{free_port, wait_for_port};
use super::tmp::TempDir;

pub(crate) const ACCESS_KEY: &str = "AKIDRANGEWAYTEST";
pub(crate) const SECRET_KEY: &str = "rangeway/test+SECRET+key/0123456789";

/// A running s3s-fs on 127.0.0.1, killed on drop.
pub(crate) struct S3Server {
    child: Child,
    port: u16,
    root: TempDir,
    /// Holds s3s-fs's log; removed with the server.
    _logs: TempDir,
}

impl S3Server {
    /// Starts s3s-fs with [`ACCESS_KEY`]/[`SECRET_KEY`] and waits until it listens.
    pub(crate) fn start() -> S3Server {
        let root = TempDir::new("s3-root");
        let logs = TempDir::new("s3-log");
        let port = free_port();
        let log = std::fs::File::create(logs.join("s3s-fs.log")).expect("s3s-fs log");
        let child = Command::new(s3s_fs())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start s3s-fs (scripts/deps.sh installs it)");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        wait_for_port(addr, Duration::from_secs(20)).expect("s3s-fs listens");
        S3Server { child, port, root, _logs: logs }
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates `bucket` (a folder, as s3s-fs keeps them).
    pub(crate) fn bucket(&self, bucket: &str) {
        std::fs::create_dir_all(self.root.join(bucket)).expect("create the bucket");
    }

    /// Stores `bytes` as `key` of `bucket`, written straight into s3s-fs's folder.
    pub(crate) fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let path = self.object_path(bucket, key);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create folders");
        std::fs::write(path, bytes).expect("write the object");
    }

    pub(crate) fn object_path(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// s3s-fs on PATH, else where `cargo install` puts it.
fn s3s_fs() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|dir| dir.join("s3s-fs")).find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| {
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
            .expect("CARGO_HOME or HOME");
        cargo_home.join("bin/s3s-fs")
    })
}

/// An AWS shared credentials file holding `[default]` with the given key.
pub(crate) fn credentials_file(dir: &TempDir, access: &str, secret: &str) -> PathBuf {
    let path = dir.join("aws-credentials");
    std::fs::write(
        &path,
        format!("[default]\naws_access_key_id = {access}\naws_secret_access_key = {secret}\n"),
    )
    .expect("write the credentials file");
    path
}
