//! Unit tests of the task nodes.
use super::*;
use crate::handle::TaskHandle;
use crate::test_util::{payload, quiet_panic, Drops, Quiet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A `submit`-style node and its handle.
fn joined<F, T>(f: F, kind: Kind, permits: Option<(Semaphore, usize)>) -> (TaskRef, TaskHandle<T>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let state = JoinState::new(Default::default());
    let handle = TaskHandle::new(state.clone());
    (TaskRef::new(Joined { f, state }, kind, permits), handle)
}

/// Runs `task` without permits; returns (panicked, what `done` was told).
fn run(task: TaskRef) -> (bool, Option<bool>) {
    let told = std::cell::Cell::new(None);
    let panicked = task.run(None, &|p| told.set(Some(p)));
    (panicked, told.get())
}

#[test]
fn a_node_runs_and_resolves_its_handle_with_the_value() {
    let drops = Drops::default();
    let captured = drops.make(20);
    let (task, h) = joined(
        move || {
            let c = captured;
            c.1 + 22
        },
        Kind::Plain,
        None,
    );
    assert_eq!(task.kind(), Kind::Plain);
    assert!(!h.is_finished());
    assert_eq!(run(task), (false, Some(false)));
    assert_eq!(
        drops.count(),
        1,
        "the closure's captures are dropped once, by the run"
    );
    assert!(h.is_finished());
    assert_eq!(h.join().unwrap(), 42);
}

#[test]
fn a_panic_resolves_panicked_with_its_payload() {
    let drops = Drops::default();
    let captured = drops.make(0);
    let (task, h) = joined(
        move || -> u8 {
            let _keep = captured;
            quiet_panic(7)
        },
        Kind::Plain,
        None,
    );
    assert_eq!(run(task), (true, Some(true)));
    assert_eq!(drops.count(), 1, "captures dropped once while unwinding");
    let p = payload(h.join().unwrap_err());
    assert_eq!(p.downcast_ref::<Quiet>(), Some(&Quiet(7)));
}

#[test]
fn a_string_panic_keeps_its_message() {
    crate::test_util::quiet_panics();
    let (task, h) = joined(
        || -> () { std::panic::panic_any(Quiet(1)) },
        Kind::Plain,
        None,
    );
    assert!(run(task).0);
    assert!(
        h.join().unwrap_err().panic_message().is_none(),
        "not a string payload"
    );
    let (task, h) = joined(|| -> () { panic!("quiet: boom {}", 42) }, Kind::Plain, None);
    assert!(run(task).0);
    assert_eq!(
        h.join().unwrap_err().panic_message(),
        Some("quiet: boom 42")
    );
}

#[test]
fn abandoning_resolves_cancelled_or_superseded_and_drops_the_closure_once() {
    for why in [Abandon::Cancelled, Abandon::Superseded] {
        let drops = Drops::default();
        let captured = drops.make(1);
        let ran = std::sync::Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let (task, h) = joined(
            move || {
                r.store(true, Ordering::SeqCst);
                let c = captured;
                c.1
            },
            Kind::Latest,
            None,
        );
        task.abandon(why);
        assert_eq!(drops.count(), 1);
        assert!(!ran.load(Ordering::SeqCst), "an abandoned task never runs");
        let e = h.join().unwrap_err();
        match why {
            Abandon::Cancelled => assert!(matches!(e, TaskError::Cancelled)),
            Abandon::Superseded => assert!(matches!(e, TaskError::Superseded)),
        }
    }
}

#[test]
fn dropping_a_task_ref_cancels_it() {
    let drops = Drops::default();
    let captured = drops.make(1);
    let (task, h) = joined(
        move || {
            let c = captured;
            c.1
        },
        Kind::Plain,
        None,
    );
    drop(task);
    assert_eq!(drops.count(), 1);
    assert!(matches!(h.join(), Err(TaskError::Cancelled)));
}

#[test]
fn a_node_dropped_by_its_chain_is_cancelled() {
    let (task, h) = joined(|| 5u8, Kind::Distinct, None);
    let raw = task.into_raw();
    // SAFETY: the node is live and nobody else owns it (as when a chain is dropped).
    assert_eq!(unsafe { TaskRef::kind_of(raw) }, Kind::Distinct);
    let link = <Header as Linked>::link(raw);
    // SAFETY: `link` is the node's own link, and the node is ours to give away.
    let back = unsafe { <Header as Linked>::from_link(link) };
    assert_eq!(back, raw);
    // SAFETY: we own the unqueued node exclusively and never touch it again.
    unsafe { <Header as Linked>::drop_queued(back) };
    assert!(matches!(h.join(), Err(TaskError::Cancelled)));
}

/// Makes a node from `f` and takes the closure back out of it, as a refused submission does.
fn handed_back<F, T>(f: F, kind: Kind, permits: Option<(Semaphore, usize)>) -> (F, TaskHandle<T>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (task, h) = joined(f, kind, permits);
    // SAFETY: `joined` made the node from exactly this `Joined<F, T>`.
    let job = unsafe { task.into_job::<Joined<F, T>>() };
    (job.f, h)
}

#[test]
fn into_job_hands_the_closure_back_without_resolving() {
    let drops = Drops::default();
    let captured = drops.make(9);
    let (f, h) = handed_back(
        move || {
            let c = captured;
            c.1 * 2
        },
        Kind::Plain,
        None,
    );
    assert!(!h.is_finished(), "handing the task back resolves nothing");
    assert_eq!(drops.count(), 0, "the closure came back whole");
    assert_eq!(f(), 18);
    assert_eq!(drops.count(), 1);

    // The same through a permit-gated node.
    let sem = Semaphore::new(1);
    let (f, h) = handed_back(|| "gated", Kind::Permits, Some((sem.clone(), 1)));
    assert_eq!(f(), "gated");
    assert!(!h.is_finished());
    assert_eq!(sem.available(), 1);
}

#[test]
fn detached_tasks_run_count_panics_and_drop_unrun() {
    let ran = std::sync::Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let task = TaskRef::new(
        Detached(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }),
        Kind::Plain,
        None,
    );
    assert_eq!(run(task), (false, Some(false)));
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    let task = TaskRef::new(Detached(|| quiet_panic(3)), Kind::Plain, None);
    assert_eq!(
        run(task),
        (true, Some(true)),
        "the payload is dropped, the panic counted"
    );

    let drops = Drops::default();
    let captured = drops.make(0);
    let task = TaskRef::new(Detached(move || drop(captured)), Kind::Plain, None);
    task.abandon(Abandon::Superseded);
    assert_eq!(drops.count(), 1);
}

#[test]
fn a_payload_whose_drop_panics_is_contained() {
    struct Nasty;
    impl Drop for Nasty {
        fn drop(&mut self) {
            quiet_panic(99);
        }
    }
    crate::test_util::quiet_panics();
    let task = TaskRef::new(
        Detached(|| std::panic::resume_unwind(Box::new(Nasty))),
        Kind::Plain,
        None,
    );
    assert_eq!(run(task), (true, Some(true)));
    // Directly, too.
    drop_payload(Box::new(Nasty));
}

#[test]
fn nodes_of_every_size_class_and_the_fallback_allocator_run_intact() {
    fn check<const N: usize>() {
        let mut data = [0u8; N];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 7 + N) as u8;
        }
        let (task, h) = joined(
            move || data.iter().map(|&b| b as usize).sum::<usize>(),
            Kind::Plain,
            None,
        );
        let want: usize = (0..N).map(|i| ((i * 7 + N) as u8) as usize).sum();
        assert!(!run(task).0);
        assert_eq!(h.join().unwrap(), want, "a {N}-byte capture survived");
    }
    // 64-, 128- and 256-byte classes, then beyond the classes (the global allocator). The
    // 512-byte class is left to `nodes`' tests, which count its depot's magazines.
    check::<8>();
    check::<90>();
    check::<200>();
    check::<600>();

    #[repr(align(64))]
    struct Wide([u8; 64]);
    let wide = Wide([3; 64]);
    let (task, h) = joined(
        move || {
            assert_eq!(std::ptr::addr_of!(wide) as usize % 64, 0);
            wide.0.iter().map(|&b| b as u32).sum::<u32>()
        },
        Kind::Plain,
        None,
    );
    assert!(!run(task).0);
    assert_eq!(
        h.join().unwrap(),
        192,
        "an over-aligned capture takes the fallback"
    );
}

#[test]
fn nodes_made_on_one_thread_run_on_another_and_recycle_back() {
    // Enough nodes to fill the runner's two magazines and send more to the depot.
    let n: u64 = if cfg!(miri) { 80 } else { 1000 };
    for _round in 0..2 {
        let (tasks, handles): (Vec<_>, Vec<_>) = (0..n)
            .map(|i| joined(move || i * 3, Kind::Plain, None))
            .unzip();
        let runner = std::thread::spawn(move || {
            for t in tasks {
                assert!(!t.run(None, &|_| {}));
            }
        });
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), i as u64 * 3);
        }
        runner.join().unwrap();
    }
}

#[test]
fn a_gated_node_holds_its_granted_permits_until_it_ends() {
    let sem = Semaphore::new(2);
    let inside = sem.clone();
    let (mut task, h) = joined(
        move || inside.available(),
        Kind::Permits,
        Some((sem.clone(), 2)),
    );
    let (wants, n) = task.permits().expect("a gated node knows its request");
    assert_eq!((wants.capacity(), n), (2, 2));
    assert!(task.take_granted().is_none(), "nothing granted yet");
    task.set_granted(sem.try_acquire(2).unwrap());
    assert_eq!(sem.available(), 0);
    let seen = sem.clone();
    let panicked = task.run(None, &|_| {
        assert_eq!(seen.available(), 2, "permits released before `done`");
    });
    assert!(!panicked);
    assert_eq!(h.join().unwrap(), 0, "the task ran holding both permits");
    assert_eq!(sem.available(), 2);

    // Abandoned with permits granted: they go back, the handle is cancelled.
    let (mut task, h) = joined(|| (), Kind::Permits, Some((sem.clone(), 1)));
    task.set_granted(sem.try_acquire(1).unwrap());
    assert_eq!(sem.available(), 1);
    task.abandon(Abandon::Cancelled);
    assert_eq!(sem.available(), 2);
    assert!(matches!(h.join(), Err(TaskError::Cancelled)));

    // A permit passed to `run` directly (not granted while waiting) is released too.
    let (task, h) = joined(|| 1, Kind::Plain, None);
    assert!(task.permits().is_none());
    assert!(!task.run(Some(sem.try_acquire(2).unwrap()), &|_| {}));
    assert_eq!(sem.available(), 2);
    assert_eq!(h.join().unwrap(), 1);
}

#[test]
fn a_panicking_gated_task_releases_its_permits() {
    let sem = Semaphore::new(1);
    let (mut task, h) = joined(
        || -> u8 { quiet_panic(5) },
        Kind::Permits,
        Some((sem.clone(), 1)),
    );
    task.set_granted(sem.try_acquire(1).unwrap());
    assert!(task.run(None, &|p| assert!(p)));
    assert_eq!(sem.available(), 1);
    assert_eq!(
        payload(h.join().unwrap_err()).downcast_ref::<Quiet>(),
        Some(&Quiet(5))
    );
}

#[test]
fn a_plain_node_is_its_header_plus_the_closure() {
    let captured = [0u64; 3];
    let f = move || {
        std::hint::black_box(captured);
    };
    type N<F> = Node<Detached<F>, ()>;
    fn size<F>(_: &F) -> usize {
        std::mem::size_of::<N<F>>()
    }
    assert_eq!(size(&f), 24 + 24, "fits the 64-byte node class");
}
