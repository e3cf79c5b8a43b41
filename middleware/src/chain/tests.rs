//! The chain's range algebra against test-only stages that change lengths and depend on offsets.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::checksum::ChecksumFactory;

/// Transforms with a range algebra of their own, each with a reference implementation over a
/// whole buffer to check the chain against.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Test {
    /// After every `k` input bytes, a marker byte: the group's number.
    Insert(u64),
    /// Drops every `k`-th input byte (`k >= 2`).
    Drop(u64),
    /// XOR with a function of the offset: same length, but wrong if started at the wrong offset.
    Xor,
    /// Each byte twice, the second inverted.
    Double,
    /// Identity bytes, but a length it does not know before a full pass (as gzip without its
    /// block index).
    Unsized,
    /// Like `Xor`, but declaring itself an encryption.
    Encrypt,
}

/// A version of `len` bytes; the test stages look at nothing else.
fn object(len: u64) -> ObjectVersion<'static> {
    ObjectVersion { route: "test", path: "/object", strong_etag: Some("\"v1\""), len }
}

fn mask(pos: u64) -> u8 {
    (pos.wrapping_mul(7).wrapping_add(3) % 251) as u8
}

impl Test {
    fn reference(self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (pos, &byte) in (0u64..).zip(input) {
            out.extend(self.map(pos, byte));
        }
        out
    }

    /// The output bytes made from input byte `byte` at `pos`.
    fn map(self, pos: u64, byte: u8) -> Vec<u8> {
        match self {
            Test::Insert(k) if (pos + 1).is_multiple_of(k) => vec![byte, (pos / k) as u8],
            Test::Insert(_) | Test::Unsized => vec![byte],
            Test::Drop(k) if pos % k == k - 1 => vec![],
            Test::Drop(_) => vec![byte],
            Test::Xor | Test::Encrypt => vec![byte ^ mask(pos)],
            Test::Double => vec![byte, !byte],
        }
    }
}

impl StageFactory for Test {
    fn kind(&self) -> &str {
        match self {
            Test::Insert(_) => "insert",
            Test::Drop(_) => "drop",
            Test::Xor => "xor",
            Test::Double => "double",
            Test::Unsized => "unsized",
            Test::Encrypt => "encrypt",
        }
    }

    fn identity(&self) -> &str {
        self.kind()
    }

    fn plan(
        &self,
        output: ByteRange,
        input_len: u64,
        _: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        let (a, b) = (output.start(), output.end());
        let (start, end, skip) = match *self {
            Test::Insert(k) => {
                let group = k + 1;
                let start = a / group * k;
                let end = if a == b { start } else { ((b - 1) / group + 1) * k };
                (start, end, a % group)
            }
            Test::Drop(k) => {
                let kept = k - 1;
                let at = |o: u64| o / kept * k + o % kept;
                let start = at(a);
                (start, if a == b { start } else { at(b - 1) + 1 }, 0)
            }
            Test::Xor | Test::Unsized | Test::Encrypt => (a, b, 0),
            Test::Double => (a / 2, b.div_ceil(2), a % 2),
        };
        let input = ByteRange::new(start.min(input_len), end.min(input_len)).unwrap();
        Ok(StagePlan { input, skip })
    }

    /// `Unsized` knows its output starts where its input does, as a compressor knows the offset
    /// of the blocks it indexed.
    fn plan_open(
        &self,
        output_start: u64,
        input_len: u64,
        context: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        match self {
            Test::Unsized => {
                let start = output_start.min(input_len);
                Ok(StagePlan { input: ByteRange::new(start, input_len).unwrap(), skip: 0 })
            }
            _ => self.plan(
                ByteRange::new(output_start, self.output_len(input_len, context).unwrap()).unwrap(),
                input_len,
                context,
            ),
        }
    }

    fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
        match self {
            Test::Insert(k) => input_len.checked_add(input_len / k),
            Test::Drop(k) => Some(input_len - input_len / k),
            Test::Xor | Test::Encrypt => Some(input_len),
            Test::Double => input_len.checked_mul(2),
            Test::Unsized => None,
        }
    }

    fn observes_only(&self) -> bool {
        false
    }

    fn produces(&self) -> Form {
        if *self == Test::Encrypt { Form::Encrypted } else { Form::Transformed }
    }

    fn start(
        &self,
        at_input: u64,
        _resume: Option<&StageState>,
        _: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(TestRun { test: *self, pos: at_input }))
    }
}

#[derive(Debug)]
struct TestRun {
    test: Test,
    pos: u64,
}

impl Stage for TestRun {
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
        let mut out = Vec::new();
        for &byte in chunk.iter() {
            out.extend(self.test.map(self.pos, byte));
            self.pos += 1;
        }
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }

    fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
        Ok(None)
    }
}

#[derive(Clone, Copy, Debug)]
enum Spec {
    Checksum,
    Test(Test),
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        Just(Spec::Checksum),
        (1u64..5).prop_map(|k| Spec::Test(Test::Insert(k))),
        (2u64..5).prop_map(|k| Spec::Test(Test::Drop(k))),
        Just(Spec::Test(Test::Xor)),
        Just(Spec::Test(Test::Double)),
    ]
}

fn factory(spec: Spec) -> Arc<dyn StageFactory> {
    match spec {
        // A small interval, so that checkpoints are taken in short inputs too.
        Spec::Checksum => Arc::new(
            ChecksumFactory::new(
                &[crate::checksum::Algorithm::Sha256, crate::checksum::Algorithm::Crc32],
                64,
            )
            .unwrap(),
        ),
        Spec::Test(test) => Arc::new(test),
    }
}

/// The bytes entering each stage and leaving the last, by the reference implementations.
fn reference(specs: &[Spec], origin: &[u8]) -> Vec<Vec<u8>> {
    let mut stages = vec![origin.to_vec()];
    for spec in specs {
        let input = stages.last().unwrap();
        stages.push(match spec {
            Spec::Checksum => input.clone(),
            Spec::Test(test) => test.reference(input),
        });
    }
    stages
}

/// Runs `plan` over `origin` (the whole origin), fed in pieces cut at `cuts`.
fn run(chain: &Chain, plan: &ChainPlan, origin: &[u8], cuts: &[usize]) -> (Vec<u8>, ChainRun) {
    run_learned(chain, plan, &Learned::new(), origin, cuts)
}

/// [`run`], with what earlier passes taught the stages.
fn run_learned(
    chain: &Chain,
    plan: &ChainPlan,
    learned: &Learned,
    origin: &[u8],
    cuts: &[usize],
) -> (Vec<u8>, ChainRun) {
    let range = plan.origin();
    let input = Bytes::copy_from_slice(&origin[range.start() as usize..range.end() as usize]);
    let mut bounds: Vec<usize> = cuts.iter().map(|&cut| cut % (input.len() + 1)).collect();
    bounds.extend([0, input.len()]);
    bounds.sort_unstable();
    let mut run = chain.start(plan, &object(origin.len() as u64), learned, &[]).unwrap();
    let mut out = Vec::new();
    for pair in bounds.windows(2) {
        if let Some(piece) = run.push(input.slice(pair[0]..pair[1])).unwrap() {
            out.extend_from_slice(&piece);
        }
    }
    if let Some(tail) = run.finish().unwrap() {
        out.extend_from_slice(&tail);
    }
    (out, run)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// For any chain, origin and output range: the ranged run produces exactly that slice of
    /// the full output, whatever the chunking; every stage sees exactly its planned input.
    #[test]
    fn ranged_runs_equal_slices_of_the_full_output(
        origin in proptest::collection::vec(any::<u8>(), 0..600),
        specs in proptest::collection::vec(spec(), 0..5),
        ends in (any::<u64>(), any::<u64>()),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        other_cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let chain = Chain::new(specs.iter().map(|&spec| factory(spec)).collect()).unwrap();
        let expected = reference(&specs, &origin);
        let full = expected.last().unwrap();
        let origin_len = origin.len() as u64;
        prop_assert_eq!(chain.output_len(&object(origin_len), &Learned::new()), Some(full.len() as u64));

        let (whole, _) = run(&chain, &chain.plan_whole(&object(origin_len), &Learned::new()), &origin, &cuts);
        prop_assert_eq!(&whole, full);

        let out_len = full.len() as u64;
        let (a, b) = (ends.0 % (out_len + 1), ends.1 % (out_len + 1));
        let wanted = ByteRange::new(a.min(b), a.max(b)).unwrap();
        let plan = chain.plan(wanted, &object(origin_len), &Learned::new()).unwrap();
        prop_assert_eq!(plan.output(), wanted);
        let (got, ranged) = run(&chain, &plan, &origin, &cuts);
        prop_assert_eq!(&got[..], &full[wanted.start() as usize..wanted.end() as usize]);
        prop_assert!(ranged.is_done());
        let (again, _) = run(&chain, &plan, &origin, &other_cuts);
        prop_assert_eq!(&again, &got);

        // Each checksum saw exactly its planned input: its CRC piece is of that range of the
        // bytes entering it.
        for (index, report) in ranged.reports().into_iter().enumerate() {
            let Some(report) = report else { continue };
            let input = plan.stages()[index].input;
            let seen = &expected[index][input.start() as usize..input.end() as usize];
            let piece = RangeDigest { range: input, digest: Digest::Crc32(crc32fast::hash(seen)) };
            prop_assert!(report.digests.contains(&piece), "{:?} lacks {:?}", report, piece);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// An open range gives the tail of the full output, whether or not the last stage knows its
    /// length, and is the closed range to the end when every length is known.
    #[test]
    fn open_ranges_give_the_tail_of_the_output(
        origin in proptest::collection::vec(any::<u8>(), 0..300),
        specs in proptest::collection::vec(spec(), 0..4),
        unsized_last in any::<bool>(),
        start in any::<u64>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut factories: Vec<Arc<dyn StageFactory>> =
            specs.iter().map(|&spec| factory(spec)).collect();
        if unsized_last {
            factories.push(Arc::new(Test::Unsized));
        }
        let chain = Chain::new(factories).unwrap();
        let full = reference(&specs, &origin).pop().unwrap();
        let object = object(origin.len() as u64);
        let start = start % (full.len() as u64 + 1);
        let plan = chain.plan_open(start, &object, &Learned::new()).unwrap();
        if !unsized_last {
            let closed = ByteRange::new(start, full.len() as u64).unwrap();
            prop_assert_eq!(&plan, &chain.plan(closed, &object, &Learned::new()).unwrap());
        }
        let (got, _) = run(&chain, &plan, &origin, &cuts);
        prop_assert_eq!(&got[..], &full[start as usize..]);
    }
}

#[test]
fn an_open_range_needs_every_length_but_the_last() {
    let chain = Chain::new(vec![Arc::new(Test::Unsized), Arc::new(Test::Double)]).unwrap();
    let unknown = chain.plan_open(3, &object(5), &Learned::new()).unwrap_err();
    assert!(matches!(unknown, ChainError::LengthUnknown { index: 0, .. }), "{unknown}");
    let known = Chain::new(vec![Arc::new(Test::Double)]).unwrap();
    let past = known.plan_open(11, &object(5), &Learned::new()).unwrap_err();
    assert_eq!(
        past.to_string(),
        "range 11..18446744073709551615 is not inside the 10 bytes of output"
    );
}

#[test]
fn an_empty_or_observing_chain_forwards_the_same_bytes() {
    let chunk = Bytes::from(vec![7u8; 1000]);
    for specs in [vec![], vec![Spec::Checksum], vec![Spec::Checksum, Spec::Checksum]] {
        let chain = Chain::new(specs.iter().map(|&spec| factory(spec)).collect()).unwrap();
        assert!(chain.is_observing_only());
        assert_eq!(chain.identity(), "");
        let plan =
            chain.plan(ByteRange::new(0, 3000).unwrap(), &object(3000), &Learned::new()).unwrap();
        assert_eq!(plan.origin(), ByteRange::new(0, 3000).unwrap());
        let mut run = chain.start(&plan, &object(3000), &Learned::new(), &[]).unwrap();
        for _ in 0..3 {
            let out = run.push(chunk.clone()).unwrap().unwrap();
            assert_eq!((out.as_ptr(), out.len()), (chunk.as_ptr(), chunk.len()));
        }
        assert_eq!(run.finish().unwrap(), None);
    }
}

#[test]
fn an_observer_that_knows_its_digests_is_not_run_and_the_others_are() {
    let origin: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let stages = [Spec::Checksum, Spec::Test(Test::Xor), Spec::Checksum];
    let chain = Chain::new(stages.iter().map(|&spec| factory(spec)).collect()).unwrap();
    let whole = chain.plan_whole(&object(5000), &Learned::new());
    let expected = reference(&stages, &origin).pop().unwrap();
    let (output, fresh) = run(&chain, &whole, &origin, &[1000, 2500]);
    assert_eq!(output, expected);
    assert!(fresh.reports().iter().step_by(2).all(Option::is_some), "both checksums report");

    // The first checksum knows its digests: its bytes pass by unread, and nothing else changes.
    let mut learned = Learned::new();
    learned.set_digested(0);
    assert!(learned.is_digested(0) && !learned.is_digested(2));
    let (output, known) = run_learned(&chain, &whole, &learned, &origin, &[1000, 2500]);
    assert_eq!(output, expected);
    let reports = known.reports();
    assert!(reports[0].is_none(), "a stage with nothing to learn ran: {:?}", reports[0]);
    assert!(reports[2].is_some(), "a stage with digests to learn did not run");

    // A transforming stage runs whatever is recorded of it.
    learned.set_digested(1);
    let (output, _) = run_learned(&chain, &whole, &learned, &origin, &[7]);
    assert_eq!(output, expected);
}

#[test]
fn only_transforming_stages_make_the_identity() {
    let chain = Chain::new(vec![
        factory(Spec::Checksum),
        Arc::new(Test::Xor),
        factory(Spec::Checksum),
        Arc::new(Test::Double),
    ])
    .unwrap();
    assert!(!chain.is_observing_only());
    assert_eq!(chain.identity(), "xor|double");
    let inputs: Vec<_> = (0..6).map(|index| chain.input_identity(index)).collect();
    assert_eq!(inputs, [Some(""), Some(""), Some("xor"), Some("xor"), Some("xor|double"), None]);
    assert_eq!(Chain::default().identity(), "");
    assert_eq!(Chain::default().input_identity(0), Some(""));
}

#[test]
fn a_stage_that_must_see_plaintext_cannot_follow_encryption() {
    let error =
        Chain::new(vec![Arc::new(Test::Xor), Arc::new(Test::Encrypt), factory(Spec::Checksum)])
            .unwrap_err();
    assert_eq!(
        error.to_string(),
        "checksum at middleware[2] must see plaintext but comes after encrypt at middleware[1]"
    );
    // Before encryption, or after a mere transform, it is fine.
    Chain::new(vec![Arc::new(Test::Xor), factory(Spec::Checksum), Arc::new(Test::Encrypt)])
        .unwrap();
}

#[test]
fn a_stage_that_changes_bytes_works_on_plaintext_unless_it_says_otherwise() {
    // Test::Xor keeps the default: a change meant for content does not follow encryption.
    let error = Chain::new(vec![Arc::new(Test::Encrypt), Arc::new(Test::Xor)]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "xor at middleware[1] must see plaintext but comes after encrypt at middleware[0]"
    );
    // One that says it works on any bytes may.
    Chain::new(vec![Arc::new(Test::Encrypt), Arc::new(Named("n", Form::Encrypted))]).unwrap();
}

#[test]
fn a_kind_must_build_a_stage_of_its_own_name() {
    let mut registry = crate::chain::StageRegistry::empty();
    registry.register("renamed", |_: &StageOptions| Ok(Arc::new(Test::Xor) as _)).unwrap();
    let errors = registry.build("renamed", &StageOptions::default()).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(
        errors[0].to_string(),
        "kind: kind \"renamed\" builds a stage that calls itself \"xor\" — register it under \
         the name its kind() returns"
    );
}

#[derive(Debug)]
struct Named(&'static str, Form);

impl StageFactory for Named {
    fn kind(&self) -> &str {
        "named"
    }
    fn identity(&self) -> &str {
        self.0
    }
    fn plan(
        &self,
        output: ByteRange,
        _input_len: u64,
        _: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        // Deliberately wrong, for the chain to catch.
        Ok(StagePlan { input: output, skip: output.end() + 1 })
    }
    fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
        Some(input_len)
    }
    fn observes_only(&self) -> bool {
        false
    }
    fn accepts(&self) -> Form {
        self.1
    }
    fn start(
        &self,
        _: u64,
        _: Option<&StageState>,
        _: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::Other("no".into()))
    }
}

#[test]
fn order_rules_and_identities_are_checked_at_build_time() {
    let original = Chain::new(vec![Arc::new(Test::Double), Arc::new(Named("n", Form::Original))]);
    assert_eq!(
        original.unwrap_err().to_string(),
        "named at middleware[1] must see the origin's own bytes but comes after double at \
         middleware[0]"
    );
    Chain::new(vec![factory(Spec::Checksum), Arc::new(Named("n", Form::Original))]).unwrap();
    for bad in ["", "a|b", "sp ace", "tab\t", "é"] {
        let error = Chain::new(vec![Arc::new(Named(bad, Form::Encrypted))]).unwrap_err();
        assert!(matches!(error, BuildError::Identity { index: 0, .. }), "{bad:?}");
    }
}

#[test]
fn planning_errors_instead_of_panicking() {
    let chain = Chain::new(vec![Arc::new(Test::Double)]).unwrap();
    let past =
        chain.plan(ByteRange::new(0, 21).unwrap(), &object(10), &Learned::new()).unwrap_err();
    assert_eq!(past.to_string(), "range 0..21 is not inside the 20 bytes of output");
    // An output length that overflows is unknown.
    assert!(matches!(
        chain.plan(ByteRange::new(0, 1).unwrap(), &object(u64::MAX), &Learned::new()),
        Err(ChainError::LengthUnknown { index: 0, .. })
    ));

    let unsized_chain = Chain::new(vec![Arc::new(Test::Unsized), Arc::new(Test::Double)]).unwrap();
    assert_eq!(unsized_chain.output_len(&object(5), &Learned::new()), None);
    let unknown =
        unsized_chain.plan(ByteRange::new(0, 1).unwrap(), &object(5), &Learned::new()).unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "the output length of unsized at middleware[0] is unknown until a full pass, so ranges \
         of the output cannot be planned"
    );
    // A whole pass still works, and a short one cannot be told from the end.
    let plan = unsized_chain.plan_whole(&object(5), &Learned::new());
    assert_eq!(plan.output(), ByteRange::new(0, u64::MAX).unwrap());
    let (out, _) = run(&unsized_chain, &plan, b"abcde", &[2]);
    assert_eq!(out, Test::Double.reference(b"abcde"));

    let liar = Chain::new(vec![Arc::new(Named("n", Form::Encrypted))]).unwrap();
    let bad = liar.plan(ByteRange::new(2, 4).unwrap(), &object(10), &Learned::new()).unwrap_err();
    assert!(matches!(bad, ChainError::BadPlan { index: 0, skip: 5, .. }), "{bad}");
    let whole = liar.plan_whole(&object(10), &Learned::new());
    let failed = liar.start(&whole, &object(10), &Learned::new(), &[]).unwrap_err();
    assert_eq!(failed.to_string(), "named at middleware[0]: no");
}

#[test]
fn runs_check_their_plan_and_their_end() {
    let chain = Chain::new(vec![Arc::new(Test::Xor)]).unwrap();
    let other = Chain::new(vec![]).unwrap();
    let plan = chain.plan(ByteRange::new(2, 8).unwrap(), &object(10), &Learned::new()).unwrap();
    assert!(matches!(
        other.start(&plan, &object(10), &Learned::new(), &[]),
        Err(ChainError::PlanMismatch { planned: 1, stages: 0 })
    ));
    assert!(matches!(
        chain.start(&plan, &object(10), &Learned::new(), &[None, None]),
        Err(ChainError::TooManyStates { given: 2, stages: 1 })
    ));

    let mut short = chain.start(&plan, &object(10), &Learned::new(), &[None]).unwrap();
    assert_eq!(short.push(Bytes::from_static(b"abc")).unwrap().map(|b| b.len()), Some(3));
    assert!(!short.is_done());
    let error = short.finish().unwrap_err();
    assert_eq!(error.to_string(), "output ended at byte 5, short of the planned 2..8");
    assert!(matches!(short.push(Bytes::from_static(b"x")), Err(ChainError::Finished)));
    assert_eq!(short.finish().unwrap(), None);

    // Bytes past the planned input are cut off before any stage sees them.
    let mut long = chain.start(&plan, &object(10), &Learned::new(), &[]).unwrap();
    let out = long.push(Bytes::from_static(b"cdefghijXYZ")).unwrap().unwrap();
    assert_eq!(&out[..], &Test::Xor.reference(b"abcdefghij")[2..8]);
    assert!(long.is_done());
}

#[test]
fn tails_of_several_stages_are_joined() {
    /// Holds back everything (as a compressor's last block), or only the last byte.
    #[derive(Debug)]
    struct Hold {
        all: bool,
        held: Vec<u8>,
    }
    impl Stage for Hold {
        fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
            self.held.extend_from_slice(&chunk);
            let keep = if self.all { self.held.len() } else { self.held.len().min(1) };
            let ready: Vec<u8> = self.held.drain(..self.held.len() - keep).collect();
            Ok((!ready.is_empty()).then(|| Bytes::from(ready)))
        }
        fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
            Ok(Some(Bytes::from(std::mem::take(&mut self.held))))
        }
    }
    #[derive(Debug)]
    struct Holding(bool);
    impl StageFactory for Holding {
        fn kind(&self) -> &str {
            "hold"
        }
        fn identity(&self) -> &str {
            if self.0 { "hold-all" } else { "hold-one" }
        }
        fn plan(
            &self,
            output: ByteRange,
            _: u64,
            _: &StageContext<'_>,
        ) -> Result<StagePlan, StageError> {
            Ok(StagePlan::identity(output))
        }
        fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
            Some(input_len)
        }
        fn observes_only(&self) -> bool {
            false
        }
        fn start(
            &self,
            _: u64,
            _: Option<&StageState>,
            _: &StageContext<'_>,
        ) -> Result<Box<dyn Stage>, StageError> {
            Ok(Box::new(Hold { all: self.0, held: Vec::new() }))
        }
    }
    let chain =
        Chain::new(vec![Arc::new(Test::Xor), Arc::new(Holding(true)), Arc::new(Holding(false))])
            .unwrap();
    let plan = chain.plan(ByteRange::new(1, 5).unwrap(), &object(6), &Learned::new()).unwrap();
    let mut run = chain.start(&plan, &object(6), &Learned::new(), &[]).unwrap();
    assert_eq!(run.push(Bytes::from_static(b"bcde")).unwrap(), None);
    // The first holder's tail makes output through the second, then the second's own tail.
    let out = run.finish().unwrap().unwrap();
    assert_eq!(&out[..], &Test::Xor.reference(b"abcdef")[1..5]);
}
