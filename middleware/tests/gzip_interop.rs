//! The gzip stage's output read by decoders nobody here wrote: the `gzip` tool and Python's gzip
//! and zlib modules (both installed by `scripts/deps.sh`).

use std::path::PathBuf;
use std::process::Command;

use bytes::Bytes;
use rangeway_middleware::chain::{ObjectVersion, StageContext, StageFactory};
use rangeway_middleware::gzip::GzipFactory;

const BLOCK: u64 = 64 << 10;

/// The whole member for `data`, pushed in 10 000-byte chunks.
fn member(level: u32, data: &[u8]) -> Vec<u8> {
    let object =
        ObjectVersion { route: "t", path: "/o", strong_etag: None, len: data.len() as u64 };
    let context = StageContext {
        object: &object,
        input_len: Some(object.len),
        input_identity: "",
        segments: &[],
    };
    let factory = GzipFactory::new(level, BLOCK).expect("a valid configuration");
    let mut stage = factory.start(0, None, &context).expect("starts at 0");
    let mut out = Vec::new();
    for chunk in data.chunks(10_000) {
        out.extend(
            stage.push(Bytes::copy_from_slice(chunk)).expect("compresses").unwrap_or_default(),
        );
    }
    out.extend(stage.finish().expect("finishes").unwrap_or_default());
    out
}

/// A file of its own in the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> Self {
        let path =
            std::env::temp_dir().join(format!("rangeway-gzip-{}-{name}.gz", std::process::id()));
        std::fs::write(&path, bytes).expect("writes the temp file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run(program: &str, args: &[&str]) -> Vec<u8> {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("{program} cannot run ({error}): run scripts/deps.sh"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Python's gzip module, and zlib read as exactly one gzip member with nothing after it.
const PYTHON: &str = "
import gzip, sys, zlib
data = open(sys.argv[1], 'rb').read()
whole = gzip.decompress(data)
reader = zlib.decompressobj(31)
one = reader.decompress(data) + reader.flush()
assert reader.eof and not reader.unused_data, 'not exactly one gzip member'
assert one == whole
sys.stdout.buffer.write(whole)
";

fn text(len: usize) -> Vec<u8> {
    let words = ["resume ", "range ", "the ", "proxy\n", "gzip ", "block ", "bytes "];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(words[(state % words.len() as u64) as usize].as_bytes());
    }
    out.truncate(len);
    out
}

fn binary(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[test]
fn gzip_and_python_decode_the_member() {
    let block = BLOCK as usize;
    let inputs = [
        ("empty", Vec::new()),
        ("one-byte", b"x".to_vec()),
        ("one-block", text(block)),
        ("under-one-block", text(block - 1)),
        ("three-blocks", text(3 * block)),
        ("blocks-and-a-bit", text(3 * block + 17)),
        ("binary", binary(2 * block + 1000)),
    ];
    for level in [0, 1, 6, 9] {
        for (name, data) in &inputs {
            let file = TempFile::new(&format!("{name}-{level}"), &member(level, data));
            let path = file.0.to_str().expect("a UTF-8 temp path");
            run("gzip", &["-t", path]);
            assert!(run("gzip", &["-dc", path]) == *data, "gzip -dc: {name} at level {level}");
            assert!(
                run("python3", &["-c", PYTHON, path]) == *data,
                "python: {name} at level {level}"
            );
        }
    }
}
