//! Loom models of keyserial's concurrent protocols. The models live in `tests/`, each gated by
//! `#![cfg(loom)]`; run them with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p keyserial-loom --release`.
//! Under `cfg(loom)` both library crates take every atomic and shared cell from loom (their
//! private `sync` facades), so the models check the real code, not a copy.
//!
//! A loom 0.7 quirk to keep in mind when writing models: its modification order is partial, and
//! an RMW may read any maximal store, so a plain `store` racing an RMW on the same atomic can be
//! missed by the RMW even when the store happens-before it. Flags inside models are therefore
//! set with RMWs. The library's protocol words are changed by RMWs only, so they are unaffected.
