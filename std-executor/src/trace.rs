//! Cargo feature `tracing`: one span per task, and events for the per-key controls, refusals
//! and key releases, for the `tracing` crate's subscribers. Without the feature every function
//! here is an inline no-op and every type a zero-sized one: nothing is added to a task, a
//! submission or a worker's loop.
//!
//! - **Spans** (target `keyserial`, level `TRACE`, name `task`): one per task, entered while it
//!   runs (while each poll of a future runs), with fields `key` (the key's `Debug` text after
//!   `Builder::trace_keys`, else its hash), `wait_us` (from
//!   submission to start) and `run_us` (from start to end; for a future, to completion). A
//!   submission records them only if a subscriber wants such a span when it is made (one
//!   `enabled!` check per submission); otherwise the task is not touched.
//! - **Events** (target `keyserial`, level `DEBUG`): `pause`, `resume`, `cancel_key` (with how
//!   many tasks it handed back), `rejected` (with the reason) and, at `TRACE`, `key released`.

#[cfg(feature = "tracing")]
pub(crate) use on::*;

#[cfg(not(feature = "tracing"))]
pub(crate) use off::*;

#[cfg(feature = "tracing")]
mod on {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Instant;

    /// How a serializer writes a key in a span or an event: its `Debug` text
    /// (`Builder::trace_keys`), or its hash.
    pub(crate) struct Labeler<K>(pub(crate) Option<fn(&K) -> String>);

    impl<K> Default for Labeler<K> {
        fn default() -> Self {
            Labeler(None)
        }
    }

    impl<K> Labeler<K> {
        /// `key` as a span's or an event's `key` field.
        pub(crate) fn label(&self, key: &K, hash: u64) -> String {
            match self.0 {
                Some(f) => f(key),
                None => format!("#{hash:016x}"),
            }
        }
    }

    /// What a traced task carries from its submission: when, and its key's label.
    pub(crate) struct Origin {
        submitted: Instant,
        key: String,
    }

    /// The origin of a task of key `key` (`None`: unkeyed; `hash`: the key's hash, computed
    /// only if needed), if a subscriber wants its span.
    pub(crate) fn origin<K>(
        labeler: &Labeler<K>,
        key: Option<&K>,
        hash: impl FnOnce(&K) -> u64,
    ) -> Option<Origin> {
        if !tracing::enabled!(target: "keyserial", tracing::Level::TRACE) {
            return None;
        }
        Some(Origin {
            submitted: Instant::now(),
            key: key.map_or_else(|| "(unkeyed)".to_string(), |k| labeler.label(k, hash(k))),
        })
    }

    fn span(o: &Origin) -> tracing::Span {
        tracing::trace_span!(
            target: "keyserial",
            "task",
            key = %o.key,
            wait_us = o.submitted.elapsed().as_micros() as u64,
            run_us = tracing::field::Empty,
        )
    }

    /// `f` as a task that runs inside its span, if it has an origin.
    pub(crate) fn wrap<F, T>(origin: Option<Origin>, f: F) -> impl FnOnce() -> T + Send + 'static
    where
        F: FnOnce() -> T + Send + 'static,
    {
        move || match origin {
            None => f(),
            Some(o) => {
                let span = span(&o);
                let _in = span.enter();
                let start = Instant::now();
                let r = f();
                span.record("run_us", start.elapsed().as_micros() as u64);
                r
            }
        }
    }

    /// A future wrapped in its span (made at its first poll).
    pub(crate) struct TracedFuture<Fut> {
        fut: Pin<Box<Fut>>,
        origin: Option<Origin>,
        span: Option<(tracing::Span, Instant)>,
    }

    /// `fut` as a future whose polls run inside its span, if it has an origin.
    pub(crate) fn wrap_future<Fut: Future>(origin: Option<Origin>, fut: Fut) -> TracedFuture<Fut> {
        TracedFuture {
            fut: Box::pin(fut),
            origin,
            span: None,
        }
    }

    impl<Fut: Future> Future for TracedFuture<Fut> {
        type Output = Fut::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Fut::Output> {
            let this = &mut *self;
            if this.span.is_none() {
                if let Some(o) = this.origin.take() {
                    this.span = Some((span(&o), Instant::now()));
                }
            }
            let Some((span, start)) = &this.span else {
                return this.fut.as_mut().poll(cx);
            };
            let _in = span.enter();
            let r = this.fut.as_mut().poll(cx);
            if r.is_ready() {
                span.record("run_us", start.elapsed().as_micros() as u64);
            }
            r
        }
    }

    /// A per-key control or a refusal happened (`what`: `pause`, `resume`, `cancel_key`).
    pub(crate) fn control<K>(
        labeler: &Labeler<K>,
        what: &str,
        key: &K,
        hash: impl FnOnce() -> u64,
        n: usize,
    ) {
        if tracing::enabled!(target: "keyserial", tracing::Level::DEBUG) {
            let key = labeler.label(key, hash());
            tracing::debug!(target: "keyserial", key = %key, tasks = n as u64, "{what}");
        }
    }

    /// A submission was refused.
    pub(crate) fn rejected(reason: crate::RejectReason) {
        tracing::debug!(target: "keyserial", reason = %reason, "rejected");
    }

    /// A key was released (its entry retired).
    pub(crate) fn released<K>(labeler: &Labeler<K>, key: &K, hash: u64) {
        if tracing::enabled!(target: "keyserial", tracing::Level::TRACE) {
            let key = labeler.label(key, hash);
            tracing::trace!(target: "keyserial", key = %key, "key released");
        }
    }
}

#[cfg(not(feature = "tracing"))]
mod off {
    use std::marker::PhantomData;

    /// Nothing (feature `tracing` is off).
    pub(crate) struct Labeler<K>(PhantomData<fn(&K)>);

    impl<K> Default for Labeler<K> {
        fn default() -> Self {
            Labeler(PhantomData)
        }
    }

    /// Nothing (feature `tracing` is off).
    pub(crate) type Origin = ();

    #[inline(always)]
    pub(crate) fn origin<K>(
        _: &Labeler<K>,
        _: Option<&K>,
        _: impl FnOnce(&K) -> u64,
    ) -> Option<Origin> {
        None
    }

    #[inline(always)]
    pub(crate) fn wrap<F>(_: Option<Origin>, f: F) -> F {
        f
    }

    #[inline(always)]
    pub(crate) fn wrap_future<Fut>(_: Option<Origin>, fut: Fut) -> Fut {
        fut
    }

    #[inline(always)]
    pub(crate) fn control<K>(_: &Labeler<K>, _: &str, _: &K, _: impl FnOnce() -> u64, _: usize) {}

    #[inline(always)]
    pub(crate) fn rejected(_: crate::RejectReason) {}

    #[inline(always)]
    pub(crate) fn released<K>(_: &Labeler<K>, _: &K, _: u64) {}
}
