//! A piece of work raced with what would make it pointless (the client gone), as one future that
//! holds each once: an `async fn` taking the work by value would keep it twice — as its argument
//! and as what it awaits — and every caller's future would grow by both (see docs/benchmarks.md,
//! "Boxed futures").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// `work`'s output, or `stop`'s as the error once `stop` resolves first.
    pub(crate) struct Unless<W, S> {
        #[pin]
        work: W,
        #[pin]
        stop: S,
    }
}

impl<W, S> Unless<W, S> {
    pub(crate) fn new(work: W, stop: S) -> Self {
        Self { work, stop }
    }
}

impl<W: Future, S: Future> Future for Unless<W, S> {
    type Output = Result<W::Output, S::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The work first: when both are ready, what it finished is not thrown away.
        if let Poll::Ready(done) = this.work.poll(cx) {
            return Poll::Ready(Ok(done));
        }
        this.stop.poll(cx).map(Err)
    }
}

#[cfg(test)]
mod tests {
    use super::Unless;

    #[tokio::test]
    async fn the_work_wins_when_both_are_ready() {
        assert_eq!(Unless::new(async { 1 }, async { 2 }).await, Ok(1));
    }

    #[tokio::test]
    async fn the_stop_ends_work_that_waits() {
        let never = std::future::pending::<u8>();
        assert_eq!(Unless::new(never, async { "gone" }).await, Err("gone"));
    }
}
