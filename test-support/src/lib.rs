//! Helpers shared by tokenscope's tests (tests/, tui/tests, lab/tests), never by what
//! ships: the binaries under test, a `tokenscope record` child, real nginx on free
//! ports, readers of reports and recordings, a private tmux, Python venvs, and the
//! stand-in GPU libraries. They panic with a message naming what was expected: they
//! are for tests.

pub mod agent;
pub mod bin;
pub mod events;
pub mod http;
pub mod netns;
pub mod nginx;
pub mod otlp;
pub mod pyvenv;
pub mod recorder;
pub mod report;
pub mod schema;
pub mod standin;
pub mod tmux;
pub mod venv_specs;
pub mod wire;

pub use bin::{
    demo_recording, demo_stdout, lab, lab_command, lab_engine_process, profiler, Killed,
};
pub use events::{io_bytes, io_events, read_recording, transitions};
pub use nginx::{
    curl, engine_behind_nginx, engine_behind_nginx_with, free_port, free_ports, lab_engine,
    runtime, wait_for_port, Nginx,
};
pub use recorder::{wait_timeout, Recorder};
pub use report::{
    assert_no_secrets_in_outputs, assert_rule_with_evidence, assert_within,
    assert_within_a_millisecond, figure, ns, off_range, point, point_kinds, prefill_steps,
    report_files_out, report_json, report_json_with, report_text, reported_by_first_token,
    tokens_at, MS,
};
pub use schema::check_report_schema;
