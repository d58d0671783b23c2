//! A sleep future without a runtime: the retry backoff of an entry's task waits here, holding
//! no worker thread.
//!
//! # Protocol
//!
//! One timer thread per process, started on first use, keeps a heap of `(deadline, waker)`
//! under a mutex and waits on a condvar until the earliest deadline (or a new, earlier one). A
//! [`Sleep`] registers its waker on each poll before its deadline (a later poll registers again:
//! a stale waker only costs a spurious wake-up, which the poll tolerates by checking the clock),
//! and is ready once `Instant::now()` reached its deadline. The thread wakes every waker whose
//! deadline passed, after releasing the lock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

struct Due {
    at: Instant,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Timer {
    heap: Mutex<(BinaryHeap<Reverse<Due>>, u64)>,
    cv: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("keyserial-redis-timer".into())
            .spawn(move || t.run())
            .expect("spawn the keyserial-redis timer thread");
        t
    })
}

impl Timer {
    fn run(&self) {
        let mut due = Vec::new();
        loop {
            {
                let mut g = self.heap.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let now = Instant::now();
                    while g.0.peek().is_some_and(|Reverse(d)| d.at <= now) {
                        if let Some(Reverse(d)) = g.0.pop() {
                            due.push(d.waker);
                        }
                    }
                    if !due.is_empty() {
                        break;
                    }
                    g = match g.0.peek() {
                        Some(Reverse(d)) => {
                            let wait = d.at.saturating_duration_since(now);
                            self.cv
                                .wait_timeout(g, wait)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                        None => self.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                    };
                }
            }
            for w in due.drain(..) {
                w.wake();
            }
        }
    }

    fn register(&self, at: Instant, waker: Waker) {
        let mut g = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        g.1 += 1;
        let seq = g.1;
        let earliest = g.0.peek().is_none_or(|Reverse(d)| at < d.at);
        g.0.push(Reverse(Due { at, seq, waker }));
        drop(g);
        if earliest {
            self.cv.notify_one();
        }
    }
}

/// Ready once `d` has passed since it was made.
pub(crate) struct Sleep {
    at: Instant,
}

pub(crate) fn sleep(d: Duration) -> Sleep {
    Sleep {
        at: Instant::now() + d,
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        timer().register(self.at, cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn sleeps_run_in_deadline_order_and_not_early() {
        let s: keyserial::Serializer<u32> =
            keyserial::Serializer::builder().workers(1).build().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let mut hs = Vec::new();
        for (k, ms) in [(1u32, 60u64), (2, 20), (3, 40)] {
            let log = Arc::clone(&log);
            hs.push(
                s.submit_async(k, async move {
                    sleep(Duration::from_millis(ms)).await;
                    log.lock().unwrap().push((k, started.elapsed()));
                })
                .unwrap(),
            );
        }
        for h in hs {
            h.join().unwrap();
        }
        let log = log.lock().unwrap();
        assert_eq!(log.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [2, 3, 1]);
        for ((_, at), ms) in log.iter().zip([20, 40, 60]) {
            assert!(
                *at >= Duration::from_millis(ms),
                "woke at {at:?}, due {ms} ms"
            );
        }
    }
}
