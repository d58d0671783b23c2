//! Resident memory of this process, for W3's peak-RSS column.
//!
//! `VmHWM` is a per-process high-water mark that never goes down, so it cannot tell one row of a
//! table from the next. Instead a background thread samples the current `VmRSS` every few
//! milliseconds during a run; the peak minus the RSS just before the run is the run's footprint.
//! Before taking that starting point, [`trim_heap`] asks glibc to give freed memory back to the
//! kernel, so a row does not look cheap merely because an earlier row left free heap behind.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Current resident set size in bytes (`VmRSS` from `/proc/self/status`), if available.
pub fn current_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Returns freed heap memory to the kernel where the allocator supports it (glibc); a no-op
/// elsewhere.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: `malloc_trim` only releases free memory of glibc's arenas; it has no
        // preconditions.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// Samples the RSS on a background thread until [`stop`](Self::stop).
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    start: u64,
}

impl RssSampler {
    /// Trims the heap, records the current RSS as the starting point and starts sampling every
    /// `every`.
    pub fn start(every: Duration) -> Self {
        trim_heap();
        let start = current_rss().unwrap_or(0);
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(start));
        let thread = {
            let stop = stop.clone();
            let peak = peak.clone();
            std::thread::Builder::new()
                .name("rss-sampler".into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        if let Some(rss) = current_rss() {
                            peak.fetch_max(rss, Ordering::AcqRel);
                        }
                        std::thread::sleep(every);
                    }
                })
                .expect("spawn sampler")
        };
        RssSampler {
            stop,
            peak,
            thread: Some(thread),
            start,
        }
    }

    /// Stops sampling; returns the peak RSS above the starting point, in bytes.
    pub fn stop(mut self) -> u64 {
        self.finish()
    }

    fn finish(&mut self) -> u64 {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(rss) = current_rss() {
            self.peak.fetch_max(rss, Ordering::AcqRel);
        }
        self.peak.load(Ordering::Acquire).saturating_sub(self.start)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_a_large_allocation() {
        if current_rss().is_none() {
            return; // not Linux
        }
        let sampler = RssSampler::start(Duration::from_millis(1));
        let v = vec![1u8; 64 << 20];
        std::thread::sleep(Duration::from_millis(20));
        let peak = sampler.stop();
        assert!(std::hint::black_box(&v).len() == 64 << 20);
        assert!(peak >= 48 << 20, "peak {peak}");
    }
}
