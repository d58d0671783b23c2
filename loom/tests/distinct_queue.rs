//! Loom models of the distinct queue (std-executor/src/distinct.rs) over the real code: an item
//! completed while another thread re-adds it (never lost, never duplicated), and blocked takers
//! woken by adds (a lost wakeup would be a deadlock, which loom reports).
#![cfg(loom)]

use keyserial::DistinctQueue;
use loom::thread;

#[test]
fn complete_races_a_re_add() {
    loom::model(|| {
        let q = DistinctQueue::new();
        assert!(q.add(1u8));
        let batch = q.take(1).unwrap();
        let completer = thread::spawn(move || batch.complete());
        let added = q.add(1);
        completer.join().unwrap();
        assert!(q.in_progress().is_empty());
        if added {
            // The re-add came after the completion: queued once.
            assert_eq!(q.queued(), vec![1]);
            assert!(!q.add(1));
        } else {
            // The re-add came while it was in progress: rejected, and now it is gone.
            assert!(q.queued().is_empty());
            assert!(q.add(1));
        }
    });
}

#[test]
fn fail_races_a_re_add() {
    loom::model(|| {
        let q = DistinctQueue::new();
        assert!(q.add(1u8));
        let batch = q.take(1).unwrap();
        let failer = thread::spawn(move || batch.fail());
        // Queued or in progress at every moment: always a duplicate.
        assert!(!q.add(1));
        failer.join().unwrap();
        assert_eq!(q.queued(), vec![1]);
        assert!(q.in_progress().is_empty());
    });
}

#[test]
fn a_blocked_taker_is_woken_by_an_add() {
    loom::model(|| {
        let q = DistinctQueue::new();
        let taker = {
            let q = q.clone();
            thread::spawn(move || {
                let b = q.take(4).expect("not closed");
                let items = b.to_vec();
                b.complete();
                items
            })
        };
        assert!(q.add(7u8));
        assert_eq!(taker.join().unwrap(), vec![7]);
        assert!(q.is_empty() && q.in_progress().is_empty());
    });
}

#[test]
fn two_takers_share_two_items() {
    loom::model(|| {
        let q = DistinctQueue::new();
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || {
                    let b = q.take(1).expect("not closed");
                    let item = b[0];
                    b.complete();
                    item
                })
            })
            .collect();
        assert!(q.add_all([1u8, 2]).is_empty());
        let mut got: Vec<u8> = takers.into_iter().map(|t| t.join().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    });
}

#[test]
fn close_wakes_a_blocked_taker() {
    loom::model(|| {
        let q: DistinctQueue<u8> = DistinctQueue::new();
        let taker = {
            let q = q.clone();
            thread::spawn(move || q.take(1).map(|b| b.to_vec()))
        };
        q.close();
        assert_eq!(taker.join().unwrap(), None);
    });
}

#[test]
fn a_dropped_take_future_passes_its_wakeup_on() {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    loom::model(|| {
        let q = DistinctQueue::new();
        let (wa, wb) = (
            std::sync::Arc::new(Count::default()),
            std::sync::Arc::new(Count::default()),
        );
        let (ka, kb) = (Waker::from(wa.clone()), Waker::from(wb.clone()));
        let mut a = Box::pin(q.take_async(1));
        let mut b = Box::pin(q.take_async(1));
        assert!(Pin::new(&mut a)
            .poll(&mut Context::from_waker(&ka))
            .is_pending());
        assert!(Pin::new(&mut b)
            .poll(&mut Context::from_waker(&kb))
            .is_pending());
        let adder = {
            let q = q.clone();
            thread::spawn(move || assert!(q.add(5u8)))
        };
        // `a` gives up, possibly after being woken for the item.
        drop(a);
        adder.join().unwrap();
        assert!(
            wb.0.load(Ordering::SeqCst) >= 1,
            "the wakeup reached the remaining taker"
        );
        match Pin::new(&mut b).poll(&mut Context::from_waker(&kb)) {
            Poll::Ready(Some(batch)) => assert_eq!(&*batch, [5]),
            _ => panic!("the remaining taker gets the item"),
        }
    });
}
