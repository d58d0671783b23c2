//! Loom models of per-key ticket order and ticket-aware retirement (core/src/ticket.rs), over the
//! real `Tickets` and `TicketChain`.
//!
//! What ran is checked with relaxed read-modify-writes on one counter (`Key::next_run`) rather
//! than a mutex-guarded log: a mutex would add happens-before edges between the threads that the
//! protocol itself does not provide, and could hide a missing acquire in the chain handoff. An RMW
//! always reads the latest value, so `fetch_add` still sees every run, in the order they happened.
//! Two owners at once are caught by loom itself: the early list and the chain's owner cursor are
//! loom `UnsafeCell`s.
//!
//! **Thread order matters here.** Loom 0.7's DPOR keeps only the *last* access of each atomic, so
//! when thread X only loads a word and thread Y later loads it and then writes it (every
//! `Chain::push` and `Tickets::issue` starts with a relaxed load; `advance` loads `serving` before
//! storing it), Y's own load hides X's load from the race check and loom never tries Y's write
//! before X's load (tokio-rs/loom#392). A model whose retiring thread runs first therefore
//! explores one execution. So the retirer, which only loads the chain's words before its CASes,
//! is always spawned *last* (loom runs threads in spawn order until a race says otherwise), and
//! the main thread only joins. Coverage counters (std statics, outside the model) check that the
//! interesting interleavings were reached: both outcomes of every raced retire, an early node
//! parked across a release, and a close undone by `reopen` while a submitter waited.
#![cfg(loom)]

use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::atomic::Ordering as StdOrdering;

use keyserial_core::chain::{BoxNode, Pushed, Retired};
use keyserial_core::ticket::{Closed, TicketChain, Tickets};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

type TC = TicketChain<BoxNode<usize>>;

/// One key: its ticket counter, its chain, and the run check.
struct Key {
    tickets: Tickets,
    chain: TC,
    /// The ticket that must run next (relaxed RMWs only, see the module docs).
    next_run: AtomicUsize,
}

/// What a submitter's `issue` + push came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Submitted {
    /// Got a ticket and pushed its node.
    Pushed(usize, Pushed),
    /// `issue` returned `Closed`: the task goes back to the caller.
    Refused,
    /// Got a ticket, but the chain was retired: the node came back (freed here).
    Bounced(usize),
}

impl Key {
    fn new() -> Self {
        Key {
            tickets: Tickets::new(),
            chain: TC::new(),
            next_run: AtomicUsize::new(0),
        }
    }

    /// "Runs" ticket `t`: it must be the next one, and not run before.
    fn run(&self, t: usize) {
        let due = self.next_run.fetch_add(1, Ordering::Relaxed);
        assert_eq!(t, due, "ticket {t} ran out of order or twice");
    }

    /// The owner loop: runs every due node, then releases (again if something arrived meanwhile).
    ///
    /// # Safety
    /// The caller owns the chain.
    unsafe fn drain(&self) {
        loop {
            // SAFETY: the caller owns the chain; popped nodes are `BoxNode::new` nodes that no chain
            // holds any more, freed here.
            unsafe {
                while let Some(node) = self.chain.pop() {
                    self.run(BoxNode::into_value(node));
                    self.chain.advance();
                }
                if self.chain.try_release() {
                    return;
                }
            }
            // A push between its two steps (core `chain`, "The pop"): requeue, here a yield.
            loom::thread::yield_now();
        }
    }

    /// Ticket `t`'s node arrives: push it, and drain if the push made this thread the owner. A
    /// bounce off a retired chain frees the node and hands back the ticket.
    fn arrive(&self, t: usize) -> Result<Pushed, Retired<usize>> {
        // SAFETY: a fresh heap node carrying an issued ticket, pushed once.
        match unsafe { self.chain.push(BoxNode::new(t)) } {
            Ok(Pushed::Activated) => {
                // SAFETY: the activating push made this thread the owner.
                unsafe { self.drain() };
                Ok(Pushed::Activated)
            }
            Ok(Pushed::Queued) => Ok(Pushed::Queued),
            // SAFETY: the push failed, so the node never left this thread.
            Err(Retired(node)) => Err(Retired(unsafe { BoxNode::into_value(node) })),
        }
    }

    /// A submitter: take a ticket, and if that worked, push its node (draining on activation).
    fn submit(&self) -> Submitted {
        match self.tickets.issue() {
            Ok(t) => match self.arrive(t) {
                Ok(p) => Submitted::Pushed(t, p),
                Err(Retired(t)) => Submitted::Bounced(t),
            },
            Err(Closed) => Submitted::Refused,
        }
    }

    /// Issues the next ticket and runs it to completion on this thread (the chain must be idle).
    fn serve_one(&self) {
        let t = self.tickets.issue().unwrap();
        assert_eq!(self.arrive(t), Ok(Pushed::Activated));
    }

    /// Every issued ticket ran, once, and the chain is serving the next one.
    fn assert_all_served(&self) {
        let issued = self.tickets.issued();
        assert_eq!(
            self.next_run.load(Ordering::Relaxed),
            issued,
            "an issued ticket did not run"
        );
        assert_eq!(self.chain.serving(), issued);
    }

    /// The end state after a `try_retire` that returned `retired`: retired and closed, or idle,
    /// open and retirable now that nothing races.
    fn assert_settled(&self, retired: bool) {
        if retired {
            assert!(self.chain.is_retired(), "retire reported but chain live");
            assert!(
                self.tickets.is_closed(),
                "retired chain with an open counter"
            );
            assert_eq!(self.tickets.issue(), Err(Closed));
        } else {
            assert!(self.chain.is_idle(), "chain left owned or retired");
            assert!(
                !self.tickets.is_closed(),
                "a failed retire left the counter closed"
            );
            assert!(
                self.chain.try_retire(&self.tickets),
                "quiet key must retire"
            );
            assert!(self.tickets.is_closed());
        }
    }
}

/// Counts a retire outcome: `[failed, succeeded]`.
fn count(outcomes: &[StdAtomicUsize; 2], retired: bool) {
    outcomes[usize::from(retired)].fetch_add(1, StdOrdering::Relaxed);
}

/// Both outcomes of the raced retire were reached.
fn assert_both(outcomes: &[StdAtomicUsize; 2]) {
    let [failed, succeeded] = outcomes.each_ref().map(|o| o.load(StdOrdering::Relaxed));
    assert!(
        failed > 0 && succeeded > 0,
        "retire failed in {failed} and succeeded in {succeeded} executions: one side unexplored"
    );
}

/// Spawns the retirer: one `try_retire`. Spawn it after every other thread (see the module docs).
fn spawn_retirer(k: &Arc<Key>) -> thread::JoinHandle<bool> {
    let k = k.clone();
    thread::spawn(move || k.chain.try_retire(&k.tickets))
}

/// Executions of `two_arrivers_run_in_ticket_order` in which both pushes activated the chain
/// (ticket 1 arrived first, was parked, the owner released, ticket 0 activated it again).
static BOTH_ACTIVATED: StdAtomicUsize = StdAtomicUsize::new(0);

#[test]
fn two_arrivers_run_in_ticket_order() {
    loom::model(|| {
        let k = Arc::new(Key::new());
        let t0 = k.tickets.issue().unwrap();
        let t1 = k.tickets.issue().unwrap();
        assert_eq!((t0, t1), (0, 1));
        let arrivers: Vec<_> = [t0, t1]
            .into_iter()
            .map(|t| {
                let k = k.clone();
                thread::spawn(move || k.arrive(t).expect("pushed onto a retired chain"))
            })
            .collect();
        let activations = arrivers
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&p| p == Pushed::Activated)
            .count();
        if activations == 2 {
            BOTH_ACTIVATED.fetch_add(1, StdOrdering::Relaxed);
        }
        assert!(activations >= 1, "nobody drained");
        assert_eq!(k.next_run.load(Ordering::Relaxed), 2, "both ran, 0 then 1");
        assert_eq!(k.chain.serving(), 2);
        assert!(k.chain.is_idle());
        assert!(k.chain.try_retire(&k.tickets));
    });
    assert!(
        BOTH_ACTIVATED.load(StdOrdering::Relaxed) > 0,
        "the model never parked ticket 1 across a release"
    );
}

/// A submitter (issue, push, drain) races one `try_retire`; `served_before` tickets were issued
/// and run before the race.
fn retire_vs_submit(served_before: usize, outcomes: &'static [StdAtomicUsize; 2]) {
    loom::model(move || {
        let k = Arc::new(Key::new());
        for _ in 0..served_before {
            k.serve_one();
        }
        let submitter = {
            let k = k.clone();
            thread::spawn(move || k.submit())
        };
        let retirer = spawn_retirer(&k);
        let submitted = submitter.join().unwrap();
        let retired = retirer.join().unwrap();
        count(outcomes, retired);
        match submitted {
            Submitted::Bounced(t) => panic!("ticket {t} was issued, yet its chain retired first"),
            // Only the retire's close can refuse, and nothing else owned the chain to make the
            // retire fail after closing.
            Submitted::Refused => assert!(retired, "refused by a retire that did not happen"),
            // Nobody else pushes, so the submitter's push found the chain idle.
            Submitted::Pushed(t, p) => {
                assert_eq!(t, served_before);
                assert_eq!(p, Pushed::Activated);
            }
        }
        k.assert_all_served();
        k.assert_settled(retired);
    });
    assert_both(outcomes);
}

#[test]
fn retire_vs_submit_on_a_fresh_key() {
    static OUTCOMES: [StdAtomicUsize; 2] = [StdAtomicUsize::new(0), StdAtomicUsize::new(0)];
    retire_vs_submit(0, &OUTCOMES);
}

#[test]
fn retire_vs_submit_after_one_served_ticket() {
    static OUTCOMES: [StdAtomicUsize; 2] = [StdAtomicUsize::new(0), StdAtomicUsize::new(0)];
    retire_vs_submit(1, &OUTCOMES);
}

#[test]
fn retire_vs_owner_that_served_the_last_ticket() {
    // The owner of ticket 0 pushes it, serves it and releases; the retirer may see the chain idle
    // before the push (or read a stale idle word) and `serving == 1` after the advance, close the
    // counter, and then find the chain still owned: it must reopen and fail.
    static OUTCOMES: [StdAtomicUsize; 2] = [StdAtomicUsize::new(0), StdAtomicUsize::new(0)];
    loom::model(|| {
        let k = Arc::new(Key::new());
        let t = k.tickets.issue().unwrap();
        let owner = {
            let k = k.clone();
            thread::spawn(move || {
                // SAFETY: ticket 0's fresh node, pushed once; the activating push makes this
                // thread the owner, and the popped node is freed here.
                unsafe {
                    assert_eq!(k.chain.push(BoxNode::new(t)), Ok(Pushed::Activated));
                    let node = k.chain.pop().expect("ticket 0 is due and queued");
                    k.run(BoxNode::into_value(node));
                    k.chain.advance();
                    assert!(k.chain.pop().is_none());
                    assert!(k.chain.try_release(), "nothing else was pushed");
                }
            })
        };
        let retirer = spawn_retirer(&k);
        owner.join().unwrap();
        let retired = retirer.join().unwrap();
        count(&OUTCOMES, retired);
        k.assert_all_served();
        assert_eq!(k.tickets.issued(), 1);
        k.assert_settled(retired);
    });
    assert_both(&OUTCOMES);
}

#[test]
fn retire_vs_two_arrivers_out_of_order() {
    // Tickets 0 and 1 were issued; their nodes arrive on two threads, ticket 1's spawned first
    // (so it is often parked across a release, leaving the chain idle with work pending), while a
    // third thread tries to retire. The retire may succeed only after both ran; no push bounces.
    static OUTCOMES: [StdAtomicUsize; 2] = [StdAtomicUsize::new(0), StdAtomicUsize::new(0)];
    loom::model(|| {
        let k = Arc::new(Key::new());
        let tickets = [k.tickets.issue().unwrap(), k.tickets.issue().unwrap()];
        let arrivers: Vec<_> = tickets
            .into_iter()
            .rev()
            .map(|t| {
                let k = k.clone();
                thread::spawn(move || {
                    let _ = k.arrive(t).expect("pushed onto a retired chain");
                })
            })
            .collect();
        let retirer = spawn_retirer(&k);
        for h in arrivers {
            h.join().unwrap();
        }
        let retired = retirer.join().unwrap();
        count(&OUTCOMES, retired);
        k.assert_all_served();
        assert_eq!(k.tickets.issued(), 2);
        k.assert_settled(retired);
    });
    assert_both(&OUTCOMES);
}

/// Executions of `submitter_retries_through_a_reopen` in which the submitter was refused while
/// the retire was in flight and then got a ticket after the retirer reopened the counter.
static RETRIED_AFTER_REOPEN: StdAtomicUsize = StdAtomicUsize::new(0);

#[test]
fn submitter_retries_through_a_reopen() {
    // The owner of ticket 0 pushes it, serves it and releases; a submitter that meets `Closed`
    // retries until the counter reopens or the chain is retired (what a submitter does after
    // looking its key up again); a retirer races both. The reopen happens when the retirer saw the
    // chain idle before ticket 0 arrived (or read a stale idle word) and closed the counter after
    // ticket 0 ran but before its owner released.
    static OUTCOMES: [StdAtomicUsize; 2] = [StdAtomicUsize::new(0), StdAtomicUsize::new(0)];
    loom::model(|| {
        let k = Arc::new(Key::new());
        let t0 = k.tickets.issue().unwrap();
        let owner = {
            let k = k.clone();
            thread::spawn(move || {
                let _ = k.arrive(t0).expect("pushed onto a retired chain");
            })
        };
        let submitter = {
            let k = k.clone();
            thread::spawn(move || {
                let mut refused = false;
                loop {
                    match k.submit() {
                        Submitted::Refused if k.chain.is_retired() => {
                            return Submitted::Refused;
                        }
                        Submitted::Refused => {
                            refused = true;
                            thread::yield_now();
                        }
                        other => {
                            if refused {
                                RETRIED_AFTER_REOPEN.fetch_add(1, StdOrdering::Relaxed);
                            }
                            return other;
                        }
                    }
                }
            })
        };
        let retirer = spawn_retirer(&k);
        owner.join().unwrap();
        let submitted = submitter.join().unwrap();
        let retired = retirer.join().unwrap();
        count(&OUTCOMES, retired);
        match submitted {
            Submitted::Bounced(t) => panic!("ticket {t} was issued, yet its chain retired first"),
            Submitted::Refused => assert!(retired, "gave up on a key that was not retired"),
            Submitted::Pushed(t, _) => assert_eq!(t, 1),
        }
        k.assert_all_served();
        k.assert_settled(retired);
    });
    assert_both(&OUTCOMES);
    assert!(
        RETRIED_AFTER_REOPEN.load(StdOrdering::Relaxed) > 0,
        "the model never undid a close while a submitter waited"
    );
}
