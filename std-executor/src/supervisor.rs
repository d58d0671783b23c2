//! The elastic pool's supervisor: starts an extra worker when ready work has waited beyond a
//! short threshold while every worker was busy or blocked (GatlingExecutor's elastic pool).
//!
//! Submitters that find no worker searching or asleep stamp `starved_since` (once) and unpark the
//! supervisor; it then checks every couple of milliseconds. If, `STARVED_MS` after the stamp, work
//! is still visible and still no worker is idle, it starts an extra worker (up to `max_workers`)
//! and clears the stamp; if a worker became idle or the work is gone, it just clears the stamp.
//! Extra workers exit after `worker_keep_alive` without work. The supervisor exists only when
//! `max_workers > workers`, holds only a weak reference, and exits when the serializer terminates.

use std::sync::Arc;
use std::time::Duration;

use crate::shared::Shared;
use crate::sync::{lock, Ordering, Parker};

/// How long ready work must wait with every worker busy before an extra worker starts.
const STARVED_MS: u64 = 5;

pub(crate) fn spawn<K>(shared: &Arc<Shared<K>>) -> std::io::Result<()>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let parker = Parker::new();
    *lock(&shared.supervisor) = Some(parker.unparker().clone());
    let weak = Arc::downgrade(shared);
    let name = format!("{}-supervisor", shared.config.thread_name);
    let handle = std::thread::Builder::new().name(name).spawn(move || loop {
        let Some(sh) = weak.upgrade() else { return };
        if *lock(&sh.terminated) || sh.stop.load(Ordering::Acquire) {
            return;
        }
        let starved = sh.starved_since.load(Ordering::Acquire);
        let wait = if starved != 0 { 2 } else { 200 };
        drop(sh);
        parker.park_timeout(Duration::from_millis(wait));
        let Some(sh) = weak.upgrade() else { return };
        let starved = sh.starved_since.load(Ordering::Acquire);
        if starved == 0 || sh.now_ms().saturating_sub(starved) < STARVED_MS {
            continue;
        }
        if sh.sleep.has_idle_worker()
            || !sh.has_visible_work()
            || sh.shutdown.load(Ordering::Acquire)
        {
            sh.starved_since.store(0, Ordering::Release);
            continue;
        }
        let cfg = &sh.config;
        if let Some(i) = (cfg.workers..cfg.max_workers).find(|&i| {
            !sh.slots[i].alive.load(Ordering::Acquire) && lock(&sh.slots[i].local).is_some()
        }) {
            let _ = crate::worker::spawn(&sh, i);
        }
        sh.starved_since.store(0, Ordering::Release);
    })?;
    lock(&shared.threads).push(handle);
    Ok(())
}

/// Wakes the supervisor so it notices termination.
pub(crate) fn stop<K>(shared: &Shared<K>) {
    if let Some(u) = lock(&shared.supervisor).as_ref() {
        u.unpark();
    }
}
