//! The aes128gcm stage against an RFC 8188 implementation nobody here wrote: Python's `http_ece`
//! (the `http-ece` package, as `scripts/deps.sh` installs it), run as a process. Rangeway's
//! output must decrypt with it, and rangeway's `Decryptor` must read what it encrypts.
//!
//! The test fails, rather than skips, when `python3` or `http_ece` is missing: run
//! `scripts/deps.sh`.

use std::io::Write as _;
use std::process::{Command, Stdio};

use bytes::Bytes;
use rangeway_middleware::aes128gcm::{
    Aes128GcmFactory, DecryptError, Decryptor, KeySet, parse_key_file,
};
use rangeway_middleware::chain::{ObjectVersion, StageContext, StageFactory};

const KEY16: &str = "AAECAwQFBgcICQoLDA0ODw";
const KEY32: &str = "ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1-f4CBgoM";

/// `python3 -c SCRIPT MODE KEY [KEYID RS SALT_HEX]`: `decrypt` reads an aes128gcm stream on
/// stdin and writes the plaintext; `encrypt` the other way round.
const SCRIPT: &str = r#"
import base64, sys, http_ece
mode, key = sys.argv[1], sys.argv[2]
key = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
data = sys.stdin.buffer.read()
if mode == "decrypt":
    out = http_ece.decrypt(data, key=key, version="aes128gcm")
else:
    keyid, rs, salt = sys.argv[3], int(sys.argv[4]), bytes.fromhex(sys.argv[5])
    out = http_ece.encrypt(data, key=key, keyid=keyid, rs=rs, salt=salt, version="aes128gcm")
sys.stdout.buffer.write(out)
"#;

fn python(args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/deps.sh installs it)");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().expect("python3 finishes");
    writer.join().expect("the writer does not panic").expect("python3 reads its input");
    assert!(
        output.status.success(),
        "http_ece failed (run scripts/deps.sh if it is missing): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

fn sample(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 % 256) as u8).collect()
}

fn keys(text: &str) -> KeySet {
    parse_key_file(text).expect("valid key file")
}

/// The stage's whole output for `data`, fed in uneven chunks.
fn encrypt(factory: &Aes128GcmFactory, data: &[u8]) -> Vec<u8> {
    let object = ObjectVersion {
        route: "interop",
        path: "/object",
        strong_etag: Some("\"v1\""),
        len: data.len() as u64,
    };
    let context = StageContext {
        object: &object,
        input_len: Some(data.len() as u64),
        input_identity: "",
        segments: &[],
    };
    let mut stage = factory.start(0, None, &context).expect("starts at 0");
    let mut out = Vec::new();
    let data = Bytes::copy_from_slice(data);
    let mut at = 0;
    for size in [1, 1000, 7, 65_536].into_iter().cycle() {
        if at == data.len() {
            break;
        }
        let end = (at + size).min(data.len());
        if let Some(bytes) = stage.push(data.slice(at..end)).expect("encrypts") {
            out.extend_from_slice(&bytes);
        }
        at = end;
    }
    if let Some(bytes) = stage.finish().expect("encrypts") {
        out.extend_from_slice(&bytes);
    }
    out
}

fn decrypt(keys: &KeySet, ciphertext: &[u8]) -> Result<Vec<u8>, DecryptError> {
    let mut decryptor = Decryptor::new(keys);
    let mut out = Vec::new();
    for piece in ciphertext.chunks(333) {
        decryptor.push(piece, &mut out)?;
    }
    decryptor.finish(&mut out)?;
    Ok(out)
}

#[test]
fn http_ece_decrypts_what_the_stage_encrypts() {
    let cases = [
        (format!("k1={KEY16}"), KEY16, 100u64),
        (format!("rotated-key.2={KEY32}"), KEY32, 18),
        (KEY16.to_owned(), KEY16, 65_553),
    ];
    for (file, key, record_size) in cases {
        let factory = Aes128GcmFactory::new(&keys(&file), None, record_size).expect("valid");
        let p = record_size as usize - 17;
        let mut lengths = vec![0, 1, p - 1, p, p + 1, 2 * p, 3 * p, 3 * p + 5];
        if record_size == 65_553 {
            lengths.push(1 << 20);
        }
        for len in lengths {
            let data = sample(len);
            let ciphertext = encrypt(&factory, &data);
            assert_eq!(&ciphertext[16..20], &(record_size as u32).to_be_bytes());
            assert_eq!(&ciphertext[21..21 + factory.key_id().len()], factory.key_id().as_bytes());
            let plaintext = python(&["decrypt", key], &ciphertext);
            assert_eq!(
                plaintext,
                data,
                "rs {record_size}, key id {:?}, len {len}",
                factory.key_id()
            );
        }
    }
}

#[test]
fn the_decryptor_reads_what_http_ece_encrypts() {
    let salt = "00112233445566778899aabbccddeeff";
    for (key_id, key, record_size) in
        [("k1", KEY16, 100usize), ("", KEY32, 18), ("k2", KEY16, 4096)]
    {
        let file = if key_id.is_empty() {
            key.to_owned()
        } else {
            format!("other={KEY32}\n{key_id}={key}")
        };
        let keys = keys(&file);
        let p = record_size - 17;
        // Not 0 (p - 1 is, at rs 18): see `an_empty_input_needs_its_last_record`.
        for len in [1, p - 1, p, p + 1, 2 * p, 3 * p + 5, 50_000].into_iter().filter(|&len| len > 0)
        {
            let data = sample(len);
            let ciphertext =
                python(&["encrypt", key, key_id, &record_size.to_string(), salt], &data);
            assert_eq!(
                decrypt(&keys, &ciphertext).expect("http_ece's output decrypts"),
                data,
                "rs {record_size}, key id {key_id:?}, len {len}"
            );
            // And any change to it is caught.
            let mut flipped = ciphertext.clone();
            let last = flipped.len() - 1;
            flipped[last] ^= 0x80;
            assert!(decrypt(&keys, &flipped).is_err());
        }
    }
}

/// http_ece writes an empty input as a header without records. RFC 8188 ends every stream with a
/// record delimited by 0x02, and a header alone cannot be told from a stream cut short after it,
/// so the decryptor refuses it, while the stage writes one empty last record, which http_ece
/// reads.
#[test]
fn an_empty_input_needs_its_last_record() {
    let ciphertext =
        python(&["encrypt", KEY16, "k1", "100", "00112233445566778899aabbccddeeff"], b"");
    assert_eq!(ciphertext.len(), 21 + 2);
    assert_eq!(
        decrypt(&keys(&format!("k1={KEY16}")), &ciphertext),
        Err(DecryptError::Truncated { records: 0 })
    );
    let factory = Aes128GcmFactory::new(&keys(&format!("k1={KEY16}")), None, 100).expect("valid");
    let ours = encrypt(&factory, b"");
    assert_eq!(ours.len(), 21 + 2 + 17);
    assert_eq!(python(&["decrypt", KEY16], &ours), b"");
}
