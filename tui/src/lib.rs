//! `tokenscope top`: the live terminal view of LLM token streams (ratatui +
//! crossterm), fed by the live collector or a recording.
//!
//! Two threads, as bpftop has them: `worker` reads the source and runs the
//! collector's pipeline (`analysis`), sending a snapshot at most once a second;
//! the screen's `update(&mut State, Action)` and `render(&mut Frame, &State)` only
//! lay out snapshots and answer keys. All three are pure where they can be (time
//! comes in as arguments), so tests drive the same code the app runs.
#![cfg_attr(test, allow(unused_crate_dependencies))] // unit tests see every dev-dependency

pub mod analysis;
pub mod app;
pub mod feed;
pub mod findings;
pub mod routes;
pub mod rows;
pub mod state;
pub mod term;
pub mod view;
pub mod worker;

pub use app::{action_for_key, run_top, GpuMode, IoSourceArg, KernelArgs, TopArgs, AFTER_HELP};
pub use state::{update, Action, Meta, SortKey, State, View};
pub use view::render;
