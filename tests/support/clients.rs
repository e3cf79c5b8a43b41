//! Real download clients (curl, wget, aria2c) run as the user would, and file digests to compare
//! what they saved.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Long enough for any test download on a loaded 2-core machine; a client that needs longer is
/// hanging, and the run says so instead of blocking the suite.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `command` with `input` on its stdin and returns its stdout; panics, with its stderr, when
/// it fails. For decoders (gzip, python3, `rangeway decrypt`).
pub(crate) fn pipe(command: &mut Command, input: &[u8]) -> Vec<u8> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("spawn {command:?} (scripts/deps.sh installs it): {err}"));
    let mut stdin = child.stdin.take().expect("a piped stdin");
    let input = input.to_vec();
    // A writer of its own: a decoder may fill its stdout before it has read all of its input.
    let writer = thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().expect("wait for the command");
    let _ = writer.join();
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// Lowercase hex SHA-256 of `data`, as `sha256sum` prints it.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// Lowercase hex SHA-256 of the file at `path`, read in pieces so large files need no buffer.
pub(crate) fn sha256_file(path: &Path) -> String {
    let mut file =
        File::open(path).unwrap_or_else(|err| panic!("open {} to hash it: {err}", path.display()));
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => hasher.update(&buffer[..read]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => panic!("read {}: {err}", path.display()),
        }
    }
    hex(&hasher.finalize())
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// Writes the first `len` bytes of `object` to `path`: what an interrupted download left behind,
/// for a client to resume.
pub(crate) fn write_partial(path: &Path, object: &[u8], len: usize) {
    let mut file = File::create(path)
        .unwrap_or_else(|err| panic!("create partial file {}: {err}", path.display()));
    file.write_all(&object[..len])
        .unwrap_or_else(|err| panic!("write partial file {}: {err}", path.display()));
}

/// How a client run ended.
#[derive(Debug)]
pub(crate) struct ClientRun {
    /// The command as run, for failure messages.
    pub(crate) command: String,
    /// `None` when the client was killed for running past its timeout.
    pub(crate) status: Option<ExitStatus>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl ClientRun {
    /// Exited with status 0 in time.
    pub(crate) fn success(&self) -> bool {
        self.status.is_some_and(|status| status.success())
    }

    /// The exit code; `None` when killed (timeout or signal).
    pub(crate) fn code(&self) -> Option<i32> {
        self.status.and_then(|status| status.code())
    }

    /// Panics with the command and its output unless it succeeded.
    #[track_caller]
    pub(crate) fn assert_success(&self) {
        assert!(self.success(), "{self}");
    }
}

impl std::fmt::Display for ClientRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => writeln!(f, "`{}` exited with {status}", self.command)?,
            None => writeln!(f, "`{}` timed out and was killed", self.command)?,
        }
        write!(f, "--- stdout ---\n{}--- stderr ---\n{}", self.stdout, self.stderr)
    }
}

/// Runs `command` to completion, killing it after `timeout`; stdin is empty, stdout and stderr
/// are captured.
pub(crate) fn run(mut command: Command, timeout: Duration) -> ClientRun {
    let description = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("spawn {description} (scripts/deps.sh installs it): {err}"));
    // Drained on threads so a chatty client never blocks on a full pipe while we wait on it.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Err(err) => panic!("wait for {description}: {err}"),
        }
    };
    ClientRun {
        command: description,
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// `curl -sS -C - -o FILE URL`: resumes into `file` from its current length (sends
/// `Range: bytes=LEN-`), or downloads it whole when it does not exist. curl fails with exit code
/// 33 when the server answers a resume with 200 instead of 206.
pub(crate) fn curl_resume(url: &str, file: &Path) -> ClientRun {
    let mut command = Command::new("curl");
    command.args(["-sS", "-C", "-", "-o"]).arg(file).arg(url);
    run(command, CLIENT_TIMEOUT)
}

/// `wget -c -q -O FILE URL`: continues `file` from its current length.
pub(crate) fn wget_resume(url: &str, file: &Path) -> ClientRun {
    let mut command = Command::new("wget");
    command.args(["-c", "-q", "-O"]).arg(file).arg(url);
    run(command, CLIENT_TIMEOUT)
}

/// `aria2c -x8 -s8 -k1M --allow-overwrite=true --auto-file-renaming=false -d DIR -o NAME URL`:
/// up to 8 connections fetching 1 MiB-aligned ranges in parallel into `dir/name` (an object under
/// 2 MiB is fetched on one connection, as aria2c never splits below `-k`).
pub(crate) fn aria2c_download(url: &str, dir: &Path, name: &str) -> ClientRun {
    let mut command = Command::new("aria2c");
    command
        .args(["-x8", "-s8", "-k1M", "--allow-overwrite=true", "--auto-file-renaming=false"])
        .arg("-d")
        .arg(dir)
        .args(["-o", name, url]);
    run(command, CLIENT_TIMEOUT)
}
