//! `tokenscope agent`: always on. Records with the same probes as `record` and `top`,
//! stitches as it goes (finished requests leave memory), and serves what it sees as
//! Prometheus metrics and OTLP traces; optionally keeps rotating recordings.

pub mod otlp;
