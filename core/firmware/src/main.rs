//! keyserial-core's `FixedSerializer` on a bare microcontroller, checked on the target itself.
//!
//! One `static` serializer, `FixedSerializer<u8, Cmd, 16, 64>`, is fed from two places at once:
//! a periodic timer interrupt (SysTick on Arm, the CLINT machine timer on RISC-V) submits tasks
//! for all keys and now and then runs a few, while the main loop submits its own tasks in bursts
//! and runs them. Both use 20 keys, more than the 16 that can be live at once, and bursts larger
//! than the 64 task slots, so both refusals (`KeysFull`, `TasksFull`) happen; a refused task
//! must come back whole and is submitted again later.
//!
//! Every task carries its key, its submitter and its sequence number within that submitter's
//! stream of that key. The task body checks, on the target:
//! - it was handed out under its own key;
//! - no other task of its key is running (the interrupt's `run` can preempt the main loop's);
//! - it is the next one of its stream (per-key submission order, nothing lost or doubled).
//!
//! At the end every stream's count of run tasks must equal its count of accepted submissions,
//! nothing may be queued or live, and the timer must have interrupted both `submit` and `run`
//! calls. The firmware prints one summary line through semihosting and exits 0 or 1.
#![no_std]
#![no_main]

use core::cell::RefCell;
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use critical_section::Mutex;
use keyserial_core::fixed::{FixedSerializer, RefuseReason, Refused};

#[cfg(target_arch = "arm")]
mod arm;
#[cfg(target_arch = "arm")]
use arm as arch;
#[cfg(target_arch = "riscv32")]
mod riscv;
#[cfg(target_arch = "riscv32")]
use riscv as arch;

use arch::println;

/// What the application runs: a key's command, identified by who submitted it and its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cmd {
    key: u8,
    src: u8,
    seq: u16,
}

/// Keys live at once / tasks queued at once.
const KEYS: usize = 16;
const TASKS: usize = 64;
/// Keys in use: more than `KEYS`, so `KeysFull` happens.
const NKEYS: usize = 20;
/// Submitters (streams per key).
const MAIN: u8 = 0;
const IRQ: u8 = 1;
/// Tasks each submitter submits in total: the interrupt exactly `IRQ_TASKS`; the main loop keeps
/// submitting as long as the interrupt does (so that the timer keeps landing inside `submit`
/// calls), at least `MAIN_MIN_TASKS` and at most `MAIN_MAX_TASKS`.
const IRQ_TASKS: u32 = 3000;
const MAIN_MIN_TASKS: u32 = 4000;
const MAIN_MAX_TASKS: u32 = 200_000;
/// Tasks the interrupt submits per tick, and every how many ticks it also runs some.
const IRQ_BURST: u32 = 3;
const IRQ_RUN_EVERY: u32 = 4;
/// Timer frequency.
pub const TICK_HZ: u32 = 5_000;
/// The verdict also requires that the timer interrupted this many `submit` and `run` calls.
const MIN_PREEMPTED: u32 = 50;

static SERIALIZER: FixedSerializer<u8, Cmd, KEYS, TASKS> = FixedSerializer::new();

/// What the main loop is inside of (for the interrupt's statistics).
static IN_CALL: AtomicU8 = AtomicU8::new(0);
/// Set by the interrupt once it has submitted all its tasks.
static IRQ_DONE: AtomicBool = AtomicBool::new(false);
const IN_NONE: u8 = 0;
const IN_SUBMIT: u8 = 1;
const IN_RUN: u8 = 2;

/// The checker's state, shared by the task bodies in both contexts.
struct Check {
    next: [[u16; 2]; NKEYS],
    busy: [bool; NKEYS],
    ran: u32,
    overlaps: u32,
    wrong_key: u32,
    misordered: u32,
    first_misorder: Option<(Cmd, u16)>,
}

static CHECK: Mutex<RefCell<Check>> = Mutex::new(RefCell::new(Check {
    next: [[0; 2]; NKEYS],
    busy: [false; NKEYS],
    ran: 0,
    overlaps: 0,
    wrong_key: 0,
    misordered: 0,
    first_misorder: None,
}));

/// The interrupt's own state (only the timer handler touches it until the timer stops).
struct Irq {
    ticks: u32,
    in_submit: u32,
    in_run: u32,
    submitted: u32,
    cursor: usize,
    seq: [u16; NKEYS],
    ran: u32,
    tasks_full: u32,
    keys_full: u32,
    not_whole: u32,
}

static IRQ_STATE: Mutex<RefCell<Irq>> = Mutex::new(RefCell::new(Irq {
    ticks: 0,
    in_submit: 0,
    in_run: 0,
    submitted: 0,
    cursor: 0,
    seq: [0; NKEYS],
    ran: 0,
    tasks_full: 0,
    keys_full: 0,
    not_whole: 0,
}));

/// The task body: checks key, exclusivity and order.
#[inline(never)]
fn exec(key: &u8, cmd: Cmd) {
    let k = usize::from(cmd.key);
    critical_section::with(|cs| {
        let mut c = CHECK.borrow_ref_mut(cs);
        if *key != cmd.key {
            c.wrong_key += 1;
        }
        if c.busy[k] {
            c.overlaps += 1;
        }
        c.busy[k] = true;
    });
    // A little work, so the timer often lands inside a task.
    for i in 0..16u32 {
        core::hint::black_box(i);
    }
    critical_section::with(|cs| {
        let mut c = CHECK.borrow_ref_mut(cs);
        let expected = c.next[k][usize::from(cmd.src)];
        if cmd.seq != expected {
            c.misordered += 1;
            if c.first_misorder.is_none() {
                c.first_misorder = Some((cmd, expected));
            }
        }
        c.next[k][usize::from(cmd.src)] = cmd.seq.wrapping_add(1);
        c.ran += 1;
        c.busy[k] = false;
    });
}

// The serializer's entry points, kept out of line so that `nm` shows its code size.
#[inline(never)]
fn submit(cmd: Cmd) -> Result<(), Refused<Cmd>> {
    SERIALIZER.submit(cmd.key, cmd)
}

#[inline(never)]
fn run(budget: usize) -> usize {
    SERIALIZER.run(budget, exec)
}

#[inline(never)]
fn queued_and_live() -> (usize, usize) {
    (SERIALIZER.queued(), SERIALIZER.live_keys())
}

/// Called by the timer interrupt: submit a few tasks, sometimes run a few.
pub fn on_tick() {
    critical_section::with(|cs| {
        let mut s = IRQ_STATE.borrow_ref_mut(cs);
        s.ticks += 1;
        match IN_CALL.load(Ordering::Relaxed) {
            IN_SUBMIT => s.in_submit += 1,
            IN_RUN => s.in_run += 1,
            _ => {}
        }
        for _ in 0..IRQ_BURST {
            if s.submitted == IRQ_TASKS {
                break;
            }
            let key = s.cursor;
            let cmd = Cmd {
                key: key as u8,
                src: IRQ,
                seq: s.seq[key],
            };
            match submit(cmd) {
                Ok(()) => {
                    s.seq[key] += 1;
                    s.submitted += 1;
                    if s.submitted == IRQ_TASKS {
                        IRQ_DONE.store(true, Ordering::Relaxed);
                    }
                    s.cursor = (s.cursor + 7) % NKEYS;
                }
                Err(Refused { reason, task }) => {
                    // Retried on a later tick with the same sequence number.
                    if task != cmd {
                        s.not_whole += 1;
                    }
                    match reason {
                        RefuseReason::TasksFull => s.tasks_full += 1,
                        RefuseReason::KeysFull => s.keys_full += 1,
                    }
                    break;
                }
            }
        }
        if s.ticks.is_multiple_of(IRQ_RUN_EVERY) {
            s.ran += run(2) as u32;
        }
    });
}

/// xorshift32: the main loop's choice of keys and burst sizes.
fn next_random(x: &mut u32) -> u32 {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    *x
}

/// The `broken` feature swaps two of key 3's submissions, which the order check must catch.
fn sequence_number(key: usize, seq: u16) -> u16 {
    if cfg!(feature = "broken") && key == 3 {
        match seq {
            5 => return 6,
            6 => return 5,
            _ => {}
        }
    }
    seq
}

/// Gives up when nothing happened for this many loop iterations.
const STALL_LIMIT: u32 = 20_000_000;

fn firmware_main() -> ! {
    let mut rng = 0x2545_f491_u32;
    let mut seq = [0u16; NKEYS];
    let mut submitted = 0u32;
    let mut ran = 0u32;
    let (mut tasks_full, mut keys_full, mut not_whole) = (0u32, 0u32, 0u32);
    let mut phase = 0u32;
    let mut filling = true;
    let mut idle = 0u32;
    let mut zero_budget_ran = 0usize;

    arch::start_timer(TICK_HZ);
    loop {
        let mut progress = false;
        let irq_done = IRQ_DONE.load(Ordering::Relaxed);
        let main_done = (submitted >= MAIN_MIN_TASKS && irq_done) || submitted == MAIN_MAX_TASKS;
        if filling && !main_done {
            // Even phases spread single tasks over many keys (towards `KeysFull`), odd phases
            // pour long bursts into few keys (towards `TasksFull`).
            let key = (next_random(&mut rng) as usize) % NKEYS;
            let burst = if phase.is_multiple_of(2) {
                1
            } else {
                1 + next_random(&mut rng) % 12
            };
            for _ in 0..burst {
                if submitted == MAIN_MAX_TASKS {
                    break;
                }
                let cmd = Cmd {
                    key: key as u8,
                    src: MAIN,
                    seq: sequence_number(key, seq[key]),
                };
                IN_CALL.store(IN_SUBMIT, Ordering::Relaxed);
                let r = submit(cmd);
                IN_CALL.store(IN_NONE, Ordering::Relaxed);
                match r {
                    Ok(()) => {
                        seq[key] += 1;
                        submitted += 1;
                        progress = true;
                    }
                    Err(Refused { reason, task }) => {
                        if task != cmd {
                            not_whole += 1;
                        }
                        match reason {
                            RefuseReason::TasksFull => tasks_full += 1,
                            RefuseReason::KeysFull => keys_full += 1,
                        }
                        // Full: drain for a while, then submit the same task again.
                        filling = false;
                        break;
                    }
                }
            }
        } else {
            let budget = 1 + (next_random(&mut rng) % 4) as usize;
            IN_CALL.store(IN_RUN, Ordering::Relaxed);
            let n = run(budget);
            zero_budget_ran += run(0);
            IN_CALL.store(IN_NONE, Ordering::Relaxed);
            ran += n as u32;
            progress |= n > 0;
            let (queued, _) = queued_and_live();
            if queued <= 4 && !filling {
                filling = true;
                phase += 1;
            }
        }
        if main_done {
            if irq_done && queued_and_live().0 == 0 {
                break;
            }
            filling = false;
        }
        if progress {
            idle = 0;
        } else {
            idle += 1;
            if idle == STALL_LIMIT {
                break;
            }
        }
    }
    arch::stop_timer();

    let irq = critical_section::with(|cs| {
        let s = IRQ_STATE.borrow_ref(cs);
        (
            s.ticks,
            s.in_submit,
            s.in_run,
            s.submitted,
            s.seq,
            s.ran,
            s.tasks_full,
            s.keys_full,
            s.not_whole,
        )
    });
    let (
        ticks,
        in_submit,
        in_run,
        irq_submitted,
        irq_seq,
        irq_ran,
        irq_tasks_full,
        irq_keys_full,
        irq_not_whole,
    ) = irq;
    tasks_full += irq_tasks_full;
    keys_full += irq_keys_full;
    not_whole += irq_not_whole;
    let total = submitted + irq_submitted;
    let (queued, live) = queued_and_live();

    critical_section::with(|cs| {
        let c = CHECK.borrow_ref(cs);
        let mut lost = 0u32;
        let mut keys_used = 0;
        for k in 0..NKEYS {
            lost += u32::from(seq[k].abs_diff(c.next[k][usize::from(MAIN)]));
            lost += u32::from(irq_seq[k].abs_diff(c.next[k][usize::from(IRQ)]));
            keys_used += usize::from(seq[k] + irq_seq[k] > 0);
        }
        let fail = |what: &str| -> ! {
            println!(
                "keyserial firmware: FAILED: {}; ran {} of {} tasks ({} by the interrupt), {} misordered{}, {} lost or extra, {} overlapping, {} under a wrong key, {} refused tasks not whole, {} queued and {} keys live at the end, {} ticks ({} in submit, {} in run)",
                what,
                c.ran,
                total,
                irq_ran,
                c.misordered,
                Misorder(c.first_misorder),
                lost,
                c.overlaps,
                c.wrong_key,
                not_whole,
                queued,
                live,
                ticks,
                in_submit,
                in_run
            );
            arch::exit(false)
        };
        if idle == STALL_LIMIT {
            fail("stalled (nothing ran or was accepted for a long time)");
        }
        if c.misordered > 0 || lost > 0 {
            fail("per-key order or count broken");
        }
        if c.overlaps > 0 || c.wrong_key > 0 {
            fail("a key's tasks overlapped or ran under another key");
        }
        if c.ran != total || ran + irq_ran != total {
            fail("not every accepted task ran exactly once");
        }
        if not_whole > 0 {
            fail("a refused task did not come back whole");
        }
        if queued != 0 || live != 0 {
            fail("tasks queued or keys live after the last run");
        }
        if zero_budget_ran != 0 {
            fail("run(0) ran a task");
        }
        if tasks_full == 0 || keys_full == 0 {
            fail("the workload never filled the task or key capacity");
        }
        if in_submit < MIN_PREEMPTED || in_run < MIN_PREEMPTED {
            fail("the timer interrupt too rarely preempted submit and run");
        }
        println!(
            "keyserial firmware: ok, {} tasks, {} keys ({} from the timer interrupt, {} run there; {} ticks, {} inside submit, {} inside run; refused {} TasksFull, {} KeysFull)",
            total,
            keys_used,
            irq_submitted,
            irq_ran,
            ticks,
            in_submit,
            in_run,
            tasks_full,
            keys_full
        );
        arch::exit(true)
    })
}

/// Formats the first order violation, if any.
struct Misorder(Option<(Cmd, u16)>);

impl core::fmt::Display for Misorder {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Some((cmd, expected)) => write!(
                f,
                " (first: key {} {} seq {} where {} was next)",
                cmd.key,
                if cmd.src == MAIN { "main" } else { "interrupt" },
                cmd.seq,
                expected
            ),
            None => Ok(()),
        }
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("keyserial firmware: FAILED: panic: {}", info);
    arch::exit(false)
}
