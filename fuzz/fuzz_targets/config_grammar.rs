//! The config loader on TOML made from the real keys, so that the fuzzer spends its time in
//! validation (upstreams, routes, middleware options, cross-references) rather than in the TOML
//! parser's syntax errors, which `config_load` covers.
//!
//! Input: a stream of choices; each byte picks whether a key is written and which of a few
//! values, valid and not, it gets (or, now and then, a string made of the next bytes). Checks:
//! those of `check_config_text`, and that no secret is ever echoed: the password planted in Redis
//! URLs and upstream URLs appears in no reported problem and in no accepted config's `Debug`.
#![no_main]

use std::fmt::Write as _;

use libfuzzer_sys::fuzz_target;

/// The password written into URLs; it must come out nowhere.
const SECRET: &str = "s3cr3t-pw";

/// Values as TOML text, the first of each list a valid one (so that the fuzzer finds configs that
/// load, and goes on from them). `{SECRET}` in a URL is replaced by the password.
const LISTEN: &[&str] = &[
    "\"127.0.0.1:0\"",
    "\"127.0.0.1:8080\"",
    "\"127.0.0.1:9090\"",
    "\"0.0.0.0:9090\"",
    "\"[::1]:8080\"",
    "\"[::]:9090\"",
    "\"127.0.0.1:0\"",
    "\"localhost:8080\"",
    "\"127.0.0.1:65536\"",
    "\"8080\"",
    "8080",
    "\"\"",
];
const THREADS: &[&str] = &["1", "4", "0", "1024", "1025", "-1", "\"4\"", "4.0"];
const DURATIONS: &[&str] = &[
    "\"30s\"",
    "\"0s\"",
    "\"1ms\"",
    "\"1h\"",
    "\"2h\"",
    "\"5m\"",
    "\"301s\"",
    "\"24h\"",
    "\"365d\"",
    "\"366d\"",
    "\"1h30m\"",
    "\"500ms\"",
    "\"0.5s\"",
    "30",
    "\"30\"",
    "\"-1s\"",
    "\"\"",
];
const MAX_RANGES: &[&str] =
    &["16", "1", "1000", "1001", "0", "-5", "\"16\"", "99999999999999999999"];
/// Variables every environment has, one that is surely unset, and names that are not names.
const ENV_NAMES: &[&str] =
    &["\"PATH\"", "\"RANGEWAY_FUZZ_UNSET\"", "\"1ABC\"", "\"\"", "\"A-B\"", "\"HOME\""];
const BACKENDS: &[&str] = &["\"memory\"", "\"redis\"", "\"mem\"", "\"Redis\"", "1"];
const REDIS_URLS: &[&str] = &[
    "\"redis://127.0.0.1:6379/0\"",
    "\"redis://:{SECRET}@127.0.0.1:6379/1\"",
    "\"rediss://user:{SECRET}@cache.example.com/2\"",
    "\"redis+cluster://:{SECRET}@a:7000,b:7001\"",
    "[\"redis://a:7000\", \"redis://:{SECRET}@b:7001\"]",
    "[\"redis://a:7000\", \"rediss://b:7001\"]",
    "[]",
    "\"redis://:{SECRET}@host:99999/0\"",
    "\"redis://:{SECRET}@host/99999999999\"",
    "\"http://:{SECRET}@host/\"",
    "\"redis://host/0?password={SECRET}\"",
    "\"redis://host/0#{SECRET}\"",
    "\"redis://[::1]/0\"",
    "\"redis://\"",
    "\"\"",
];
const KEY_PREFIXES: &[&str] = &["\"rangeway:\"", "\"\"", "\"a b\"", "\"x\\u0000\"", "7"];
const UPSTREAM_NAMES: &[&str] = &["origin", "local", "Origin", "s3", "\"bad name\"", "\"\""];
const URLS: &[&str] = &[
    "\"https://s3.example.com/bucket\"",
    "\"http://127.0.0.1:9000\"",
    "\"https://s3.example.com/bucket/\"",
    "\"https://[::1]:8443/b\"",
    "\"https://10.0.0.1\"",
    "\"http://user:{SECRET}@origin.example.com/\"",
    "\"https://:{SECRET}@origin.example.com\"",
    "\"http://origin.example.com/a?x={SECRET}\"",
    "\"http://origin.example.com/a#{SECRET}\"",
    "\"ftp://origin.example.com\"",
    "\"http://\"",
    "\"http://h:0\"",
    "\"http://h:65536\"",
    "\"http://bad_host!/\"",
    "\"HTTP://Origin.Example.COM:80/%41\"",
    "\"\"",
    "3",
];
/// Every path here is safe to open and read: none blocks (a FIFO, a terminal would).
/// `/dev/zero`, which never ends, is checked to be refused without being read whole.
const DIRS: &[&str] =
    &["\"./data\"", "\"/nonexistent/fuzz\"", "\"/etc/hostname\"", "\"/tmp\"", "\"\""];
const CA_FILES: &[&str] = &[
    "\"/etc/ssl/certs/ca-certificates.crt\"",
    "\"/etc/hostname\"",
    "\"/nonexistent.pem\"",
    "\"/etc\"",
    "\"/dev/zero\"",
    "\"\"",
];
const BOOLS: &[&str] = &["true", "false", "\"true\"", "1"];
const HOSTS: &[&str] = &[
    "\"dl.example.com\"",
    "\"DL.Example.com\"",
    "\"127.0.0.1\"",
    "\"[::1]\"",
    "\"dl.example.com:8080\"",
    "\"bad host\"",
    "\"\"",
];
const PATH_PREFIXES: &[&str] = &[
    "\"/files/\"",
    "\"/files\"",
    "\"/\"",
    "\"/a/b/\"",
    "\"files/\"",
    "\"/a/../b\"",
    "\"/a//b\"",
    "\"/%41\"",
    "\"/a\\\\b\"",
    "\"/./\"",
    "\"/a b\"",
    "\"/ü/\"",
    "\"\"",
];
const ROUTE_UPSTREAMS: &[&str] =
    &["\"origin\"", "\"local\"", "\"orign\"", "\"s3\"", "\"Origin\"", "1"];
const KINDS: &[&str] = &["\"checksum\"", "\"gzip\"", "\"aes128gcm\"", "\"gzp\"", "\"\"", "7"];
const ALGORITHMS: &[&str] = &[
    "[\"sha256\", \"crc32\"]",
    "[\"sha256\"]",
    "[\"crc32\", \"crc32\"]",
    "[\"md5\"]",
    "[]",
    "\"sha256\"",
    "[1]",
];
const SIZES: &[&str] = &[
    "4096",
    "4095",
    "1048576",
    "67108864",
    "67108865",
    "65553",
    "17",
    "18",
    "0",
    "-1",
    "\"1MiB\"",
    "1.5",
    "18446744073709551615",
];
const LEVELS: &[&str] = &["0", "6", "9", "10", "-1", "\"6\""];
const MODES: &[&str] = &["\"representation\"", "\"content-encoding\"", "\"gzip\"", "true"];
const KEY_FILES: &[&str] = &[
    concat!("\"", env!("CARGO_MANIFEST_DIR"), "/fixtures/fuzz.keys\""),
    "\"/nonexistent/keys\"",
    "\"/etc/hostname\"",
    "\"/etc\"",
    "\"/dev/zero\"",
];
const KEY_IDS: &[&str] = &["\"fz\"", "\"other\"", "\"\""];
/// Keys no stage or section takes.
const UNKNOWN: &[&str] = &["colour", "kind", "url", "listne", "level", "table"];
const ANY: &[&str] = &["1", "\"x\"", "true", "nan", "[1, \"a\"]", "{ a = 1, b = 2.5 }"];

/// The choices, read from the fuzzer's bytes; zeros once they run out. A zero byte always picks
/// what loads (a key present, the first value of its list, one table), so that the fuzzer starts
/// from a valid config and its mutations each break or change one thing.
struct Choices<'a> {
    bytes: &'a [u8],
    /// How many times the password was written.
    planted: usize,
}

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.bytes.split_first() else { return 0 };
        self.bytes = rest;
        first
    }

    fn present(&mut self) -> bool {
        self.byte() % 4 != 3
    }

    fn index(&mut self, len: usize) -> usize {
        usize::from(self.byte()) % len
    }

    /// How many tables of a kind: mostly one, sometimes none or several.
    fn count(&mut self) -> usize {
        [1, 2, 0, 3][self.index(4)]
    }

    /// Half the time the first of `values`, else another one, or a string made of the next bytes.
    fn value(&mut self, values: &[&str]) -> String {
        let byte = self.byte();
        let pick = match byte.checked_sub(128) {
            None => Some(0),
            Some(other) => usize::from(other).checked_rem(values.len()).filter(|&pick| pick > 0),
        };
        match pick.and_then(|pick| values.get(pick)) {
            Some(value) => {
                self.planted += value.matches("{SECRET}").count();
                value.replace("{SECRET}", SECRET)
            }
            None => {
                let len = self.index(24);
                let raw: Vec<u8> = (0..len).map(|_| self.byte()).collect();
                toml_string(&String::from_utf8_lossy(&raw))
            }
        }
    }

    /// `key = value` when chosen.
    fn field(&mut self, out: &mut String, key: &str, values: &[&str]) {
        if self.present() {
            let value = self.value(values);
            let _ = writeln!(out, "{key} = {value}");
        }
    }

    /// Now and then a key the table does not take.
    fn unknown(&mut self, out: &mut String) {
        if self.index(8) == 7 {
            let key = UNKNOWN[self.index(UNKNOWN.len())];
            let value = ANY[self.index(ANY.len())];
            let _ = writeln!(out, "{key} = {value}");
        }
    }
}

/// A TOML basic string holding `text`.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn config_text(choices: &mut Choices<'_>) -> String {
    let mut out = String::new();
    if choices.present() {
        out.push_str("[server]\n");
        choices.field(&mut out, "listen", LISTEN);
        choices.field(&mut out, "admin_listen", LISTEN);
        choices.field(&mut out, "threads", THREADS);
        choices.field(&mut out, "grace_period", DURATIONS);
        choices.field(&mut out, "max_ranges", MAX_RANGES);
        choices.field(&mut out, "admin_token_env", ENV_NAMES);
        choices.unknown(&mut out);
    }
    if choices.present() {
        out.push_str("\n[state]\n");
        choices.field(&mut out, "backend", BACKENDS);
        choices.field(&mut out, "redis_url", REDIS_URLS);
        choices.field(&mut out, "ttl", DURATIONS);
        choices.field(&mut out, "key_prefix", KEY_PREFIXES);
        choices.unknown(&mut out);
    }
    // Distinct names: a table written twice is a TOML syntax error, which `config_load` covers.
    let first_name = choices.index(UPSTREAM_NAMES.len());
    for offset in 0..choices.count() {
        let name = UPSTREAM_NAMES[(first_name + offset) % UPSTREAM_NAMES.len()];
        let _ = writeln!(out, "\n[upstreams.{name}]");
        match choices.index(4) {
            0 => choices.field(&mut out, "dir", DIRS),
            1 | 2 => {
                let _ = writeln!(out, "url = {}", choices.value(URLS));
                choices.field(&mut out, "ca_file", CA_FILES);
                choices.field(&mut out, "insecure_skip_verify", BOOLS);
                choices.field(&mut out, "sni", HOSTS);
                choices.field(&mut out, "host_header", HOSTS);
            }
            _ => {
                choices.field(&mut out, "url", URLS);
                choices.field(&mut out, "dir", DIRS);
            }
        }
        for key in ["connect_timeout", "read_timeout", "write_timeout", "idle_timeout"] {
            choices.field(&mut out, key, DURATIONS);
        }
        choices.unknown(&mut out);
    }
    for _ in 0..choices.count() {
        out.push_str("\n[[routes]]\n");
        choices.field(&mut out, "path_prefix", PATH_PREFIXES);
        choices.field(&mut out, "host", HOSTS);
        choices.field(&mut out, "upstream", ROUTE_UPSTREAMS);
        choices.field(&mut out, "strip_prefix", BOOLS);
        choices.unknown(&mut out);
        match choices.index(4) {
            2 => {}
            3 => out.push_str("middleware = []\n"),
            _ => {
                for _ in 0..choices.count() {
                    middleware(choices, &mut out);
                }
            }
        }
    }
    out
}

fn middleware(choices: &mut Choices<'_>, out: &mut String) {
    out.push_str("  [[routes.middleware]]\n");
    let kind = choices.index(KINDS.len());
    if choices.present() {
        let _ = writeln!(out, "kind = {}", KINDS[kind]);
    }
    match KINDS[kind] {
        "\"checksum\"" => {
            choices.field(out, "algorithms", ALGORITHMS);
            choices.field(out, "checkpoint_interval", SIZES);
        }
        "\"gzip\"" => {
            choices.field(out, "level", LEVELS);
            choices.field(out, "block_size", SIZES);
            choices.field(out, "mode", MODES);
        }
        _ => {
            // One source of the key, the other, both (refused) or none (refused).
            match choices.index(4) {
                0 => choices.field(out, "key_file", KEY_FILES),
                1 => choices.field(out, "key_env", ENV_NAMES),
                2 => {
                    choices.field(out, "key_file", KEY_FILES);
                    choices.field(out, "key_env", ENV_NAMES);
                }
                _ => {}
            }
            choices.field(out, "key_id", KEY_IDS);
            choices.field(out, "record_size", SIZES);
        }
    }
    choices.unknown(out);
}

fuzz_target!(|input: &[u8]| {
    let mut choices = Choices { bytes: input, planted: 0 };
    let text = config_text(&mut choices);
    let shown = match rangeway_fuzz::check_config_text(&text) {
        Ok(config) => format!("{config:?}"),
        Err(errors) => errors.to_string(),
    };
    // Only the password the grammar planted: one that the free strings spell out by chance may
    // be echoed legitimately (a path prefix is quoted in its own error).
    if text.matches(SECRET).count() == choices.planted {
        assert!(!shown.contains(SECRET), "a secret shown: {shown}");
    }
});
