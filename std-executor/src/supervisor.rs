//! The elastic pool's supervisor: starts an extra worker when ready work has waited beyond a
//! short threshold while every worker was busy or blocked (GatlingExecutor's elastic pool).
//!
//! Submitters that find no worker searching or asleep stamp `starved_since` (once) and unpark the
//! supervisor; it then checks every couple of milliseconds. `STARVED_MS` after the stamp it clears
//! the stamp, and if work is still visible and still no worker is idle, it starts an extra worker
//! (up to `max_workers`). Extra workers exit after `worker_keep_alive` without work. The
//! supervisor exists only when `max_workers > workers`, holds only a weak reference, and exits
//! when the serializer terminates.
//!
//! # Clearing the stamp
//!
//! A submit that finds the stamp already set stamps nothing, so a clear must not undo it: the
//! supervisor clears first (a swap), then does an RMW on the sleep word ([`Sleep::fence`]), then
//! looks at the queues and the idle count ([`stamp_expired`]). The submit's `notify` is an RMW on
//! the same word after its push. If the notify comes first in that word's order, the supervisor's
//! look sees the pushed work; if the fence comes first, the notify happens-after the clear and its
//! `starving` finds the stamp 0 and sets it. (Looking first and clearing after, as before, lost
//! the stamp when the push and its notify fell in between.) Checked by `loom/tests/starvation.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::shared::Shared;
use crate::sleep::Sleep;
use crate::sync::{lock, AtomicU64, Ordering, Parker};

/// How long ready work must wait with every worker busy before an extra worker starts.
const STARVED_MS: u64 = 5;

pub(crate) fn spawn<K>(shared: &Arc<Shared<K>>) -> std::io::Result<()>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let parker = Parker::new();
    shared.lifecycle().set_supervisor(parker.unparker().clone());
    let weak = Arc::downgrade(shared);
    let name = format!("{}-supervisor", shared.config().thread_name);
    let handle = std::thread::Builder::new().name(name).spawn(move || loop {
        let Some(sh) = weak.upgrade() else { return };
        if sh.lifecycle().is_terminated() || sh.lifecycle().is_stopped() {
            return;
        }
        let starved = sh.starved_since().load(Ordering::Acquire);
        // While lanes hold items, look often: an owner may get stuck in a task after the
        // submits behind it found it busy (and so stamped nothing).
        let wait = if starved != 0 {
            2
        } else if sh.lanes().queued_anywhere() {
            5
        } else {
            200
        };
        drop(sh);
        parker.park_timeout(Duration::from_millis(wait));
        let Some(sh) = weak.upgrade() else { return };
        let starved = sh.starved_since().load(Ordering::Acquire);
        if starved == 0 && !sh.lanes().watch_busy().is_empty() && !sh.sleep().has_idle_worker() {
            // Items wait behind an owner inside a task, and no worker is idle to take the
            // lane over: start the clock.
            sh.starving();
            continue;
        }
        if starved == 0 || sh.now_ms().saturating_sub(starved) < STARVED_MS {
            continue;
        }
        if !stamp_expired(sh.starved_since(), sh.sleep(), || sh.has_visible_work())
            || sh.lifecycle().is_shutdown()
        {
            continue;
        }
        let cfg = &sh.config();
        if let Some(i) = (cfg.workers..cfg.max_workers).find(|&i| {
            !sh.slots()[i].alive.load(Ordering::Acquire) && lock(&sh.slots()[i].local).is_some()
        }) {
            let _ = crate::worker::spawn(&sh, i);
        }
    })?;
    shared.lifecycle().add_thread(handle);
    Ok(())
}

/// The stamp is `STARVED_MS` old: clears it, then returns `true` if an extra worker should
/// start (work is visible and no worker is idle). Clearing comes first, with an RMW on the sleep
/// word between it and the look (see "Clearing the stamp" in the module docs).
pub fn stamp_expired(stamp: &AtomicU64, sleep: &Sleep, visible: impl FnOnce() -> bool) -> bool {
    stamp.swap(0, Ordering::AcqRel);
    sleep.fence();
    visible() && !sleep.has_idle_worker()
}

/// Wakes the supervisor so it notices termination.
pub(crate) fn stop<K>(shared: &Shared<K>) {
    shared.lifecycle().wake_supervisor();
}
