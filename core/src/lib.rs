//! # keyserial-core
//!
//! The lock-free, `no_std` heart of [keyserial](https://docs.rs/keyserial): everything needed to run
//! tasks **in order per key and in parallel across keys**, with no threads and no clocks of its own.
//!
//! | module | what it is | who uses it |
//! |---|---|---|
//! | [`chain`] | a key's task chain: an intrusive MPSC queue fused with the `ACTIVE`/`RETIRED` handoff word | keyserial's `Serializer` (each key's queue of tasks); [`table`]'s entries and [`fixed`] |
//! | [`fifo`] | (`alloc`) a lane's FIFO: many pushers, one popper at a time, items stored in blocks of slots in push order | keyserial's `Serializer` (each lane's queue) |
//! | [`lane`] | a lane's ownership word: one worker pops a shared FIFO; an idle worker takes it from an owner stuck in a task, deferring only that task's key | keyserial's `Serializer` (its workers serve and steal lanes by it) |
//! | [`table`] | (`alloc`) the sharded, lock-free key table with epoch reclamation | keyserial's `Serializer` (key to chain) |
//! | [`recycle`] | (`alloc`) magazine caches that carry freed blocks back to the allocating thread in batches | keyserial's `Serializer` (the memory of its key table's entries) |
//! | [`prefetch`] | cache hints: start fetching the next item's slot and data while a task runs | [`chain`], [`fifo`], and keyserial's `Serializer` |
//! | [`permits`] | the permit counter behind keyserial's fair semaphore | keyserial's `Semaphore` |
//! | [`fixed`] | [`fixed::FixedSerializer`]: a complete serializer without an allocator (fixed key table, task pool, and its own ready ring) | firmware without an allocator (the repository's `core/firmware` example); not keyserial |
//! | [`pool`] | fixed-capacity node storage with generation counters, for builds without an allocator | [`fixed`] (its task storage); chains over pool nodes in a no-alloc executor of your own |
//! | [`ready`] | [`ready::BoundedQueue`]: a plain MPMC queue of any `T` (fixed capacity, no allocator, `const` constructor) | [`recycle`]'s depot, and a building block for no-alloc executors ([`fixed`] has its own ready ring instead). keyserial's `Serializer` does not use it: its ready work waits in lanes ([`fifo`], [`lane`]) |
//!
//! ## Who this crate is for
//!
//! Applications on `std` use [keyserial](https://docs.rs/keyserial)'s `Serializer`, which is
//! built from [`chain`], [`fifo`], [`lane`], [`table`], [`recycle`], [`permits`] (its
//! `Semaphore`) and [`prefetch`]; it does not use [`fixed`], [`pool`] or [`ready`] (only through
//! [`recycle`], whose depot is a [`ready::BoundedQueue`]). Everything here is a **building
//! block**, for keyserial and for people writing their own executor (another threading model, an
//! async runtime, firmware without an allocator): each module states its protocol, who may call
//! what, and what each operation guarantees. Where an operation's soundness rests on a promise
//! only the caller can keep (ownership of a chain's `ACTIVE` baton, handing over a raw node, the
//! history of a table entry), it is an `unsafe fn` with a `# Safety` section; no safe function
//! trusts a raw pointer. Nothing is `#[doc(hidden)]`: every public item is meant for executor
//! authors and is usable on its own ([`pool`] and the bounded [`ready`] queue serve builds without
//! an allocator, as [`fixed`] does with its own ready ring).
//!
//! Every concurrent protocol is written down at the top of its module and checked by the loom models
//! in the repository's `loom/` crate, which compile this crate with `--cfg loom` so that all atomics
//! and shared cells come from loom (see the private `sync` facade).
//!
//! ## Features
//! - `alloc` (default): heap-allocated chains ([`chain::BoxNode`]), a lane's [`fifo`], the key
//!   [`table`], the [`recycle`] caches.
//! - `critical-section`: forwards to `portable-atomic/critical-section` for targets without
//!   compare-and-swap (`thumbv6m-none-eabi`, `riscv32imc-unknown-none-elf`); the final binary
//!   supplies the critical-section implementation.
#![no_std]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "alloc")]
extern crate alloc;

#[cfg(test)] // the unit tests use std; the library itself never does
extern crate std;

mod sync;

pub mod chain;
#[cfg(feature = "alloc")]
pub mod fifo;
pub mod fixed;
pub mod lane;
pub mod permits;
pub mod pool;
pub mod prefetch;
pub mod ready;
#[cfg(feature = "alloc")]
pub mod recycle;
#[cfg(feature = "alloc")]
pub mod table;

/// The package README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
