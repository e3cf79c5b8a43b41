//! The aes128gcm decryptor (`rangeway decrypt`) on arbitrary input, and on the stage's own output
//! with bytes flipped, cut or added.
//!
//! Input: one control byte (record size and mutation), then data. Checks: no panic anywhere;
//! arbitrary bytes never decrypt to anything (they would need a forged tag); the stage's output
//! decrypts to its input; a changed one never decrypts to anything else: it fails, having given
//! out only a prefix of the input, or (a changed record size in the header, which RFC 8188 does
//! not authenticate, where no record boundary moves) decrypts to the very input.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rangeway_middleware::aes128gcm::{Aes128GcmFactory, Decryptor, parse_key_file};
use rangeway_middleware::chain::{ObjectVersion, StageContext, StageFactory};

const KEYS: &str = "fz=AAECAwQFBgcICQoLDA0ODw\n";

fuzz_target!(|input: &[u8]| {
    let Some((&control, data)) = input.split_first() else { return };
    let keys = parse_key_file(KEYS).expect("a valid key file");

    // Arbitrary bytes: never a plaintext byte out.
    let mut out = Vec::new();
    let mut decryptor = Decryptor::new(&keys);
    let pushed = decryptor.push(data, &mut out);
    let finished = pushed.and_then(|()| decryptor.finish(&mut out));
    // Arbitrary bytes would need a forged AES-GCM tag to decrypt: no plaintext comes out.
    assert!(finished.is_err() && out.is_empty(), "arbitrary bytes decrypted");

    // The stage's own output, then changed.
    let record_size = 18 + u64::from(control % 64);
    let stage = Aes128GcmFactory::new(&keys, None, record_size).expect("a valid record size");
    let object = ObjectVersion { route: "fuzz", path: "/f", strong_etag: Some("\"e\""), len: data.len() as u64 };
    let context = StageContext { object: &object, input_len: Some(object.len), input_identity: "", segments: &[] };
    let mut run = stage.start(0, None, &context).expect("starts at 0");
    let mut ciphertext = Vec::new();
    for piece in data.chunks(usize::from(control % 7) + 1) {
        if let Some(out) = run.push(Bytes::copy_from_slice(piece)).expect("encrypts") {
            ciphertext.extend_from_slice(&out);
        }
    }
    if let Some(tail) = run.finish().expect("finishes") {
        ciphertext.extend_from_slice(&tail);
    }
    assert_eq!(decrypt(&keys, &ciphertext).expect("its own output decrypts"), data);

    let mut changed = ciphertext.clone();
    match control >> 6 {
        0 if !changed.is_empty() => {
            let at = usize::from(control) % changed.len();
            changed[at] ^= 1 << (control % 8);
        }
        1 => changed.truncate(changed.len().saturating_sub(usize::from(control % 32) + 1)),
        2 => changed.push(control),
        _ => return,
    }
    let mut partial = Vec::new();
    let mut decryptor = Decryptor::new(&keys);
    let result =
        decryptor.push(&changed, &mut partial).and_then(|()| decryptor.finish(&mut partial));
    assert!(data.starts_with(&partial), "only authenticated plaintext came out");
    assert!(result.is_err() || partial == data, "a changed stream decrypted to other bytes");
});

fn decrypt(
    keys: &rangeway_middleware::aes128gcm::KeySet,
    ciphertext: &[u8],
) -> Result<Vec<u8>, rangeway_middleware::aes128gcm::DecryptError> {
    let mut out = Vec::new();
    let mut decryptor = Decryptor::new(keys);
    decryptor.push(ciphertext, &mut out)?;
    decryptor.finish(&mut out)?;
    Ok(out)
}
