//! Traces and JSON access lines: rangeway (the binary, `[traces]` on) exports its spans over
//! OTLP/HTTP to a receiver in the test that decodes them with the OpenTelemetry project's own
//! protobuf classes (`tests/otlp_receiver.py`, opentelemetry-proto); the origin's request log
//! shows what was propagated; the JSON access line is parsed. Requests come over HTTP/1.1, and
//! over HTTP/2 (curl) and HTTP/3 (aioquic, `tests/h3_client.py`) on a TLS listener.

mod support;

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::clients::{CLIENT_TIMEOUT, run};
use support::data::test_bytes;
use support::h3::aioquic_get;
use support::http::get;
use support::origin::{Behaviour, Origin};
use support::ports::free_port;
use support::proxy::ProxyProcess;
use support::s3::{S3Server, credentials_file};
use support::tls::TestPki;
use support::tmp::TempDir;

const LEN: usize = 1024 * 1024 + 17;
/// The client's own trace, as a browser or an SDK would send it: sampled.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// OTLP's span kinds.
const SERVER: u64 = 2;
const CLIENT: u64 = 3;

/// The OTLP receiver: a Python process, killed on drop.
struct Receiver {
    child: Child,
    port: u16,
    spans: PathBuf,
    _dir: TempDir,
}

impl Receiver {
    fn start() -> Self {
        let dir = TempDir::new("otlp");
        let spans = dir.join("spans.jsonl");
        let mut child = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_receiver.py"))
            .arg(&spans)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the receiver (scripts/deps.sh installs opentelemetry-proto)");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("its stdout");
        BufReader::new(stdout).read_line(&mut line).expect("the receiver's port");
        let port = line.trim().parse().unwrap_or_else(|_| panic!("a port, not {line:?}"));
        Self { child, port, spans, _dir: dir }
    }

    /// `[traces]` sending every request's spans here.
    fn config(&self, sampling: &str) -> String {
        format!(
            "[traces]\nendpoint = \"http://127.0.0.1:{}/v1/traces\"\nsampling = {sampling}\n\
             service_name = \"rangeway-test\"\nresource = {{ \"deployment.environment\" = \"test\" }}\n\n",
            self.port
        )
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).expect("a span as JSON")).collect()
    }

    /// The spans of trace `trace_id`, in the order they began, once its request span and the
    /// spans named in `names` (as often as named) have come.
    fn trace(&self, trace_id: &str, names: &[&str]) -> Vec<Value> {
        let what = format!("a request span and {names:?} of trace {trace_id} at the receiver");
        support::wait::until(&what, Duration::from_secs(20), || {
            let mut spans: Vec<Value> =
                self.spans().into_iter().filter(|s| s["trace_id"] == trace_id).collect();
            let has_request = spans.iter().any(|s| s["name"].as_str().is_some_and(is_request));
            let count = |name: &str| spans.iter().filter(|s| s["name"] == name).count();
            let has_named =
                names.iter().all(|name| count(name) >= names.iter().filter(|n| *n == name).count());
            spans.sort_by_key(|s| s["start"].as_u64());
            (has_request && has_named).then_some(spans)
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_request(name: &str) -> bool {
    name.starts_with("GET ") || name.starts_with("HEAD ")
}

/// Spans are batched for 5 s by default: a test would wait that long for each.
const QUICK_EXPORT: [(&str, &str); 1] = [("OTEL_BSP_SCHEDULE_DELAY", "100")];

fn routes(origin: &Origin) -> String {
    format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n\
         [[routes]]\npath_prefix = \"/plain/\"\nupstream = \"origin\"\nstrip_prefix = true\n\
         upstream_resume = {{ attempts = 3, deadline = \"10s\", backoff = \"700ms\" }}\n\n\
         [[routes]]\npath_prefix = \"/sum/\"\nupstream = \"origin\"\nstrip_prefix = true\n\
         [[routes.middleware]]\nkind = \"checksum\"\n",
        origin.base_url()
    )
}

/// The trace id and parent span id of a `traceparent` value.
fn trace_parent(value: &str) -> (String, String) {
    let fields: Vec<&str> = value.split('-').collect();
    assert_eq!(fields.len(), 4, "a W3C traceparent: {value}");
    assert_eq!((fields[0], fields[3]), ("00", "01"), "version 00, sampled: {value}");
    (fields[1].to_owned(), fields[2].to_owned())
}

/// The access lines in a JSON log.
fn access_lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "rangeway::access")
        .collect()
}

#[test]
fn a_cut_body_and_its_continuation_are_one_trace_with_the_origin_told_of_it() {
    let receiver = Receiver::start();
    let origin = Origin::start();
    let object = test_bytes(LEN, 71);
    origin.put("/obj.bin", object.clone());
    let work = TempDir::new("traces-cut");
    let log = work.join("rangeway.log");
    let body = format!("{}[log]\nformat = \"json\"\n\n{}", receiver.config("0"), routes(&origin));
    let proxy = ProxyProcess::start_logged(&body, &QUICK_EXPORT, &log);
    origin.set_behaviour("/obj.bin", Behaviour::CutAfter(100_000));
    let url = proxy.url("/plain/obj.bin");
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let client = {
        let traceparent = traceparent.clone();
        std::thread::spawn(move || get(&url, &[("traceparent", traceparent.as_str())]))
    };
    // The continuation waits out its backoff: the origin is well again when it is asked.
    support::wait::until("the first request at the origin", Duration::from_secs(10), || {
        (!origin.requests().is_empty()).then_some(())
    });
    origin.clear_behaviour("/obj.bin");
    let got = client.join().expect("the client");
    assert!(got.complete && got.body == object, "the download is whole and exact");

    // The origin was told of the trace on both requests, each its own span.
    let asked = origin.requests();
    assert_eq!(asked.len(), 2, "the first request and its continuation: {asked:?}");
    let told: Vec<(String, String)> = asked
        .iter()
        .map(|r| trace_parent(r.header("traceparent").expect("a traceparent to the origin")))
        .collect();
    assert!(told.iter().all(|(trace, _)| trace == CLIENT_TRACE), "the client's trace: {told:?}");
    assert_ne!(told[0].1, told[1].1, "two spans");
    assert!(told.iter().all(|(_, span)| span != CLIENT_SPAN), "rangeway's own spans");

    // One trace: the request under the client's span, both origin attempts under it, in order,
    // with what each brought.
    let spans = receiver.trace(CLIENT_TRACE, &["origin", "origin", "store.record"]);
    let request = spans.iter().find(|s| s["kind"] == SERVER).expect("the request span");
    assert_eq!(request["parent_span_id"], CLIENT_SPAN, "{request}");
    assert_eq!(request["name"], "GET /plain/", "{request}");
    let attributes = &request["attributes"];
    assert_eq!(attributes["http.response.status_code"], 200, "{request}");
    assert_eq!(attributes["http.response.body.size"], LEN as u64, "{request}");
    assert_eq!(attributes["rangeway.route"], "/plain/", "{request}");
    assert_eq!(attributes["url.path"], "/plain/obj.bin", "{request}");
    assert!(attributes["rangeway.download_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert_eq!(request["resource"]["service.name"], "rangeway-test");
    assert_eq!(request["resource"]["deployment.environment"], "test");
    let attempts: Vec<&Value> = spans.iter().filter(|s| s["name"] == "origin").collect();
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for (attempt, (_, told_span)) in attempts.iter().zip(&told) {
        assert_eq!(attempt["kind"], CLIENT, "{attempt}");
        assert_eq!(attempt["parent_span_id"], request["span_id"], "{attempt}");
        assert_eq!(&attempt["span_id"], told_span.as_str(), "the span the origin was told of");
    }
    let (first, second) = (&attempts[0]["attributes"], &attempts[1]["attributes"]);
    assert_eq!(
        (&first["rangeway.bytes"], &first["rangeway.ended"]),
        (&100_000.into(), &"cut".into())
    );
    assert_eq!(first["http.response.status_code"], 200, "{first}");
    assert_eq!(second["rangeway.bytes"], (LEN - 100_000) as u64, "{second}");
    assert_eq!(
        (&second["rangeway.ended"], &second["rangeway.attempt"]),
        (&"complete".into(), &"range".into())
    );
    assert_eq!(second["http.request.header.range"], format!("bytes=100000-{}", LEN - 1));
    assert_eq!(second["http.response.status_code"], 206, "{second}");
    assert!(attempts[0]["end"].as_u64() <= attempts[1]["start"].as_u64(), "one after the other");
    assert!(spans.iter().any(|s| s["name"] == "store.record"), "{spans:#?}");

    // The access line, as JSON, names the trace.
    let line = support::wait::until("the access line", Duration::from_secs(5), || {
        access_lines(&log).into_iter().find(|l| l["path"] == "/plain/obj.bin")
    });
    assert_eq!(line["trace_id"], CLIENT_TRACE, "{line}");
    assert_eq!((&line["status"], &line["bytes"]), (&200.into(), &(LEN as u64).into()), "{line}");

    // A stage's work is a span of its own; a route's store round trip before the response too.
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let summed = get(&proxy.url("/sum/obj.bin"), &[("traceparent", traceparent)]);
    assert!(summed.complete && summed.body == object);
    let names = ["stages", "store.lookup", "client.write", "origin"];
    let spans = receiver.trace("0af7651916cd43dd8448eb211c80319c", &names);
    let stages = spans.iter().find(|s| s["name"] == "stages").expect("a stages span");
    assert_eq!(stages["attributes"]["rangeway.bytes_in"], LEN as u64, "{stages}");
    assert_eq!(stages["attributes"]["rangeway.bytes_out"], LEN as u64, "{stages}");
    let writes = spans.iter().find(|s| s["name"] == "client.write").expect("a client.write span");
    assert_eq!(writes["attributes"]["rangeway.bytes"], LEN as u64, "{writes}");
    assert!(spans.iter().any(|s| s["name"] == "store.lookup"), "{spans:#?}");
}

#[test]
fn the_share_sampled_decides_only_for_requests_without_a_traceparent() {
    let receiver = Receiver::start();
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(4096, 72));
    let work = TempDir::new("traces-sampling");
    let log = work.join("rangeway.log");
    let body = format!("{}[log]\nformat = \"json\"\n\n{}", receiver.config("0"), routes(&origin));
    let proxy = ProxyProcess::start_logged(&body, &QUICK_EXPORT, &log);
    let url = proxy.url("/plain/a.bin");
    let unsampled = "00-11111111111111111111111111111111-2222222222222222-00";
    let sampled = "00-33333333333333333333333333333333-4444444444444444-01";
    for traceparent in [None, Some(unsampled), Some(sampled)] {
        let headers: Vec<(&str, &str)> = traceparent.iter().map(|t| ("traceparent", *t)).collect();
        assert_eq!(get(&url, &headers).status, 200);
    }
    receiver.trace("33333333333333333333333333333333", &["origin"]);
    let lines = support::wait::until("three access lines", Duration::from_secs(5), || {
        let lines = access_lines(&log);
        (lines.len() >= 3).then_some(lines)
    });
    let ids: Vec<&Value> = lines.iter().map(|l| &l["trace_id"]).collect();
    assert_eq!(ids, [&Value::Null, &Value::Null, &"33333333333333333333333333333333".into()]);
    // Given time to arrive, nothing else did: sampling 0 traced none of the others.
    std::thread::sleep(Duration::from_millis(500));
    let traces: std::collections::BTreeSet<String> =
        receiver.spans().iter().map(|s| s["trace_id"].as_str().unwrap_or("").to_owned()).collect();
    assert_eq!(traces.len(), 1, "{traces:?}");
}

#[test]
fn json_access_lines_carry_every_field_of_the_text_line() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(4096, 73));
    let work = TempDir::new("traces-json");
    let mut lines = Vec::new();
    for format in ["text", "json"] {
        let log = work.join(format!("{format}.log"));
        let body = format!("[log]\nformat = \"{format}\"\n\n{}", routes(&origin));
        let proxy = ProxyProcess::start_logged(&body, &[], &log);
        let ranged = get(&proxy.url("/plain/a.bin"), &[("Range", "bytes=10-19")]);
        assert_eq!(ranged.status, 206);
        let line = support::wait::until("the access line", Duration::from_secs(5), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines().find(|l| l.contains("rangeway::access")).map(str::to_owned)
        });
        lines.push(line);
    }
    let json: Value = serde_json::from_str(&lines[1]).expect("one JSON object per line");
    for key in ["timestamp", "level", "target"] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
    // Every key=value of the text line, with the same value.
    let text = &lines[0];
    let fields = text.split(" rangeway::access: ").nth(1).expect("the text line's fields");
    // A value may hold spaces (`range_served=bytes 10-19/4096`): a word without `=` goes on the
    // value before it.
    let mut pairs: Vec<(String, String)> = Vec::new();
    for word in fields.split(' ') {
        match (word.split_once('='), pairs.last_mut()) {
            (Some((key, value)), _) => pairs.push((key.to_owned(), value.to_owned())),
            (None, Some((_, value))) => {
                value.push(' ');
                value.push_str(word);
            }
            (None, None) => {}
        }
    }
    let seen = pairs.len();
    for (key, value) in &pairs {
        let (key, value) = (key.as_str(), value.as_str());
        let got = &json[key];
        let same = match got {
            // Two runs, two client ports.
            Value::String(s) if key == "client" => s.split(':').next() == value.split(':').next(),
            Value::String(s) => s == value.trim_matches('"'),
            Value::Number(n) => n.as_f64() == value.parse::<f64>().ok() || key.ends_with("_ms"),
            Value::Bool(b) => b.to_string() == value,
            _ => false,
        };
        assert!(same, "{key}: {value} in text, {got} in JSON\n{text}\n{json}");
    }
    assert!(seen >= 12, "the text line has its fields: {text}");
    assert_eq!(json["range_served"], "bytes 10-19/4096");
}

#[test]
fn an_s3_route_still_signs_with_a_traceparent_sent_and_waits_on_fills_are_spans() {
    let receiver = Receiver::start();
    let s3 = S3Server::start();
    s3.bucket("traced");
    let object = test_bytes(LEN, 74);
    s3.put("traced", "obj.bin", &object);
    let work = TempDir::new("traces-s3");
    let credentials = credentials_file(&work, support::s3::ACCESS_KEY, support::s3::SECRET_KEY);
    let origin = Origin::start();
    origin.put_with_headers("/slow.bin", object.clone(), &[("Cache-Control", "max-age=600")]);
    origin.set_behaviour(
        "/slow.bin",
        Behaviour::Slow { chunk: 64 * 1024, delay: Duration::from_millis(20) },
    );
    let cache = work.join("cache");
    let body = format!(
        "{}[cache]\ndir = \"{}\"\nslice_size = \"1MiB\"\nmax_size = \"64MiB\"\n\n\
         [upstreams.store]\nurl = \"{}\"\nbucket = \"traced\"\ncredentials_file = \"{}\"\n\n\
         [upstreams.origin]\nurl = \"{}\"\n\n\
         [[routes]]\npath_prefix = \"/s3/\"\nupstream = \"store\"\nstrip_prefix = true\ncache = false\n\n\
         [[routes]]\npath_prefix = \"/cached/\"\nupstream = \"origin\"\nstrip_prefix = true\n",
        receiver.config("1"),
        cache.display(),
        s3.url(),
        credentials.display(),
        origin.base_url()
    );
    // Each signature is a debug line of the upstream's: one a request, however it is traced.
    let log = work.join("rangeway.log");
    let env = [QUICK_EXPORT[0], ("RUST_LOG", "warn,rangeway::routes::upstream=debug")];
    let proxy = ProxyProcess::start_logged(&body, &env, &log);
    let signatures = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().filter(|line| line.contains("signed an S3 request")).count()
    };

    // s3s-fs checks every signature: the traceparent set on the request does not break it.
    let traceparent = "00-5555555555555555555555555555aaaa-6666666666666666-01";
    let got = get(&proxy.url("/s3/obj.bin"), &[("traceparent", traceparent)]);
    assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
    assert!(got.body == object);
    let ranged = get(
        &proxy.url("/s3/obj.bin"),
        &[("traceparent", traceparent), ("Range", "bytes=1000-1999")],
    );
    assert_eq!((ranged.status, &ranged.body[..]), (206, &object[1000..2000]));
    support::wait::until("the signatures logged", Duration::from_secs(5), || {
        (signatures() >= 2).then_some(())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(signatures(), 2, "two traced S3 requests, each signed once (over its traceparent)");
    let spans = receiver.trace("5555555555555555555555555555aaaa", &["origin", "origin"]);
    let attempt = spans.iter().find(|s| s["name"] == "origin").expect("the S3 request's span");
    assert_eq!(attempt["attributes"]["http.response.status_code"], 200, "{attempt}");

    // A second client of a slice being filled waits on the first's fill: a span of its trace.
    let url = proxy.url("/cached/slow.bin");
    let first = {
        let url = url.clone();
        std::thread::spawn(move || get(&url, &[]))
    };
    support::wait::until("the fill under way", Duration::from_secs(10), || {
        (!origin.requests().iter().all(|r| r.method == "HEAD")).then_some(())
    });
    let waiting = "00-7777777777777777777777777777bbbb-8888888888888888-01";
    let second = get(&url, &[("traceparent", waiting)]);
    assert!(second.body == object && first.join().expect("the first client").body == object);
    let spans = receiver.trace("7777777777777777777777777777bbbb", &["cache.wait"]);
    let wait = spans.iter().find(|s| s["name"] == "cache.wait").expect("a cache.wait span");
    assert!(wait["attributes"]["rangeway.waits"].as_u64() >= Some(1), "{wait}");
    assert!(wait["attributes"]["rangeway.waited_ms"].as_f64() > Some(0.0), "{wait}");
}

/// `[tls]` on `port`, with HTTP/3 on, presenting `pki`'s `localhost` certificate.
fn tls_with_h3(pki: &TestPki, port: u16) -> String {
    let files = pki.localhost();
    format!(
        "[tls]\nlisten = \"127.0.0.1:{port}\"\nh3 = true\n[[tls.certificates]]\n\
         cert_file = \"{}\"\nkey_file = \"{}\"\n\n",
        files.cert.display(),
        files.key.display()
    )
}

/// `url` over HTTP/3 with aioquic (`tests/h3_client.py`), `traceparent` sent; the body goes to
/// `out`, and the answer's status is returned.
fn get_h3(pki: &TestPki, port: u16, path: &str, traceparent: &str, out: &Path) -> u64 {
    let request = serde_json::json!({
        "path": path, "headers": { "traceparent": traceparent }, "out": out,
    });
    aioquic_get(pki, SocketAddr::from(([127, 0, 0, 1], port)), &request)
}

/// `url` over HTTP/2 with curl, `traceparent` sent; the body goes to `out`, and the answer's
/// status is returned.
fn get_h2(pki: &TestPki, port: u16, path: &str, traceparent: &str, out: &Path) -> u64 {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--http2", "-w", "%{http_code}", "-o"]).arg(out).arg("--cacert");
    curl.arg(pki.ca_cert()).args(["-H", &format!("traceparent: {traceparent}")]);
    curl.arg(format!("https://localhost:{port}{path}"));
    let seen = run(curl, CLIENT_TIMEOUT);
    seen.assert_success();
    seen.stdout.trim().parse().unwrap_or_else(|_| panic!("a status: {seen}"))
}

#[test]
fn a_request_over_h3_joins_the_client_s_trace_as_one_over_h2_does() {
    let receiver = Receiver::start();
    let origin = Origin::start();
    let object = test_bytes(LEN, 75);
    origin.put("/obj.bin", object.clone());
    let pki = TestPki::new();
    let port = free_port();
    let work = TempDir::new("traces-h3");
    let log = work.join("rangeway.log");
    let body = format!(
        "{}{}[log]\nformat = \"json\"\n\n{}",
        receiver.config("0"),
        tls_with_h3(&pki, port),
        routes(&origin)
    );
    let _proxy = ProxyProcess::start_logged(&body, &QUICK_EXPORT, &log);
    // Each request its own client trace; the same route, the same object, two protocols.
    type Get = fn(&TestPki, u16, &str, &str, &Path) -> u64;
    let cases: [(&str, Get, &str, &str); 2] = [
        ("HTTP/3.0", get_h3, "9a1b2c3d4e5f60718293a4b5c6d7e8f9", "1122334455667788"),
        ("HTTP/2.0", get_h2, "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "8877665544332211"),
    ];
    for (version, fetch, trace, client_span) in cases {
        let out = work.join(format!("obj-{}", &version[5..6]));
        let traceparent = format!("00-{trace}-{client_span}-01");
        assert_eq!(fetch(&pki, port, "/plain/obj.bin", &traceparent, &out), 200, "{version}");
        assert!(std::fs::read(&out).expect("the body") == object, "{version}: byte for byte");

        // The origin was told of the client's trace, under a span of rangeway's own.
        let told: Vec<(String, String)> = origin
            .requests()
            .iter()
            .filter_map(|r| r.header("traceparent").map(trace_parent))
            .filter(|(told_trace, _)| told_trace == trace)
            .collect();
        assert_eq!(told.len(), 1, "{version}: one origin request in the trace: {told:?}");
        let told_span = &told[0].1;
        assert_ne!(told_span, client_span, "{version}: rangeway's own span");

        // The request span joins the client's trace under the client's span, and says which
        // protocol the request came in; the origin request's span is the one the origin was
        // told of, under it.
        let spans = receiver.trace(trace, &["origin"]);
        let request = spans.iter().find(|s| s["kind"] == SERVER).expect("the request span");
        assert_eq!(request["parent_span_id"], client_span, "{version}: {request}");
        assert_eq!(request["name"], "GET /plain/", "{version}: {request}");
        let attributes = &request["attributes"];
        assert_eq!(attributes["network.protocol.version"], version, "{request}");
        assert_eq!(attributes["http.response.status_code"], 200, "{version}: {request}");
        assert_eq!(attributes["http.response.body.size"], LEN as u64, "{version}: {request}");
        assert_eq!(attributes["url.path"], "/plain/obj.bin", "{version}: {request}");
        assert!(
            attributes["client.address"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")),
            "{version}: {request}"
        );
        let attempt = spans.iter().find(|s| s["name"] == "origin").expect("the origin span");
        assert_eq!(attempt["kind"], CLIENT, "{version}: {attempt}");
        assert_eq!(attempt["parent_span_id"], request["span_id"], "{version}: {attempt}");
        assert_eq!(&attempt["span_id"], told_span.as_str(), "{version}: the span told of");

        // The access line names the protocol and the trace.
        let line = support::wait::until("the access line", Duration::from_secs(5), || {
            access_lines(&log).into_iter().find(|l| l["trace_id"] == trace)
        });
        assert_eq!((&line["version"], &line["status"]), (&version.into(), &200.into()), "{line}");
    }
}
