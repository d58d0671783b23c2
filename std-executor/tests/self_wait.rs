//! Issue "First contact", item 1: a task that waits for a later task of its own key (`join`,
//! polling the handle as `block_on` does, `.await` in a future) gets a panic, in every build,
//! instead of hanging for ever. `.ci/run` also runs this file with `--release`.

use std::future::Future;
use std::pin::pin;
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use keyserial::{Builder, Serializer, TaskError, TaskHandle};

/// How long a scenario may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(20);

/// Runs `f` on a thread and fails the test if it does not return within [`LIMIT`].
fn bounded<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(LIMIT)
        .expect("the self-wait hung instead of panicking")
}

/// A minimal `block_on`, as `futures::executor::block_on` does it: poll, park until woken.
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

fn panicked_with_self_wait<T: std::fmt::Debug>(r: Result<T, TaskError>) {
    match r {
        Err(e @ TaskError::Panicked(_)) => {
            let msg = e.panic_message().unwrap_or_default();
            assert!(msg.contains("its own key"), "{msg}");
        }
        other => panic!("expected the self-wait panic, got {other:?}"),
    }
}

/// A task of key 1 that waits, with `wait`, for the task of key 1 submitted just after it.
fn waiter<W>(s: &Arc<Serializer<u32>>, wait: W) -> (TaskHandle<()>, TaskHandle<u32>)
where
    W: FnOnce(TaskHandle<u32>) + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<TaskHandle<u32>>();
    let first = s
        .submit(1, move || {
            let later = rx.recv().unwrap();
            wait(later);
        })
        .unwrap();
    let later = s.submit(1, || 7).unwrap();
    // The waiter gets a handle to `later` through a second handle: submit it again for that.
    let copy = s.submit(1, || 8).unwrap();
    tx.send(copy).unwrap();
    (first, later)
}

#[test]
fn join_on_a_later_task_of_the_same_key_panics() {
    bounded(|| {
        for workers in [1, 2] {
            let s = Arc::new(Builder::<u32>::new().workers(workers).build().unwrap());
            let (first, later) = waiter(&s, |h| {
                let _ = h.join();
            });
            panicked_with_self_wait(first.join());
            assert_eq!(later.join().unwrap(), 7, "the key goes on");
        }
    });
}

#[test]
fn polling_the_handle_to_completion_panics_too() {
    bounded(|| {
        let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
        let (first, later) = waiter(&s, |h| {
            let _ = block_on(h);
        });
        panicked_with_self_wait(first.join());
        assert_eq!(later.join().unwrap(), 7);
    });
}

#[test]
fn awaiting_it_in_a_future_of_the_same_key_panics() {
    bounded(|| {
        let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
        let (tx, rx) = mpsc::channel::<TaskHandle<u32>>();
        let first = s
            .submit_async(1, async move {
                let later = rx.recv().unwrap();
                later.await.ok()
            })
            .unwrap();
        tx.send(s.submit(1, || 7).unwrap()).unwrap();
        panicked_with_self_wait(first.join());
    });
}

#[test]
fn from_a_task_on_the_keys_own_queue_too() {
    bounded(|| {
        let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
        // Paused with a backlog, then resumed: these run from the key's chain.
        s.pause(&1);
        let (first, later) = waiter(&s, |h| {
            let _ = h.join();
        });
        std::thread::sleep(Duration::from_millis(20));
        s.resume(&1);
        panicked_with_self_wait(first.join());
        assert_eq!(later.join().unwrap(), 7);
    });
}

#[test]
fn waiting_for_other_keys_and_for_finished_tasks_is_fine() {
    bounded(|| {
        let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
        let inner = s.clone();
        let r = s
            .submit(1, move || inner.submit(2, || 5).unwrap().join().unwrap())
            .unwrap();
        assert_eq!(r.join().unwrap(), 5);
        // A finished task of the same key: no wait, no panic.
        let done = s.submit(3, || 1).unwrap();
        while !done.is_finished() {
            std::thread::yield_now();
        }
        let r = s.submit(3, move || done.join().unwrap() + 1).unwrap();
        assert_eq!(r.join().unwrap(), 2);
    });
}
