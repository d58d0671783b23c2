//! The boundary for user code: every place where keyserial calls code it did not write goes
//! through one of these functions, so that a panic there is caught where it happens and leaves
//! every slot, phase, lane, claim and handle as it would be without it.
//!
//! # Where user code runs
//!
//! | User code | Where | If it panics |
//! |---|---|---|
//! | a task's closure | `task.rs` (`Detached`/`Joined::run`) | the handle resolves `Panicked`; counted in `Stats::panicked` |
//! | a task's output's `Drop`, a panic payload's `Drop` (handle gone) | `task.rs`, [`drop_quietly`] | caught and dropped; the task counts as it ended |
//! | a capture's `Drop` when a task is abandoned (superseded, cancelled, handed back and dropped) | `task.rs`, `lane_task.rs`, [`drop_quietly`] | caught; the handle still resolves `Superseded`/`Cancelled` |
//! | a waker's `wake` and `Drop` | `handle.rs`, [`call_quietly`] | caught; the handle is resolved before the waker runs |
//! | the key's `Hash` on a worker (the lane's owner hashes a popped key again) | `lanes.rs` (`Lane::pop`), [`catch`] | that task resolves `Panicked` with the key's payload; the key's later tasks go on |
//! | the key's `Eq`/`Hash`/`Clone` on a worker while routing a tracked key | `route.rs`, [`catch`] | as for `Hash` |
//! | the key's `Clone` while handing tasks back (`shutdown_now`) | `serializer/shutdown.rs` (`drain_into`), [`catch`] | that task resolves `Panicked` and is not handed back |
//! | the key's `Drop` after a task run straight from a lane | `worker/serve.rs`, [`drop_quietly`] | caught |
//! | a semaphore's granted callback, run when a task's permits are released | `task.rs`, `worker/chain.rs`, [`drop_quietly`] | caught on the worker (the semaphore runs every callback first) |
//! | the key's `Hash`/`Eq`/`Clone` on the submitting thread | `serializer/admit.rs` (`admit`) | the panic reaches the caller, as a `HashMap::insert` would; the capacity slot is given back ([`crate::capacity::Reservation`]), nothing was admitted |
//!
//! Two places call the key's `Eq`/`Clone` while holding one of our locks, because the check and
//! the insert must be one step: `submit_distinct`'s claim (`claims.rs`) and `submit_latest`'s
//! offer (`latest_cells.rs`). Both run on the submitting thread, compare or clone before they
//! change anything under the lock, and so leave the locked map as it was when the user's code
//! unwinds; `lock` ignores the poisoning that unwinding leaves. A third, on a worker: a
//! deferral's runner routes an item under the deferral's lock (`worker/serve.rs`, `run_deferral`),
//! so that the item leaves the deferral only once it is placed; the routing's key code is
//! caught inside `route` and never unwinds through that lock.
//!
//! Not guarded: a key's `Drop` when the key table frees an entry (inside crossbeam-epoch's
//! deferred frees, on whichever thread collects them); a key type whose `Drop` panics is not
//! supported there.
//!
//! A panic caught where no handle exists to carry it (a `Drop` of an abandoned `execute` task,
//! a waker) is reported only by the panic hook's message, as a panic on a thread of one's own
//! would be.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a caught panic carries.
pub(crate) type Payload = Box<dyn Any + Send>;

/// Runs user code `f`, catching a panic.
///
/// Everything `f` touches is either the user's own (a key it only borrows) or left unchanged
/// when it unwinds; callers say why at each call.
#[inline(always)]
pub(crate) fn catch<R>(f: impl FnOnce() -> R) -> Result<R, Payload> {
    catch_unwind(AssertUnwindSafe(f))
}

/// Drops `value`, whose `Drop` is user code, catching a panic (and one from the payload's own
/// `Drop`).
#[inline(always)]
pub(crate) fn drop_quietly<T>(value: T) {
    if std::mem::needs_drop::<T>() {
        if let Err(payload) = catch(move || drop(value)) {
            drop_payload(payload);
        }
    }
}

/// Calls user code `f` for its effect only (a waker), catching a panic.
#[inline(always)]
pub(crate) fn call_quietly(f: impl FnOnce()) {
    if let Err(payload) = catch(f) {
        drop_payload(payload);
    }
}

/// Drops a panic payload, swallowing a panic from the payload's own destructor (and from the
/// payloads of those, a few deep; past that the last one is leaked rather than dropped).
pub(crate) fn drop_payload(payload: Payload) {
    let mut payload = payload;
    for _ in 0..4 {
        match catch(move || drop(payload)) {
            Ok(()) => return,
            Err(again) => payload = again,
        }
    }
    std::mem::forget(payload);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::test_util::quiet_panic;

    struct Nasty(u32);
    impl Drop for Nasty {
        fn drop(&mut self) {
            quiet_panic(self.0);
        }
    }

    #[test]
    fn catch_returns_the_value_or_the_payload() {
        crate::test_util::quiet_panics();
        assert_eq!(catch(|| 7).ok(), Some(7));
        let p = catch(|| -> u8 { quiet_panic(3) }).unwrap_err();
        assert!(p.is::<crate::test_util::Quiet>());
    }

    #[test]
    fn drops_and_calls_that_panic_are_contained() {
        crate::test_util::quiet_panics();
        drop_quietly(Nasty(1));
        drop_quietly(Some(Nasty(2)));
        call_quietly(|| quiet_panic(4));
        // A payload whose own drop panics.
        drop_payload(Box::new(Nasty(5)));
        let mut ran = false;
        call_quietly(|| ran = true);
        assert!(ran);
    }
}
