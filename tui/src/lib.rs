//! `tokenscope top`: the live terminal view of LLM token streams (ratatui +
//! crossterm), fed by the live collector or a recording.
//!
//! `update(&mut State, Action)` and `render(&mut Frame, &State)` are pure:
//! time comes in `Action::Tick`, so tests drive the same code the app runs.

pub mod app;
pub mod feed;
pub mod rows;
pub mod state;
pub mod term;
pub mod view;

pub use app::{action_for_key, run_top, GpuMode, IoSourceArg, KernelArgs, TopArgs, AFTER_HELP};
pub use state::{update, Action, Meta, SortKey, State, View};
pub use view::render;
