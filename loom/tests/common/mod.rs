//! Helpers shared by the loom models (a module of each test crate that uses it).

pub mod coverage;
