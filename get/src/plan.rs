//! Which connection fetches which bytes: pieces cut from what is missing, sized to what is left,
//! and taken from a slower connection's piece when nothing is left unclaimed (work stealing).
//! Sans-I/O: the workers report what they read and wrote; the plan answers what is theirs.

use crate::ranges::RangeSet;

/// The smallest piece worth a request of its own.
const MIN_PIECE: u64 = 1 << 20;
/// The largest piece handed out at once: beyond it, stealing takes over.
const MAX_PIECE: u64 = 64 << 20;
/// A claim with less than twice this left is not split: the new request would cost more than it
/// saves.
const MIN_STEAL: u64 = 512 << 10;

/// One connection's piece: `[start, end)` is its own, of which `[start, next)` has been read and
/// is being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    start: u64,
    next: u64,
    end: u64,
}

impl Claim {
    /// The byte the connection reads next.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// Where the piece ends now (a steal may have moved it closer).
    pub(crate) fn end(&self) -> u64 {
        self.end
    }
}

#[derive(Debug)]
pub(crate) struct Plan {
    len: u64,
    done: RangeSet,
    claims: Vec<Option<Claim>>,
}

impl Plan {
    /// A plan for an object of `len` bytes of which `done` is on disk, for `connections`.
    pub(crate) fn new(len: u64, done: RangeSet, connections: usize) -> Self {
        Self { len, done, claims: vec![None; connections.max(1)] }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The object turned out to end at `len` (a body without a length, read to its end).
    pub(crate) fn end_at(&mut self, len: u64) {
        self.len = len;
    }

    pub(crate) fn done(&self) -> &RangeSet {
        &self.done
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.done.covers(self.len)
    }

    pub(crate) fn claim(&self, worker: usize) -> Option<Claim> {
        self.claims[worker]
    }

    /// Makes `[start, end)` the worker's piece (the first request's, asked before the plan
    /// existed).
    pub(crate) fn claim_exact(&mut self, worker: usize, start: u64, end: u64) {
        self.claims[worker] = Some(Claim { start, next: start, end });
    }

    /// A piece for `worker`: the first stretch no one has, sized to what is left among the
    /// connections, or else the back half of the largest piece another connection still has to
    /// read. `None` when there is nothing left worth taking.
    pub(crate) fn take(&mut self, worker: usize) -> Option<Claim> {
        let taken = self.unclaimed_piece().or_else(|| self.steal())?;
        self.claims[worker] = Some(taken);
        Some(taken)
    }

    fn unclaimed_piece(&self) -> Option<Claim> {
        let mut busy = self.done.clone();
        for claim in self.claims.iter().flatten() {
            busy.insert(claim.start, claim.end);
        }
        let (start, gap_end) = busy.first_gap(0, self.len)?;
        let unclaimed = self.len - busy.total();
        let share = (unclaimed / (2 * self.claims.len() as u64)).clamp(MIN_PIECE, MAX_PIECE);
        let end = gap_end.min(start.saturating_add(share));
        Some(Claim { start, next: start, end })
    }

    fn steal(&mut self) -> Option<Claim> {
        let victim = self
            .claims
            .iter_mut()
            .flatten()
            .filter(|claim| claim.end - claim.next >= 2 * MIN_STEAL)
            .max_by_key(|claim| claim.end - claim.next)?;
        let middle = victim.next + (victim.end - victim.next) / 2;
        let stolen = Claim { start: middle, next: middle, end: victim.end };
        victim.end = middle;
        Some(stolen)
    }

    /// Of `read` bytes the worker read at its claim's next byte: where they go and how many are
    /// still its own (a steal may have ended its piece sooner); those become read.
    pub(crate) fn accept(&mut self, worker: usize, read: u64) -> (u64, u64) {
        let Some(claim) = self.claims[worker].as_mut() else { return (0, 0) };
        let (at, own) = (claim.next, read.min(claim.end - claim.next));
        claim.next += own;
        (at, own)
    }

    /// The worker wrote `[start, end)` to the file; its claim is over (`true`) once all of it is.
    pub(crate) fn written(&mut self, worker: usize, start: u64, end: u64) -> bool {
        self.done.insert(start, end);
        let Some(claim) = self.claims[worker].as_mut() else { return true };
        claim.start = claim.start.max(end);
        if claim.start >= claim.end {
            self.claims[worker] = None;
        }
        self.claims[worker].is_none()
    }

    /// The worker stops: what it had not read is anyone's again.
    pub(crate) fn release(&mut self, worker: usize) {
        self.claims[worker] = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Reads and writes the whole of `worker`'s claim.
    fn finish(plan: &mut Plan, worker: usize) {
        let claim = plan.claim(worker).expect("a claim");
        let (at, own) = plan.accept(worker, claim.end() - claim.next());
        plan.written(worker, at, at + own);
    }

    #[test]
    fn pieces_cover_what_is_missing_once_and_shrink_towards_the_end() {
        let mut done = RangeSet::default();
        done.insert(0, 10 * MIB);
        let mut plan = Plan::new(100 * MIB, done, 4);
        let pieces: Vec<Claim> = (0..4).map(|w| plan.take(w).expect("a piece")).collect();
        assert_eq!(pieces[0].next(), 10 * MIB, "starts after what is on disk");
        for pair in pieces.windows(2) {
            assert_eq!(pair[0].end(), pair[1].next(), "no byte twice, none skipped");
            assert!(pair[1].end() - pair[1].next() <= pair[0].end() - pair[0].next());
        }
        for worker in 0..4 {
            finish(&mut plan, worker);
        }
        while let Some(claim) = plan.take(0) {
            assert!(claim.end() > claim.next());
            finish(&mut plan, 0);
        }
        assert!(plan.is_complete());
        assert_eq!(plan.done().total(), 100 * MIB);
    }

    #[test]
    fn an_idle_connection_takes_the_back_half_of_the_largest_piece_left() {
        let mut plan = Plan::new(64 * MIB, RangeSet::default(), 3);
        plan.claim_exact(0, 0, 64 * MIB);
        assert_eq!(plan.accept(0, 4 * MIB), (0, 4 * MIB));
        let stolen = plan.take(1).expect("a steal");
        assert_eq!((stolen.next(), stolen.end()), (34 * MIB, 64 * MIB));
        assert_eq!(
            plan.claim(0).map(|c| c.end()),
            Some(34 * MIB),
            "the first piece now ends there"
        );
        // The victim's read past its new end is not its own.
        assert_eq!(plan.accept(0, 40 * MIB), (4 * MIB, 30 * MIB));
        let again = plan.take(2).expect("a steal from the larger");
        assert_eq!((again.next(), again.end()), (49 * MIB, 64 * MIB));
    }

    #[test]
    fn small_pieces_are_not_split_and_a_released_claim_is_taken_again() {
        let mut plan = Plan::new(MIB, RangeSet::default(), 2);
        plan.claim_exact(0, 0, MIB);
        plan.accept(0, MIB / 2);
        assert_eq!(plan.take(1), None, "half a MiB left: not worth a request");
        plan.release(0);
        let again = plan.take(1).expect("the released piece");
        assert_eq!((again.next(), again.end()), (0, MIB));
    }
}
