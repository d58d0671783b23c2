//! Loom models of keyserial's concurrent protocols. The models live in `tests/`, each gated by
//! `#![cfg(loom)]`; run them with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p keyserial-loom --release`.
//! Under `cfg(loom)` both library crates take every atomic and shared cell from loom (their
//! private `sync` facades), so the models check the real code, not a copy.
