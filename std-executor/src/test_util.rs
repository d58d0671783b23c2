//! Helpers shared by the unit tests (compiled only under `cfg(test)`): a counting waker, a
//! minimal `block_on`, a drop counter and the one place that unpacks a panic payload.

use std::any::Any;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use crate::error::TaskError;

/// A waker that counts its wakes and unparks the thread that made it.
pub(crate) struct CountingWaker {
    pub(crate) wakes: AtomicUsize,
    thread: Thread,
}

impl CountingWaker {
    pub(crate) fn new() -> (Arc<CountingWaker>, Waker) {
        let w = Arc::new(CountingWaker {
            wakes: AtomicUsize::new(0),
            thread: thread::current(),
        });
        (w.clone(), Waker::from(w))
    }

    pub(crate) fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Polls `fut` on this thread until it is ready, parking between polls; returns the output and
/// how many times it was polled.
pub(crate) fn block_on<F: Future>(fut: F) -> (F::Output, usize) {
    let (_counter, waker) = CountingWaker::new();
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    let mut polls = 0;
    loop {
        polls += 1;
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return (v, polls);
        }
        thread::park();
    }
}

/// Counts drops of the values it makes, to check that a closure or a result is dropped exactly
/// once, whichever path the task took.
#[derive(Clone, Default)]
pub(crate) struct Drops(Arc<AtomicUsize>);

/// A value whose drop [`Drops`] counts.
pub(crate) struct Counted(Arc<AtomicUsize>, pub(crate) u64);

impl Drops {
    pub(crate) fn make(&self, v: u64) -> Counted {
        Counted(self.0.clone(), v)
    }

    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The panic payload of a `Panicked` error (the one place that knows how `TaskError` carries
/// it); panics on any other outcome.
pub(crate) fn payload(e: TaskError) -> Box<dyn Any + Send> {
    match e {
        TaskError::Panicked(p) => p.into_panic(),
        other => panic!("expected Panicked, got {other:?}"),
    }
}

/// Silences the default panic hook's message for the panics the tests provoke on purpose
/// (payloads of type [`Quiet`], messages starting with `quiet:`); everything else is reported
/// as usual.
pub(crate) fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let p = info.payload();
            let quiet = p.downcast_ref::<Quiet>().is_some()
                || p.downcast_ref::<String>()
                    .is_some_and(|m| m.starts_with("quiet:"));
            if !quiet {
                default(info);
            }
        }));
    });
}

/// A panic payload the tests throw on purpose (see [`quiet_panics`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Quiet(pub(crate) u32);

/// Panics with a [`Quiet`] payload, without the default hook's output.
pub(crate) fn quiet_panic(n: u32) -> ! {
    quiet_panics();
    std::panic::panic_any(Quiet(n))
}
