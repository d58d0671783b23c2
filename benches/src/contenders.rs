//! The rows of every table: keyserial and each baseline, built on demand.
//!
//! [`KeyedExecutor`] has a generic `submit`, so it is not object-safe; code that runs "each
//! contender" passes a [`Visit`]or, which [`Contender::visit`] calls with a freshly built executor of
//! the concrete type for a workload (dropped, threads joined, when the visit returns).

use crate::exec::KeyedExecutor;
use crate::inline::Inline;
use crate::keyserial_exec::KeyserialExec;
use crate::lanes::Lanes;
use crate::striped::Striped;
use crate::thread_per_key::ThreadPerKey;
use crate::tokio_actor::TokioActor;
use crate::tokio_chain::TokioChain;
use crate::tokio_mutex::TokioMutex;
use crate::unordered::Unordered;
use crate::workloads::Workload;

/// The queue bound of the `keyserial_bounded` row.
pub const BOUNDED_CAPACITY: usize = 16_384;

/// Largest number of keys thread-per-key is run with (one OS thread each).
pub const THREAD_PER_KEY_MAX: usize = 1_024;

/// Something to do with an executor of any type.
pub trait Visit {
    /// The result.
    type Out;
    /// Does it with `exec`.
    fn visit<E: KeyedExecutor>(self, exec: &E) -> Self::Out;
}

/// One contender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// keyserial's `Serializer<u64>` (see `keyserial_exec`), default settings: the headline row.
    Keyserial,
    /// The same with `capacity(`[`BOUNDED_CAPACITY`]`)`: submitters wait while that many tasks
    /// are queued (the setting for floods of one-shot keys).
    KeyserialBounded,
    /// Tasks run inside `submit` on the submitting thread.
    Inline,
    /// An OS thread per key.
    ThreadPerKey,
    /// Keys hashed onto `workers` single-thread lanes.
    Lanes1x,
    /// Keys hashed onto `4 × workers` single-thread lanes.
    Lanes4x,
    /// Global `Mutex<HashMap<K, VecDeque<Task>>>` and a pool.
    Striped,
    /// A tokio actor per key.
    TokioActor,
    /// A tokio `Mutex` per key, each future a spawned task holding it (W7 only).
    TokioMutex,
    /// A keyed chain on tokio: a map key → queue of futures, one drainer task per busy key
    /// (W7 and W8 only).
    TokioChain,
    /// A plain pool on one channel (not a serializer).
    Unordered,
}

impl Contender {
    /// The baselines, in table order.
    pub const BASELINES: [Contender; 9] = [
        Contender::Inline,
        Contender::ThreadPerKey,
        Contender::Lanes1x,
        Contender::Lanes4x,
        Contender::Striped,
        Contender::TokioActor,
        Contender::TokioMutex,
        Contender::TokioChain,
        Contender::Unordered,
    ];

    /// Every contender this build can run, keyserial first when it is built in.
    pub fn all() -> Vec<Contender> {
        let mut v = Vec::new();
        if Self::keyserial_available() {
            v.push(Contender::Keyserial);
            v.push(Contender::KeyserialBounded);
        }
        v.extend(Self::BASELINES);
        v
    }

    /// The rows of the compare program's default run: keyserial and the designs a user would
    /// pick instead. Not the two references, which no user would pick as a serializer: `inline`
    /// (the work's own cost) and `unordered` (a handoff that keeps no order).
    pub fn picks() -> Vec<Contender> {
        Self::all()
            .into_iter()
            .filter(|c| !c.is_reference())
            .collect()
    }

    /// `inline` and `unordered`: floors to read the others against, not serializers.
    pub fn is_reference(self) -> bool {
        matches!(self, Contender::Inline | Contender::Unordered)
    }

    /// Whether the keyserial adapter is part of this build.
    pub fn keyserial_available() -> bool {
        KEYSERIAL
    }

    /// Stable id (table row, criterion benchmark id, JSON).
    pub fn id(self) -> &'static str {
        match self {
            Contender::Keyserial => "keyserial",
            Contender::KeyserialBounded => "keyserial_bounded",
            Contender::Inline => "inline",
            Contender::ThreadPerKey => "thread_per_key",
            Contender::Lanes1x => "lanes_1x",
            Contender::Lanes4x => "lanes_4x",
            Contender::Striped => "striped",
            Contender::TokioActor => "tokio_actor",
            Contender::TokioMutex => "tokio_mutex",
            Contender::TokioChain => "tokio_chain",
            Contender::Unordered => "unordered",
        }
    }

    /// Parses an id.
    pub fn from_id(id: &str) -> Option<Contender> {
        Self::BASELINES
            .into_iter()
            .chain([Contender::Keyserial, Contender::KeyserialBounded])
            .find(|c| c.id() == id)
    }

    /// One line on what the contender is, for the legend.
    pub fn describe(self, workers: usize) -> String {
        match self {
            Contender::Keyserial => format!(
                "keyserial::Serializer<u64>, {workers} workers, execute() (W7, W8: execute_async(), \
                 with tokio_handle on the runtime below)"
            ),
            Contender::KeyserialBounded => format!(
                "the same with .capacity({BOUNDED_CAPACITY}): submit waits while that many tasks are queued"
            ),
            Contender::Inline => "each task run inside submit() on the submitting thread (the work's own cost)".into(),
            Contender::ThreadPerKey => "one OS thread + crossbeam channel per key".into(),
            Contender::Lanes1x => format!("key hash onto {workers} single-thread lanes (crossbeam channel each)"),
            Contender::Lanes4x => format!("key hash onto {} single-thread lanes", 4 * workers),
            Contender::Striped => format!(
                "global Mutex<HashMap<key, VecDeque<task>>> + {workers} workers (StripedExecutorService design)"
            ),
            Contender::TokioActor => {
                "tokio actor per key (unbounded mpsc + spawned task; W7, W8: awaits each future)".into()
            }
            Contender::TokioMutex => "W7: map of Arc<tokio::sync::Mutex<()>> per key, each future \
                 spawned and holding its key's lock (order checked, not promised)"
                .into(),
            Contender::TokioChain => "W7, W8: keyed chain on tokio: sharded map key -> queue of \
                 boxed futures, one drainer task per busy key, removed when its queue empties"
                .into(),
            Contender::Unordered => format!(
                "{workers} workers on one crossbeam channel, no order (floor of a handoff)"
            ),
        }
    }

    /// Whether the contender promises per-key order, so that an order violation fails the run.
    /// Not the unordered pool, and not `tokio_mutex`: a mutex per key excludes, but its lock
    /// order is the order its tasks first poll, not quite the order they were spawned.
    pub fn is_ordered(self) -> bool {
        !matches!(self, Contender::Unordered | Contender::TokioMutex)
    }

    /// Whether the contender's runs are order-checked and their violations shown: every
    /// contender but the unordered pool (`tokio_mutex`'s are reported, not fatal).
    pub fn is_order_checked(self) -> bool {
        self != Contender::Unordered
    }

    /// Whether the contender runs `w` at all (a row of `w`'s table). W7's and W8's futures only
    /// run on executors that hold no thread while a future is pending; `tokio_mutex` runs W7
    /// only, `tokio_chain` W7 and W8; W8 (latency) runs on keyserial and the two ordered tokio
    /// designs; `keyserial_bounded` runs where the bound matters: where tasks create keys faster
    /// than workers retire them (W3, W6), where several producers outrun the workers and wait
    /// on it together (W5), and where one submitter outruns the workers with futures (W7).
    pub fn runs_on(self, w: &Workload) -> bool {
        match (self, w.group()) {
            (
                Contender::Keyserial
                | Contender::KeyserialBounded
                | Contender::TokioActor
                | Contender::TokioMutex
                | Contender::TokioChain,
                "W7",
            ) => true,
            (Contender::Keyserial | Contender::TokioActor | Contender::TokioChain, "W8") => true,
            (_, "W7" | "W8") | (Contender::TokioMutex | Contender::TokioChain, _) => false,
            (Contender::KeyserialBounded, g) => matches!(g, "W3" | "W5" | "W6" | "W7"),
            _ => true,
        }
    }

    /// Whether keyserial's ratios are taken against this contender: the ordered designs people
    /// write by hand (thread per key, lanes, striped, tokio actors, the keyed chain on tokio).
    /// Not keyserial's own rows, not `inline` (the work's own cost), not the unordered pool and
    /// not `tokio_mutex` (neither promises order).
    pub fn is_ordered_baseline(self) -> bool {
        matches!(
            self,
            Contender::ThreadPerKey
                | Contender::Lanes1x
                | Contender::Lanes4x
                | Contender::Striped
                | Contender::TokioActor
                | Contender::TokioChain
        )
    }

    /// Why the contender is not run on `w`, if it is not.
    pub fn skip_reason(self, w: &Workload) -> Option<String> {
        match self {
            _ if !self.runs_on(w) => Some(format!("not run on {}", w.group())),
            Contender::ThreadPerKey if w.keys() > THREAD_PER_KEY_MAX => {
                Some(format!("skipped ({} threads)", w.keys()))
            }
            Contender::Keyserial | Contender::KeyserialBounded if !KEYSERIAL => {
                Some("not built".into())
            }
            _ => None,
        }
    }

    /// Builds the contender with `workers` pool threads, as it runs workload `w`, and hands it
    /// to `v`. keyserial's rows get a tokio runtime handle for the workloads of futures only
    /// (W7, W8: the tokio rows' runtime configuration); for closures they are built as before.
    pub fn visit<V: Visit>(self, workers: usize, w: &Workload, v: V) -> V::Out {
        let workers = workers.max(1);
        let tokio = w.is_async();
        match self {
            Contender::Keyserial => visit_keyserial(workers, None, tokio, v),
            Contender::KeyserialBounded => {
                visit_keyserial(workers, Some(BOUNDED_CAPACITY), tokio, v)
            }
            Contender::Inline => v.visit(&Inline::new()),
            Contender::ThreadPerKey => v.visit(&ThreadPerKey::new()),
            Contender::Lanes1x => v.visit(&Lanes::new("lanes_1x", workers)),
            Contender::Lanes4x => v.visit(&Lanes::new("lanes_4x", 4 * workers)),
            Contender::Striped => v.visit(&Striped::new(workers)),
            Contender::TokioActor => v.visit(&TokioActor::new(workers)),
            Contender::TokioMutex => v.visit(&TokioMutex::new(workers)),
            Contender::TokioChain => v.visit(&TokioChain::new(workers)),
            Contender::Unordered => v.visit(&Unordered::new(workers)),
        }
    }
}

// Whether the keyserial row is built in (it is; kept as a switch for builds of the baselines alone).
const KEYSERIAL: bool = true;

fn visit_keyserial<V: Visit>(workers: usize, capacity: Option<usize>, tokio: bool, v: V) -> V::Out {
    v.visit(&KeyserialExec::new(workers, capacity, tokio))
}

/// The number of pool threads to use by default: the machine's available parallelism.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
