//! One download into `FILE.part`: the first request (which learns the version), the
//! connections that fetch the rest in pieces, checkpoints of the control file, and the running
//! digests. A version change met on the way ends the attempt: the caller starts over.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::answer::{Answer, answer, same_version, version};
use crate::connect::{Connection, Connector};
use crate::control::{Control, Version};
use crate::digest::{Expected, Running, merge};
use crate::error::GetError;
use crate::http1::{Head, Request};
use crate::plan::Plan;
use crate::progress::Progress;
use crate::ranges::RangeSet;
use crate::url::Target;

/// Each connection's read buffer.
const BUFFER: usize = 256 << 10;
/// How often the control file is brought up to date.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(200);
const MAX_REDIRECTS: usize = 10;
/// The first wait after a failure; it doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What every attempt of a download uses.
pub(crate) struct Settings {
    pub(crate) connections: Option<usize>,
    pub(crate) retry_for: Duration,
    /// Sent with every request (User-Agent, X-Download-Id is added per download, the user's).
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) rate: Option<u64>,
}

/// How an attempt ended.
pub(crate) enum Ended {
    /// Every byte of `version` is in the part file; `digests` as the server stated them.
    Complete { target: Target, version: Version, digests: Vec<Expected>, running: Box<Running> },
    /// The object is not the one the part file holds: start over.
    StartOver(String),
}

/// Why a connection stopped.
enum Stop {
    StartOver(String),
    Failed(GetError),
}

/// A request's failure: worth another try, or not.
enum Attempt {
    Transient(String),
    Stop(Stop),
}

/// Downloads into `part` (resuming from `control` when given), drawing `progress`.
pub(crate) fn attempt(
    settings: &Settings,
    connector: &Connector,
    url: &Target,
    (part_path, control_path): (&Path, &Path),
    resume: Option<Control>,
    extra_digests: &[Expected],
    progress: &mut Progress,
) -> Result<Ended, GetError> {
    let local = |e: std::io::Error| GetError::Local(format!("{}: {e}", part_path.display()));
    let download_id = resume.as_ref().map_or_else(new_download_id, |c| c.download_id.clone());
    let mut headers = settings.headers.clone();
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("x-download-id")) {
        headers.push(("X-Download-Id".into(), download_id.clone()));
    }
    if resume.is_none() {
        // An earlier control file goes before the part file is emptied: killed in between, the
        // next run finds no claims to trust, rather than claims about bytes no longer there.
        match std::fs::remove_file(control_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(GetError::Local(format!("{}: {e}", control_path.display())));
            }
            _ => {}
        }
    }
    let part = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(resume.is_none())
        .open(part_path)
        .map_err(local)?;

    // The first request: from byte 0 for a new download, the first missing stretch of a resumed one.
    let (ask, if_range) = match &resume {
        None => ((0, None), None),
        Some(control) => {
            let (start, end) = control
                .done
                .first_gap(0, control.version.length)
                .unwrap_or((0, control.version.length));
            ((start, Some(end)), control.version.validator())
        }
    };
    let deadline = Deadline::new(settings.retry_for);
    let (target, mut connection, head) = loop {
        match exchange(connector, None, url, &headers, ask, if_range, progress) {
            Ok(done) => break done,
            Err(Attempt::Transient(why)) => deadline.wait_or_fail(&why, progress, None)?,
            Err(Attempt::Stop(Stop::Failed(e))) => return Err(e),
            Err(Attempt::Stop(Stop::StartOver(why))) => return Ok(Ended::StartOver(why)),
        }
    };
    let found = answer(&head).map_err(|why| GetError::Server(format!("{target}: {why}")))?;
    let mut digests = extra_digests.to_vec();
    let (version, done, ranged, first) = match (resume, found) {
        (None, Answer::Part { start: 0, end, complete }) => {
            (version(&head, complete), RangeSet::default(), true, (0, end))
        }
        (None, Answer::Whole(length)) => (
            version(&head, length.unwrap_or(u64::MAX)),
            RangeSet::default(),
            false,
            (0, length.unwrap_or(u64::MAX)),
        ),
        (None, Answer::Unsatisfiable(Some(0))) => {
            (version(&head, 0), RangeSet::default(), false, (0, 0))
        }
        (Some(control), Answer::Part { start, end, complete })
            if same_version(&head, &control.version) && complete == control.version.length =>
        {
            if start != ask.0 || end > ask.1.unwrap_or(u64::MAX) {
                return Err(wrong_range(&target, ask, start, end));
            }
            merge(&mut digests, control.digests.clone());
            (control.version, control.done, true, (start, end))
        }
        (Some(_), Answer::Part { .. } | Answer::Whole(_) | Answer::Unsatisfiable(_)) => {
            return Ok(Ended::StartOver(
                "the object changed since the download began (or the server no longer resumes it)"
                    .into(),
            ));
        }
        (None, Answer::Part { start, end, .. }) => {
            return Err(wrong_range(&target, ask, start, end));
        }
        (None, Answer::Unsatisfiable(_)) => {
            return Err(GetError::Server(format!(
                "{target}: 416 to bytes=0- of an object that is not empty"
            )));
        }
    };
    merge(&mut digests, Expected::from_head(&head));
    // Pieces on parallel connections, and resuming at all, need a version each answer can be
    // held to; without one, one connection reads the whole body, and a cut starts it over.
    let ranged = ranged && version.validator().is_some();
    let connections = if ranged { settings.connections.unwrap_or(4) } else { 1 };
    if settings.connections.is_some_and(|n| n > 1) && !ranged {
        progress.say("the server does not resume this object (no Range support or no strong validator): one connection");
    }
    let mut plan = Plan::new(version.length, done, connections);
    if version.length != 0 {
        plan.claim_exact(0, first.0, first.1);
    }
    let session = Session {
        connector,
        target,
        headers,
        version,
        ranged,
        plan: Mutex::new(plan),
        part,
        digests: Mutex::new(digests),
        failure: Mutex::new(None),
        stop: AtomicBool::new(false),
        received: (0..connections).map(|_| AtomicU64::new(0)).collect(),
        pace: settings.rate.map(Pace::new),
        retry_for: settings.retry_for,
    };
    if session.version.length == 0 {
        connection.read_body(&mut [0; 1]).map_err(|e| GetError::Network(e.to_string()))?;
    }
    let checkpoint = |control: &mut Option<(Instant, RangeSet)>| -> Result<(), GetError> {
        if !session.ranged {
            return Ok(());
        }
        let done = lock(&session.plan).done().clone();
        if control.as_ref().is_some_and(|(_, saved)| *saved == done) {
            return Ok(());
        }
        let record = Control {
            url: url.to_string(),
            download_id: download_id.clone(),
            version: session.version.clone(),
            digests: lock(&session.digests).clone(),
            done: done.clone(),
        };
        record
            .save(&session.part, control_path)
            .map_err(|e| GetError::Local(format!("{}: {e}", control_path.display())))?;
        *control = Some((Instant::now(), done));
        Ok(())
    };
    let mut running = Running::default();
    // The digests' read-back buffer, for the whole attempt.
    let mut block = vec![0; 1 << 20];
    let mut saved = None;
    thread::scope(|scope| -> Result<(), GetError> {
        let session = &session;
        // Each connection says when it is done, so the attempt ends then, not at the next tick.
        let (finished, done) = std::sync::mpsc::channel();
        let mut first = Some(connection);
        for worker in 0..connections {
            let (finished, first) = (finished.clone(), first.take());
            scope.spawn(move || {
                session.work(worker, first);
                let _ = finished.send(());
            });
        }
        // A connection that panicked sends nothing, but drops its sender: disconnected.
        drop(finished);
        let mut result = Ok(());
        let mut running_workers = connections;
        while running_workers > 0 {
            match done.recv_timeout(TICK) {
                Ok(()) => running_workers -= 1,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
            let received: Vec<u64> =
                session.received.iter().map(|r| r.load(Ordering::Relaxed)).collect();
            let (got, total) = {
                let plan = lock(&session.plan);
                (plan.done().total(), (plan.len() != u64::MAX).then_some(plan.len()))
            };
            progress.update(got, total, &received);
            if result.is_ok() {
                result = session.hash_on(&mut running, &mut block);
            }
            if result.is_ok()
                && saved
                    .as_ref()
                    .is_none_or(|(at, _): &(Instant, RangeSet)| at.elapsed() >= CHECKPOINT_EVERY)
            {
                result = checkpoint(&mut saved);
            }
            if result.is_err() {
                session.stop.store(true, Ordering::Relaxed);
            }
        }
        result
    })?;
    checkpoint(&mut saved)?;
    progress.end_bar();
    match lock(&session.failure).take() {
        Some(Stop::Failed(e)) => return Err(e),
        Some(Stop::StartOver(why)) => return Ok(Ended::StartOver(why)),
        None => {}
    }
    let mut plan = lock(&session.plan);
    if plan.len() == u64::MAX {
        // A body without a length, read to its end.
        let end = plan.done().prefix_end();
        plan.end_at(end);
    }
    if !plan.is_complete() {
        return Err(GetError::Network(format!("{}: the download stopped short", session.target)));
    }
    let mut version = session.version.clone();
    version.length = plan.len();
    drop(plan);
    session.hash_on(&mut running, &mut block)?;
    let digests = lock(&session.digests).clone();
    Ok(Ended::Complete { target: session.target, version, digests, running: Box::new(running) })
}

fn wrong_range(target: &Target, ask: (u64, Option<u64>), start: u64, end: u64) -> GetError {
    let asked = ask.1.map_or(format!("{}-", ask.0), |end| format!("{}-{}", ask.0, end - 1));
    GetError::Server(format!(
        "{target}: asked for bytes={asked}, the server sent bytes {start}-{}; nothing of it was written",
        end.saturating_sub(1)
    ))
}

/// `get-` and 32 hex digits: the download's id, kept in the control file across resumes.
fn new_download_id() -> String {
    let mut bytes = [0; 16];
    // Without randomness the id is still unique enough to this machine and moment.
    if getrandom::fill(&mut bytes).is_err() {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = (now.as_nanos() ^ u128::from(std::process::id())).to_be_bytes();
    }
    format!("get-{}", crate::digest::to_hex(&bytes))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends a GET for `[start, end)` (`end` `None`: to the object's end), following redirects, and
/// reads the answer's head: the final target, the connection and the head of a 200, 206 or 416.
fn exchange(
    connector: &Connector,
    connection: Option<Connection>,
    url: &Target,
    headers: &[(String, String)],
    (start, end): (u64, Option<u64>),
    if_range: Option<&str>,
    progress: &mut Progress,
) -> Result<(Target, Connection, Head), Attempt> {
    let mut target = url.clone();
    let mut connection = connection;
    let mut headers = headers.to_vec();
    let range = match end {
        Some(end) => format!("bytes={start}-{}", end - 1),
        None => format!("bytes={start}-"),
    };
    headers.push(("Range".into(), range));
    if let Some(validator) = if_range {
        headers.push(("If-Range".into(), validator.to_owned()));
    }
    for _ in 0..=MAX_REDIRECTS {
        let failed = |e: std::io::Error| failure(&target, e);
        let mut conn = match connection.take() {
            Some(conn) => conn,
            None => connector.connect(&target).map_err(failed)?,
        };
        let head = conn
            .send(&Request { method: "GET", target: &target, headers: &headers, body: &[] })
            .map_err(failed)?;
        match head.status {
            200 | 206 | 416 => {
                connector.note_alt_svc(&target, &head);
                return Ok((target, conn, head));
            }
            301 | 302 | 303 | 307 | 308 => {
                let location = head.get("location").ok_or_else(|| {
                    Attempt::Stop(Stop::Failed(GetError::Server(format!(
                        "{target}: a {} without Location",
                        head.status
                    ))))
                })?;
                let next = target
                    .join(location)
                    .map_err(|e| Attempt::Stop(Stop::Failed(GetError::Server(e))))?;
                if (next.host(), next.port()) != (target.host(), target.port()) {
                    // Credentials meant for one host are not handed to another.
                    headers.retain(|(n, _)| {
                        !n.eq_ignore_ascii_case("authorization")
                            && !n.eq_ignore_ascii_case("cookie")
                    });
                }
                progress.say(&format!("redirected to {next}"));
                target = next;
            }
            408 | 429 | 500..=599 => {
                return Err(Attempt::Transient(format!(
                    "{target}: the server answered {}",
                    head.status
                )));
            }
            status => {
                let mut body = vec![0; 512];
                let read = conn.read_body(&mut body).unwrap_or(0);
                let text = String::from_utf8_lossy(&body[..read]).trim().to_owned();
                let detail = if text.is_empty() {
                    String::new()
                } else {
                    format!(": {}", text.lines().next().unwrap_or_default())
                };
                return Err(Attempt::Stop(Stop::Failed(GetError::Refused {
                    url: target.to_string(),
                    status,
                    detail,
                })));
            }
        }
    }
    Err(Attempt::Stop(Stop::Failed(GetError::Server(format!(
        "{url}: more than {MAX_REDIRECTS} redirects"
    )))))
}

/// Whether a failed request is worth another try: not when TLS refused the server (another try
/// meets the same certificate) or the answer did not parse.
fn failure(target: &Target, e: std::io::Error) -> Attempt {
    if e.kind() != std::io::ErrorKind::InvalidData {
        return Attempt::Transient(format!("{target}: {e}"));
    }
    let tls = e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
    Attempt::Stop(Stop::Failed(if tls {
        GetError::Network(format!("{target}: TLS: {e}"))
    } else {
        GetError::Server(format!("{target}: {e}"))
    }))
}

/// How long failures may go on without a byte received.
struct Deadline {
    limit: Duration,
    since: Mutex<(Instant, u32)>,
}

impl Deadline {
    fn new(limit: Duration) -> Self {
        Self { limit, since: Mutex::new((Instant::now(), 0)) }
    }

    /// Bytes arrived: failures start counting again.
    fn progressed(&self) {
        *lock(&self.since) = (Instant::now(), 0);
    }

    /// Waits before the next try, or fails when failures have gone on past the limit.
    fn wait_or_fail(
        &self,
        why: &str,
        progress: &mut Progress,
        stop: Option<&AtomicBool>,
    ) -> Result<(), GetError> {
        let (since, failures) = {
            let mut since = lock(&self.since);
            since.1 += 1;
            *since
        };
        if since.elapsed() >= self.limit {
            return Err(GetError::Network(format!(
                "{why} (failing for {} s, --retry-for)",
                since.elapsed().as_secs()
            )));
        }
        let backoff = FIRST_BACKOFF.saturating_mul(1 << failures.min(8)).min(MAX_BACKOFF);
        if failures == 1 {
            progress.say(&format!("{why}: trying again"));
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
        }
        Ok(())
    }
}

/// An aggregate rate for all connections: each waits until the bytes read so far are due.
struct Pace {
    rate: u64,
    state: Mutex<(Instant, u64)>,
}

impl Pace {
    fn new(rate: u64) -> Self {
        Self { rate: rate.max(1), state: Mutex::new((Instant::now(), 0)) }
    }

    fn take(&self, bytes: u64) {
        let due = {
            let mut state = lock(&self.state);
            // After a pause (retries), the rate starts again rather than bursting to catch up.
            let (start, sent) = *state;
            let owed = start + Duration::from_secs_f64(sent as f64 / self.rate as f64);
            if owed + Duration::from_secs(1) < Instant::now() {
                *state = (Instant::now(), 0);
            }
            state.1 += bytes;
            state.0 + Duration::from_secs_f64(state.1 as f64 / self.rate as f64)
        };
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
    }
}

/// What the connections of one attempt share.
struct Session<'a> {
    connector: &'a Connector,
    target: Target,
    headers: Vec<(String, String)>,
    version: Version,
    /// Pieces and resumes are possible (ranges honoured, a validator to pin them).
    ranged: bool,
    plan: Mutex<Plan>,
    part: File,
    digests: Mutex<Vec<Expected>>,
    /// The first reason the attempt stops.
    failure: Mutex<Option<Stop>>,
    stop: AtomicBool,
    /// Bytes each connection received.
    received: Vec<AtomicU64>,
    pace: Option<Pace>,
    retry_for: Duration,
}

impl Session<'_> {
    /// One connection's work: its pieces until none are left, or the attempt stops.
    fn work(&self, worker: usize, first: Option<Connection>) {
        let mut progress = Progress::new(true, false);
        let mut connection = first;
        // The first request was made already: its body is the claim's.
        let mut body_open = connection.is_some();
        let deadline = Deadline::new(self.retry_for);
        let mut buffer = vec![0; BUFFER];
        while !self.stop.load(Ordering::Relaxed) {
            let claim = {
                let mut plan = lock(&self.plan);
                match plan.claim(worker) {
                    Some(claim) => claim,
                    None => match plan.take(worker) {
                        Some(claim) => claim,
                        None => return,
                    },
                }
            };
            if !body_open {
                let ask = (claim.next(), Some(claim.end()).filter(|&end| end != u64::MAX));
                let reuse = connection.take().filter(Connection::reusable);
                match exchange(
                    self.connector,
                    reuse,
                    &self.target,
                    &self.headers,
                    ask,
                    self.version.validator(),
                    &mut progress,
                ) {
                    Ok((_, conn, head)) => match self.check_piece(&head, ask) {
                        Ok(()) => {
                            connection = Some(conn);
                            body_open = true;
                        }
                        Err(stop) => return self.fail(worker, stop),
                    },
                    Err(Attempt::Transient(why)) => {
                        if let Err(e) = deadline.wait_or_fail(&why, &mut progress, Some(&self.stop))
                        {
                            return self.fail(worker, Stop::Failed(e));
                        }
                        continue;
                    }
                    Err(Attempt::Stop(stop)) => return self.fail(worker, stop),
                }
            }
            let Some(conn) = connection.as_mut() else { continue };
            match self.read_piece(worker, conn, &mut buffer, &deadline) {
                Ok(Piece::BodyEnded) if !self.ranged => {
                    // A whole body read to its end: where it ended is the object's length.
                    let mut plan = lock(&self.plan);
                    let end = plan.claim(worker).map_or(0, |claim| claim.next());
                    if plan.len() == u64::MAX {
                        plan.end_at(end);
                    }
                    plan.release(worker);
                    return;
                }
                Ok(Piece::BodyEnded) => body_open = false,
                Ok(Piece::ClaimEnded { body_left }) => {
                    body_open = false;
                    if body_left {
                        connection = None;
                    }
                }
                Err(why) => {
                    connection = None;
                    body_open = false;
                    if !self.ranged {
                        return self.fail(
                            worker,
                            Stop::StartOver(format!(
                                "{why}, and the server cannot resume this object"
                            )),
                        );
                    }
                    if let Err(e) = deadline.wait_or_fail(&why, &mut progress, Some(&self.stop)) {
                        return self.fail(worker, Stop::Failed(e));
                    }
                }
            }
        }
    }

    /// A piece's answer must be the range asked for, of this version.
    fn check_piece(&self, head: &Head, (start, end): (u64, Option<u64>)) -> Result<(), Stop> {
        let found = answer(head)
            .map_err(|why| Stop::Failed(GetError::Server(format!("{}: {why}", self.target))))?;
        match found {
            Answer::Part { start: got, end: got_end, complete }
                if same_version(head, &self.version) && complete == self.version.length =>
            {
                if got != start || end.is_some_and(|end| got_end > end) {
                    return Err(Stop::Failed(wrong_range(
                        &self.target,
                        (start, end),
                        got,
                        got_end,
                    )));
                }
                merge(&mut lock(&self.digests), Expected::from_head(head));
                Ok(())
            }
            Answer::Whole(_) if !self.ranged && start == 0 => Ok(()),
            _ => Err(Stop::StartOver("the object changed during the download".into())),
        }
    }

    /// Reads the open body into the file at the claim's next byte until the claim or the body
    /// ends.
    fn read_piece(
        &self,
        worker: usize,
        connection: &mut Connection,
        buffer: &mut [u8],
        deadline: &Deadline,
    ) -> Result<Piece, String> {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(Piece::ClaimEnded { body_left: true });
            }
            let read = connection.read_body(buffer).map_err(|e| format!("{}: {e}", self.target))?;
            if read == 0 {
                return Ok(Piece::BodyEnded);
            }
            deadline.progressed();
            self.received[worker].fetch_add(read as u64, Ordering::Relaxed);
            let (at, own) = lock(&self.plan).accept(worker, read as u64);
            let mut claim_over = own == 0;
            if own > 0 {
                if let Err(e) = self.part.write_all_at(&buffer[..own as usize], at) {
                    self.fail(
                        worker,
                        Stop::Failed(GetError::Local(format!("writing the part file: {e}"))),
                    );
                    return Ok(Piece::ClaimEnded { body_left: true });
                }
                claim_over = lock(&self.plan).written(worker, at, at + own);
            }
            if let Some(pace) = &self.pace {
                pace.take(read as u64);
            }
            if own < read as u64 || claim_over {
                let body_left = own < read as u64 || !connection.reusable();
                return Ok(Piece::ClaimEnded { body_left });
            }
        }
    }

    fn fail(&self, worker: usize, stop: Stop) {
        lock(&self.plan).release(worker);
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            *failure = Some(stop);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Feeds the running digests the bytes on disk from where they stopped to the end of the
    /// run from byte 0 (read back from the page cache: pieces arrive out of order). Starts
    /// them once a digest is known.
    fn hash_on(&self, running: &mut Running, block: &mut [u8]) -> Result<(), GetError> {
        if running.is_idle() {
            let digests = lock(&self.digests);
            if digests.is_empty() {
                return Ok(());
            }
            *running = Running::for_expected(digests.iter());
        }
        let until = lock(&self.plan).done().prefix_end();
        running
            .feed_from(&self.part, until, block)
            .map_err(|e| GetError::Local(format!("reading the part file back: {e}")))
    }
}

enum Piece {
    /// The body ended; the claim may go on (the server sent less than asked).
    BodyEnded,
    /// The claim is done (or was cut short by a steal); `body_left`: the connection still has
    /// body bytes coming and cannot be used again.
    ClaimEnded { body_left: bool },
}
