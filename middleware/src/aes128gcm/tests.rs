use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::chain::{Chain, ConfigError, Learned, ObjectVersion, OptionValue, StageRegistry};

/// Key bytes 0..16 and 100..132, in base64url: distinctive enough to search messages for.
const KEY16: &str = "AAECAwQFBgcICQoLDA0ODw";
const KEY32: &str = "ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1-f4CBgoM";

fn key16_bytes() -> Vec<u8> {
    (0u8..16).collect()
}

const OBJECT: ObjectVersion<'static> =
    ObjectVersion { route: "test", path: "/object", strong_etag: Some("\"v1\""), len: 0 };
const UNPINNED: ObjectVersion<'static> = ObjectVersion { strong_etag: None, ..OBJECT };

fn object(len: u64) -> ObjectVersion<'static> {
    ObjectVersion { len, ..OBJECT }
}

fn context<'a>(object: &'a ObjectVersion<'a>, input_len: Option<u64>) -> StageContext<'a> {
    StageContext { object, input_len, input_identity: "", segments: &[] }
}

fn keys(text: &str) -> KeySet {
    parse_key_file(text).expect("test key files are valid")
}

fn factory(record_size: u32) -> Aes128GcmFactory {
    Aes128GcmFactory::new(&keys(&format!("k1={KEY16}")), None, record_size.into())
        .expect("valid configuration")
}

/// `data` cut at `cuts` (taken modulo its length), in order.
fn pieces(data: &[u8], cuts: &[usize]) -> Vec<Bytes> {
    let data = Bytes::copy_from_slice(data);
    let mut bounds: Vec<usize> = cuts.iter().map(|&cut| cut % (data.len() + 1)).collect();
    bounds.extend([0, data.len()]);
    bounds.sort_unstable();
    bounds.windows(2).map(|pair| data.slice(pair[0]..pair[1])).collect()
}

/// One pass of the stage over `data` from input byte `at` on, told the whole input length or
/// not.
fn encrypt_from(
    factory: &Aes128GcmFactory,
    object: &ObjectVersion<'_>,
    input_len: Option<u64>,
    at: u64,
    data: &[u8],
    cuts: &[usize],
) -> Result<Vec<u8>, StageError> {
    let mut stage = factory.start(at, None, &context(object, input_len))?;
    let mut out = Vec::new();
    for piece in pieces(data, cuts) {
        if let Some(bytes) = stage.push(piece)? {
            out.extend_from_slice(&bytes);
        }
    }
    if let Some(bytes) = stage.finish()? {
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}

/// The whole output for `data`, as the object `data.len()` bytes long.
fn encrypt(factory: &Aes128GcmFactory, data: &[u8]) -> Vec<u8> {
    let object = object(data.len() as u64);
    encrypt_from(factory, &object, Some(data.len() as u64), 0, data, &[]).expect("encrypts")
}

fn decrypt(keys: &KeySet, ciphertext: &[u8], cuts: &[usize]) -> Result<Vec<u8>, DecryptError> {
    let mut decryptor = Decryptor::new(keys);
    let mut out = Vec::new();
    for piece in pieces(ciphertext, cuts) {
        decryptor.push(&piece, &mut out)?;
    }
    decryptor.finish(&mut out)?;
    Ok(out)
}

fn expected_len(header: u64, data: u64, len: u64) -> u64 {
    header + len + 17 * len.div_ceil(data).max(1)
}

fn sample(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

// RFC 8188 section 3.1: "I am the walrus", rs 4096, no key id, one record.
const RFC_3_1_KEY: &str = "yqdlZ-tYemfogSmv7Ws5PQ";
const RFC_3_1_SALT: &str = "I1BsxtFttlv3u_Oo94xnmw";
const RFC_3_1_OUTPUT: &str =
    "I1BsxtFttlv3u_Oo94xnmwAAEAAA-NAVub2qFgBEuQKRapoZu-IxkIva3MEB1PD-ly8Thjg";
// RFC 8188 section 3.2: the same text in records of rs 25, with key id "a1" and padding.
const RFC_3_2_KEY: &str = "BO3ZVPxUlnLORbVGMpbT1Q";
const RFC_3_2_OUTPUT: &str = "uNCkWiNYzKTnBN9ji3-qWAAAABkCYTHOG8chz_gnvgOqdGYovxyjuqRyJFjEDyoF1Fvkj6hQPdPHI51OEUKEpgz3SsLWIqS_uA";

fn unbase64(text: &str) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(text).unwrap()
}

#[test]
fn record_crypto_reproduces_the_rfc_8188_example() {
    let salt: [u8; SALT_LEN] = unbase64(RFC_3_1_SALT).try_into().unwrap();
    let key = ContentKey::derive(&unbase64(RFC_3_1_KEY), &salt);
    let mut out = header(&salt, 4096, b"");
    let at = out.len();
    out.extend_from_slice(b"I am the walrus\x02");
    let tag = key.seal(0, &mut out[at..]).unwrap();
    out.extend_from_slice(&tag);
    assert_eq!(out, unbase64(RFC_3_1_OUTPUT));
}

#[test]
fn the_decryptor_reads_the_rfc_8188_examples() {
    let walrus = decrypt(&keys(RFC_3_1_KEY), &unbase64(RFC_3_1_OUTPUT), &[5, 30]).unwrap();
    assert_eq!(walrus, b"I am the walrus");
    // Several records, a key id and padding.
    let records =
        decrypt(&keys(&format!("a1={RFC_3_2_KEY}")), &unbase64(RFC_3_2_OUTPUT), &[1, 22, 40])
            .unwrap();
    assert_eq!(records, b"I am the walrus");
}

#[test]
fn lengths_at_record_edges_round_trip_with_the_stated_length() {
    for record_size in [18u32, 19, 100, DEFAULT_RECORD_SIZE] {
        let factory = factory(record_size);
        let data = u64::from(record_size) - 17;
        let p = data as usize;
        let mut lengths = vec![0, 1, p - 1, p, p + 1, 2 * p, 3 * p, 5 * p + 3];
        if record_size == DEFAULT_RECORD_SIZE {
            lengths.push(3 << 20);
        }
        for len in lengths {
            let input = sample(len);
            let output = encrypt(&factory, &input);
            let header = 21 + 2;
            assert_eq!(
                output.len() as u64,
                expected_len(header, data, len as u64),
                "rs {record_size}, len {len}"
            );
            assert_eq!(
                factory.output_len(len as u64, &context(&object(len as u64), None)),
                Some(output.len() as u64)
            );
            assert_eq!(&output[16..20], &record_size.to_be_bytes());
            assert_eq!(&output[20..23], b"\x02k1");
            assert_eq!(decrypt(&keys(&format!("k1={KEY16}")), &output, &[7, 1000]).unwrap(), input);
        }
    }
}

#[test]
fn an_empty_input_is_one_record_holding_the_last_delimiter() {
    let factory = factory(DEFAULT_RECORD_SIZE);
    let output = encrypt(&factory, b"");
    assert_eq!(output.len(), 23 + 17);
    // Without the length too: finish alone tells the record is the last.
    let unknown = encrypt_from(&factory, &object(0), None, 0, b"", &[]).unwrap();
    assert_eq!(unknown, output);
    let salt: [u8; SALT_LEN] = output[..16].try_into().unwrap();
    let mut record = output[23..].to_vec();
    let (plaintext, tag) = record.split_at_mut(1);
    ContentKey::derive(&key16_bytes(), &salt).open(0, plaintext, &tag.try_into().unwrap()).unwrap();
    assert_eq!(plaintext, [LAST_DELIMITER]);
}

#[test]
fn the_salt_pins_the_version_and_the_layout() {
    let data = sample(300);
    let base = encrypt(&factory(100), &data);
    // Same version, another factory from the same configuration: the same bytes.
    assert_eq!(encrypt(&factory(100), &data), base);
    let salt = |factory: &Aes128GcmFactory, object: ObjectVersion<'_>, identity: &str| {
        let context = StageContext { input_identity: identity, ..context(&object, Some(300)) };
        derived_salt(&factory.key, &factory.key_id, factory.record_size, &context)
    };
    let reference = salt(&factory(100), object(300), "");
    assert_eq!(&base[..16], &reference);
    let others = [
        salt(&factory(100), ObjectVersion { route: "other", ..object(300) }, ""),
        salt(&factory(100), ObjectVersion { path: "/other", ..object(300) }, ""),
        salt(&factory(100), ObjectVersion { strong_etag: Some("\"v2\""), ..object(300) }, ""),
        salt(&factory(100), object(301), ""),
        salt(&factory(100), object(300), "gzip(6)"),
        salt(&factory(101), object(300), ""),
        // Fields moved across a boundary must not encode alike.
        salt(&factory(100), ObjectVersion { route: "tes", path: "t/object", ..object(300) }, ""),
    ];
    for (index, other) in others.iter().enumerate() {
        assert_ne!(other, &reference, "variation {index}");
    }
    let other_key = Aes128GcmFactory::new(&keys(&format!("k1={KEY32}")), None, 100).unwrap();
    assert_ne!(salt(&other_key, object(300), ""), reference);
}

#[test]
fn without_a_strong_etag_only_the_whole_output_is_produced() {
    let factory = factory(100);
    let data = sample(500);
    let object = ObjectVersion { len: 500, ..UNPINNED };
    let context = context(&object, Some(500));
    let one = encrypt_from(&factory, &object, Some(500), 0, &data, &[]).unwrap();
    let two = encrypt_from(&factory, &object, Some(500), 0, &data, &[]).unwrap();
    assert_ne!(one[..16], two[..16], "a random salt per response");
    let keys = keys(&format!("k1={KEY16}"));
    assert_eq!(decrypt(&keys, &one, &[]).unwrap(), data);
    assert_eq!(decrypt(&keys, &two, &[]).unwrap(), data);

    let total = one.len() as u64;
    let whole = factory.plan(ByteRange::whole(total), 500, &context).unwrap();
    assert_eq!(whole, StagePlan { input: ByteRange::whole(500), skip: 0 });
    for range in [ByteRange::new(0, 10), ByteRange::new(200, total), ByteRange::new(0, total - 1)] {
        let error = factory.plan(range.unwrap(), 500, &context).unwrap_err();
        assert!(matches!(error, StageError::Plan { .. }), "{error:?}");
        assert!(error.to_string().contains("no strong ETag"), "{error}");
    }
    let error = factory.start(83, None, &context).unwrap_err();
    assert!(matches!(error, StageError::Resume { offset: 83, .. }), "{error:?}");
    assert!(error.to_string().contains("no strong ETag"), "{error}");
}

#[test]
fn passes_start_only_at_record_boundaries_and_without_states() {
    let factory = factory(100);
    let version = object(500);
    let at = |at_input, version: &ObjectVersion<'_>| {
        factory.start(at_input, None, &context(version, Some(version.len))).map(|_| ())
    };
    assert!(at(83, &version).is_ok());
    let error = at(84, &version).unwrap_err();
    assert!(error.to_string().contains("not a record boundary"), "{error}");
    let error = at(581, &version).unwrap_err();
    assert!(error.to_string().contains("past the last record"), "{error}");
    // An input of exactly two records has no record at its end; an empty one has its one.
    let error = at(166, &object(166)).unwrap_err();
    assert!(error.to_string().contains("past the last record"), "{error}");
    assert!(at(0, &object(0)).is_ok());
    let state = StageState::new(0, Bytes::from_static(b"x"));
    assert!(factory.start(0, Some(&state), &context(&version, Some(500))).is_err());
}

#[test]
fn a_pass_refuses_input_past_its_length_and_an_end_inside_a_record() {
    let factory = factory(100);
    let object = object(100);
    let error = encrypt_from(&factory, &object, Some(100), 0, &sample(101), &[]).unwrap_err();
    assert!(error.to_string().contains("runs past its 100 bytes"), "{error}");
    let error = encrypt_from(&factory, &object, Some(100), 0, &sample(90), &[]).unwrap_err();
    assert!(error.to_string().contains("inside record 1"), "{error}");
    // Ending at a record boundary is the end of a planned part, not an error.
    let part = encrypt_from(&factory, &object, Some(100), 0, &sample(83), &[]).unwrap();
    assert_eq!(part.len(), 23 + 100);
}

#[test]
fn an_unknown_length_holds_back_one_record_until_more_input_or_the_end() {
    let factory = factory(100);
    let data = sample(83 * 2);
    let object = object(data.len() as u64);
    let mut stage = factory.start(0, None, &context(&object, None)).unwrap();
    // A whole record could be the last: nothing is out yet, not even the header.
    assert_eq!(stage.push(Bytes::copy_from_slice(&data[..83])).unwrap(), None);
    let first = stage.push(Bytes::copy_from_slice(&data[83..84])).unwrap().unwrap();
    assert_eq!(first.len(), 23 + 100);
    assert_eq!(stage.push(Bytes::copy_from_slice(&data[84..])).unwrap(), None);
    let last = stage.finish().unwrap().unwrap();
    assert_eq!(last.len(), 100);
    assert_eq!([first, last].concat(), encrypt(&factory, &data));
    assert_eq!(stage.finish().unwrap(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the chunking and whether the length is known, the output is the same bytes, of
    /// the stated length, and decrypts to the input.
    #[test]
    fn any_chunking_gives_the_same_bytes_which_decrypt(
        data in proptest::collection::vec(any::<u8>(), 0..2000),
        record_size in prop::sample::select(vec![18u32, 19, 40, 100, 1000]),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        decrypt_cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let factory = factory(record_size);
        let len = data.len() as u64;
        let object = object(len);
        let known = encrypt_from(&factory, &object, Some(len), 0, &data, &cuts).unwrap();
        let unknown = encrypt_from(&factory, &object, None, 0, &data, &cuts).unwrap();
        prop_assert_eq!(&known, &unknown);
        prop_assert_eq!(&known, &encrypt(&factory, &data));
        prop_assert_eq!(
            known.len() as u64,
            expected_len(23, u64::from(record_size) - 17, len)
        );
        let keys = keys(&format!("k1={KEY16}"));
        prop_assert_eq!(decrypt(&keys, &known, &decrypt_cuts).unwrap(), data);
    }

    /// A pass started at any record boundary gives exactly the output from that record on.
    #[test]
    fn a_pass_from_any_record_continues_the_whole_output(
        data in proptest::collection::vec(any::<u8>(), 1..1500),
        record_size in prop::sample::select(vec![18u32, 19, 100]),
        record in any::<u64>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let factory = factory(record_size);
        let p = u64::from(record_size) - 17;
        let len = data.len() as u64;
        let at = record % len.div_ceil(p) * p;
        let whole = encrypt(&factory, &data);
        let part = encrypt_from(&factory, &object(len), Some(len), at, &data[at as usize..], &cuts)
            .unwrap();
        // The pass from byte 0 writes the header too.
        let from = if at == 0 { 0 } else { 23 + at / p * u64::from(record_size) };
        prop_assert_eq!(&part[..], &whole[from as usize..]);
    }
}

/// Writes a key file that is removed once the returned guard drops.
struct TempFile(PathBuf);

impl TempFile {
    fn new(contents: &str) -> Self {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "rangeway-aes128gcm-{}-{}.key",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents).expect("temp dir is writable");
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("temp paths are UTF-8")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A chain of one `aes128gcm` stage of `record_size`, built by the registry from a key file
/// that is gone by the time it runs.
fn chain(record_size: u32, before: Option<&str>) -> Chain {
    let file = TempFile::new(&format!("# rotation\nold={KEY32}\nk1={KEY16}\n"));
    let options = StageOptions::new()
        .with("key_file", file.path())
        .with("key_id", "k1")
        .with("record_size", i64::from(record_size));
    let none = StageOptions::new();
    let stages: Vec<(&str, &StageOptions)> =
        before.map(|kind| (kind, &none)).into_iter().chain([(KIND, &options)]).collect();
    StageRegistry::new().build_chain(stages).unwrap()
}

fn run_chain(chain: &Chain, wanted: ByteRange, origin: &[u8], cuts: &[usize]) -> Vec<u8> {
    let object = object(origin.len() as u64);
    let plan = chain.plan(wanted, &object, &Learned::new()).unwrap();
    let range = plan.origin();
    let input = &origin[range.start() as usize..range.end() as usize];
    let mut run = chain.start(&plan, &object, &Learned::new(), &[]).unwrap();
    let mut out = Vec::new();
    for piece in pieces(input, cuts) {
        if let Some(bytes) = run.push(piece).unwrap() {
            out.extend_from_slice(&bytes);
        }
    }
    if let Some(bytes) = run.finish().unwrap() {
        out.extend_from_slice(&bytes);
    }
    assert!(run.is_done());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any range of the output, planned and run by a registry-built chain, is exactly that
    /// slice of the whole output, which decrypts to the origin.
    #[test]
    fn chain_ranges_equal_slices_of_the_whole_output(
        origin in proptest::collection::vec(any::<u8>(), 0..700),
        record_size in prop::sample::select(vec![18u32, 19, 40, 100]),
        ends in (any::<u64>(), any::<u64>()),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        with_checksum in any::<bool>(),
    ) {
        let chain = chain(record_size, with_checksum.then_some("checksum"));
        let object = object(origin.len() as u64);
        let total = chain.output_len(&object, &Learned::new()).unwrap();
        let full = run_chain(&chain, ByteRange::whole(total), &origin, &cuts);
        prop_assert_eq!(full.len() as u64, total);
        prop_assert_eq!(decrypt(&keys(&format!("k1={KEY16}")), &full, &[]).unwrap(), origin.clone());
        let (a, b) = (ends.0 % (total + 1), ends.1 % (total + 1));
        let wanted = ByteRange::new(a.min(b), a.max(b)).unwrap();
        let got = run_chain(&chain, wanted, &origin, &cuts);
        prop_assert_eq!(&got[..], &full[a.min(b) as usize..a.max(b) as usize]);
    }
}

#[test]
fn every_single_byte_of_small_outputs_is_planned_right() {
    for (record_size, len) in [(18u32, 0usize), (18, 3), (19, 4), (100, 0), (100, 83), (100, 166)] {
        let chain = chain(record_size, None);
        let origin = sample(len);
        let object = object(len as u64);
        let total = chain.output_len(&object, &Learned::new()).unwrap();
        let full = run_chain(&chain, ByteRange::whole(total), &origin, &[]);
        for at in 0..total {
            let one = run_chain(&chain, ByteRange::new(at, at + 1).unwrap(), &origin, &[]);
            assert_eq!(one, [full[at as usize]], "rs {record_size}, len {len}, byte {at}");
        }
    }
}

#[test]
fn plans_cover_the_records_a_range_touches() {
    // rs 100: P = 83, header 23; record i at 23 + 100 i, input 83 i.
    let factory = factory(100);
    let object = object(300);
    let context = context(&object, Some(300));
    let plan = |start, end| factory.plan(ByteRange::new(start, end).unwrap(), 300, &context);
    let total = factory.output_len(300, &context).unwrap();
    assert_eq!(total, 23 + 300 + 4 * 17);
    // Inside the header: record 0, from the header on.
    assert_eq!(plan(5, 6).unwrap(), StagePlan { input: ByteRange::new(0, 83).unwrap(), skip: 5 });
    // Record 1 and 2.
    assert_eq!(
        plan(123, 323).unwrap(),
        StagePlan { input: ByteRange::new(83, 249).unwrap(), skip: 0 }
    );
    // The short last record.
    assert_eq!(
        plan(total - 1, total).unwrap(),
        StagePlan { input: ByteRange::new(249, 300).unwrap(), skip: total - 1 - 323 }
    );
    assert!(matches!(plan(0, total + 1), Err(StageError::Plan { .. })));
    assert_eq!(factory.output_len(u64::MAX, &context), None);
}

fn tamper_cases(ciphertext: &[u8], record_size: usize) -> Vec<(&'static str, Vec<u8>)> {
    let header = 23;
    let records: Vec<&[u8]> = ciphertext[header..].chunks(record_size).collect();
    let join = |order: &[usize]| {
        let mut out = ciphertext[..header].to_vec();
        order.iter().for_each(|&index| out.extend_from_slice(records[index]));
        out
    };
    let mut trailing = ciphertext.to_vec();
    trailing.push(0);
    vec![
        ("dropped record", join(&[0, 2, 3])),
        ("reordered records", join(&[1, 0, 2, 3])),
        ("last record dropped", join(&[0, 1, 2])),
        ("last record repeated", join(&[0, 1, 2, 3, 3])),
        ("truncated inside a record", ciphertext[..ciphertext.len() - 5].to_vec()),
        ("truncated inside the header", ciphertext[..10].to_vec()),
        ("trailing garbage", trailing),
    ]
}

#[test]
fn tampered_streams_do_not_decrypt() {
    let factory = factory(100);
    let data = sample(300);
    let ciphertext = encrypt(&factory, &data);
    let keys = keys(&format!("k1={KEY16}"));
    for (name, stream) in tamper_cases(&ciphertext, 100) {
        assert!(decrypt(&keys, &stream, &[]).is_err(), "{name}");
        assert!(decrypt(&keys, &stream, &[1, 50, 150, 260]).is_err(), "{name}, chunked");
    }
    // Every flipped bit of every byte, header included.
    for at in 0..ciphertext.len() {
        let mut flipped = ciphertext.clone();
        flipped[at] ^= 1 << (at % 8);
        assert!(decrypt(&keys, &flipped, &[]).is_err(), "byte {at}");
    }
    assert!(matches!(
        decrypt(&keys, &ciphertext[..23 + 200], &[]),
        Err(DecryptError::Truncated { records: 2 })
    ));
    assert_eq!(decrypt(&keys, &ciphertext, &[]).unwrap(), data);
}

#[test]
fn a_failed_decryptor_stays_failed() {
    let ciphertext = encrypt(&factory(100), &sample(300));
    let keys = keys(&format!("k1={KEY16}"));
    let mut decryptor = Decryptor::new(&keys);
    let mut out = Vec::new();
    let mut bad = ciphertext.clone();
    bad[30] ^= 1;
    assert_eq!(
        decryptor.push(&bad[..123], &mut out),
        Err(DecryptError::Authentication { record: 0 })
    );
    assert!(out.is_empty(), "nothing unauthenticated is released");
    assert_eq!(decryptor.push(&ciphertext[123..], &mut out), Err(DecryptError::Failed));
    assert_eq!(decryptor.finish(&mut out), Err(DecryptError::Failed));
}

#[test]
fn the_decryptor_picks_the_key_the_header_names() {
    let file = format!("old={KEY32}\nk1={KEY16}\n");
    let ciphertext = encrypt(&factory(100), &sample(50));
    assert_eq!(decrypt(&keys(&file), &ciphertext, &[]).unwrap(), sample(50));
    let error = decrypt(&keys(&format!("k2={KEY16}")), &ciphertext, &[]).unwrap_err();
    assert_eq!(error, DecryptError::UnknownKeyId("k1".to_owned()));
    assert!(error.to_string().contains("\"k1\""), "{error}");
    // The right id with the wrong key.
    let error = decrypt(&keys(&format!("k1={KEY32}")), &ciphertext, &[]).unwrap_err();
    assert_eq!(error, DecryptError::Authentication { record: 0 });
}

#[test]
fn key_files_hold_one_bare_key_or_several_with_ids() {
    let padded = URL_SAFE.encode(key16_bytes());
    assert!(padded.ends_with("=="));
    let bare = keys(&format!("  {padded}  \n\n"));
    assert_eq!(bare.ids().collect::<Vec<_>>(), [""]);
    let several = keys(&format!("# comment\nk1={KEY16}\n k2 = {padded}\nthird={KEY32}\n"));
    assert_eq!(several.ids().collect::<Vec<_>>(), ["k1", "k2", "third"]);
    assert_eq!(several.get(b"k2").unwrap().bytes(), key16_bytes());
    assert_eq!(several.get(b"k1").unwrap().fingerprint(), bare.first().1.fingerprint());
    assert_ne!(several.get(b"third").unwrap().fingerprint(), bare.first().1.fingerprint());
    assert!(several.get(b"k3").is_none());

    let long_id = "i".repeat(256);
    let cases = [
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        ("k1=not*base64", "line 1: the key is not base64url"),
        ("k1=AAECAwQFBgcICQoLDA0O", "line 1: the key is 15 bytes"),
        (&format!("k1={KEY16}\nk1={KEY32}") as &str, "line 2: key id \"k1\" is used twice"),
        (&format!("{KEY16}\nk1={KEY32}"), "line 2: a key without an id must be the only key"),
        (&format!("k1={KEY32}\n{KEY16}"), "line 2: a key without an id must be the only key"),
        (&format!("{long_id}={KEY16}"), "line 1: the key id must be 1 to 255"),
        (&format!("k\u{e9}={KEY16}"), "line 1: the key id must be"),
        (&format!("={KEY16}"), "line 1: the key id must be"),
    ];
    for (text, message) in cases {
        let error = parse_key_file(text).unwrap_err().to_string();
        assert!(error.contains(message), "{text:?}: {error}");
        assert!(!error.contains(KEY16) && !error.contains(KEY32), "{error}");
    }
}

/// A key file path that names something endless (a device) or huge is refused after
/// `MAX_KEY_FILE_LEN` bytes, not read until memory runs out; one key padded to just that length
/// still reads.
#[test]
fn key_files_are_read_up_to_a_bound() {
    let limit = usize::try_from(keys::MAX_KEY_FILE_LEN).unwrap();
    let at_limit = format!("{KEY16}{}", "\n".repeat(limit - KEY16.len()));
    let fits = TempFile::new(&at_limit);
    assert_eq!(read_key_file(fits.0.as_path()).unwrap().ids().count(), 1);
    let over = TempFile::new(&format!("{at_limit}\n"));
    let error = read_key_file(over.0.as_path()).unwrap_err();
    assert!(matches!(error, KeyError::TooLarge), "{error}");
    if cfg!(unix) {
        let error = read_key_file(std::path::Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(error, KeyError::TooLarge), "{error}");
    }
}

#[test]
fn generated_keys_are_random_16_byte_base64url_keys() {
    let one = generate_key().unwrap();
    let two = generate_key().unwrap();
    assert_ne!(*one, *two);
    assert_eq!(one.len(), 22);
    assert_eq!(unbase64(&one).len(), 16);
    assert!(parse_key_file(&one).is_ok());
}

/// Builds from options with an environment of one variable, `RANGEWAY_TEST_KEY`.
fn build(options: &StageOptions, env_value: Option<&str>) -> Result<Aes128GcmFactory, Vec<String>> {
    Aes128GcmFactory::from_options_with_env(options, |name| match (name, env_value) {
        ("RANGEWAY_TEST_KEY", Some(value)) => Ok(value.to_owned()),
        _ => Err(std::env::VarError::NotPresent),
    })
    .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

#[test]
fn options_read_the_key_from_the_environment_or_a_file() {
    let env = StageOptions::new().with("key_env", "RANGEWAY_TEST_KEY");
    let factory = build(&env, Some(KEY16)).unwrap();
    assert_eq!((factory.key_id(), factory.record_size()), ("", DEFAULT_RECORD_SIZE));
    let file = TempFile::new(&format!("a={KEY32}\nb={KEY16}\n"));
    let options = StageOptions::new().with("key_file", file.path()).with("record_size", 1000);
    let first = build(&options, None).unwrap();
    assert_eq!((first.key_id(), first.record_size()), ("a", 1000));
    let second = build(&options.clone().with("key_id", "b"), None).unwrap();
    assert_eq!(second.key_id(), "b");
    assert_eq!(second.key.fingerprint(), factory.key.fingerprint());
    assert!(build(&env.clone().with("record_size", 18), Some(KEY16)).is_ok());
}

#[test]
fn bad_options_are_all_reported_by_key_without_key_material() {
    let file = TempFile::new(&format!("a={KEY32}\nb={KEY16}\n"));
    let bad_file = TempFile::new(&format!("a={KEY16}\nb=AAECAwQFBgcICQoLDA0O\n"));
    let missing = std::env::temp_dir().join("rangeway-aes128gcm-no-such.key");
    let missing = missing.to_str().unwrap();
    let env = || StageOptions::new().with("key_env", "RANGEWAY_TEST_KEY");
    let cases: Vec<(StageOptions, Option<&str>, Vec<&str>)> = vec![
        (StageOptions::new(), None, vec!["key_env: no key — set `key_env`"]),
        (
            env().with("key_file", file.path()),
            Some(KEY16),
            vec!["key_file: `key_env` is set too — keep only one"],
        ),
        (env(), None, vec!["key_env: environment variable RANGEWAY_TEST_KEY is not set"]),
        (
            env(),
            Some("%%%"),
            vec![
                "key_env: environment variable RANGEWAY_TEST_KEY: line 1: the key is not base64url",
            ],
        ),
        (
            env(),
            Some(&KEY32[..40]),
            vec![
                "key_env: environment variable RANGEWAY_TEST_KEY: line 1: the key is 30 bytes — use 16 or 32",
            ],
        ),
        (
            StageOptions::new().with("key_file", missing),
            None,
            vec!["key_file: \"", "cannot read it"],
        ),
        (
            StageOptions::new().with("key_file", bad_file.path()),
            None,
            vec!["key_file: \"", "line 2: the key is 15 bytes"],
        ),
        (
            StageOptions::new().with("key_file", file.path()).with("key_id", "c"),
            None,
            vec!["key_id: no key with id \"c\" — the keys' ids are \"a\", \"b\""],
        ),
        (env().with("key_id", "a"), Some(KEY16), vec!["key_id: the key has no id"]),
        (
            env().with("record_size", 17).with("keyfile", "x"),
            Some(KEY16),
            vec!["record_size: 17 is not between 18 and 16777216", "keyfile: unknown key"],
        ),
        (env().with("record_size", (16 << 20) + 1), Some(KEY16), vec!["record_size: 16777217"]),
        (
            env().with("record_size", OptionValue::Str("big".into())),
            Some(KEY16),
            vec!["record_size: expected a non-negative integer"],
        ),
    ];
    let secrets = [KEY16, KEY32, &KEY32[..40]];
    for (options, env_value, expected) in cases {
        let errors = build(&options, env_value).unwrap_err();
        let joined = errors.join("\n");
        for message in &expected {
            assert!(joined.contains(message), "{options:?}: {joined}");
        }
        for secret in secrets {
            assert!(!joined.contains(secret), "key material in {joined}");
        }
    }
}

#[test]
fn identity_and_debug_name_the_key_without_revealing_it() {
    let factory = factory(DEFAULT_RECORD_SIZE);
    let fingerprint = factory.key.fingerprint();
    assert_eq!(factory.identity(), format!("aes128gcm(v1,rs=65553,keyid=6b31,key={fingerprint})"));
    assert!(!factory.identity().contains('|'));
    // HMAC-SHA-256(key, "rangeway key id"), not the key.
    assert_eq!(fingerprint.len(), 16);
    let key_hex: String = key16_bytes().iter().map(|byte| format!("{byte:02x}")).collect();
    assert!(!key_hex.contains(&fingerprint[..8]));
    let other = Aes128GcmFactory::new(&keys(&format!("k1={KEY32}")), None, 65553).unwrap();
    assert_ne!(other.identity(), factory.identity());
    let with_pipe = Aes128GcmFactory::new(&keys(&format!("a|b={KEY16}")), None, 100).unwrap();
    assert!(Chain::new(vec![Arc::new(with_pipe) as Arc<dyn StageFactory>]).is_ok());
    for debug in [format!("{factory:?}"), format!("{:?}", keys(KEY16)), format!("{:#?}", factory)] {
        assert!(debug.contains(&fingerprint), "{debug}");
        assert!(
            !debug.contains(KEY16) && !debug.contains(&key_hex) && !debug.contains("[0, 1, 2"),
            "{debug}"
        );
    }
    assert!(factory.produces() == Form::Encrypted && !factory.observes_only());
}

#[test]
fn a_checksum_cannot_follow_encryption_but_may_precede_it() {
    let registry = StageRegistry::new();
    assert!(registry.kinds().any(|kind| kind == KIND));
    let file = TempFile::new(KEY16);
    let aes = StageOptions::new().with("key_file", file.path());
    let none = StageOptions::new();
    let errors = registry.build_chain([(KIND, &aes), ("checksum", &none)]).unwrap_err();
    assert!(matches!(errors[..], [ConfigError::Chain(_)]), "{errors:?}");
    assert_eq!(
        errors[0].to_string(),
        "checksum at middleware[1] must see plaintext but comes after aes128gcm at middleware[0]"
    );
    let chain = registry.build_chain([("checksum", &none), (KIND, &aes)]).unwrap();
    assert_eq!(chain.stages().len(), 2);
    assert!(chain.identity().starts_with("aes128gcm(v1,rs=65553,keyid=,key="));
}

/// Found by fuzzing (`fuzz/corpus/aes128gcm_decrypt/regression-header-rs-flip`): RFC 8188 does not
/// authenticate the record size in the header, so a changed one that moves no record boundary (a
/// stream of one short record) still decrypts — to the very same plaintext, never to other bytes;
/// one that moves a boundary fails.
#[test]
fn a_changed_record_size_never_yields_other_plaintext() {
    let keys = keys(&format!("k1={KEY16}"));
    let data = sample(2);
    let ciphertext = encrypt(&factory(79), &data);
    let mut changed = ciphertext.clone();
    changed[19] ^= 1 << 5; // rs 79 -> 111: the one 19-byte record fits either way
    assert_eq!(decrypt(&keys, &changed, &[]).unwrap(), data);

    let data = sample(200);
    let mut changed = encrypt(&factory(79), &data);
    changed[19] ^= 1 << 5; // now records of 79 bytes are read as 111: every tag fails
    assert!(decrypt(&keys, &changed, &[]).is_err());
}
