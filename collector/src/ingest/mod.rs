//! Bytes -> typed events: ring-buffer record decoding and the record file.

pub mod decode;
pub mod fast_hash;
pub mod hosts;
pub mod io_source;
pub mod model;
pub mod record;
pub mod spares;

pub use decode::{decode_record, DecodeError};
pub use model::Event;
