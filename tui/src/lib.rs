//! tokenscope terminal UI (issue "tokenscope top"): not built yet.
