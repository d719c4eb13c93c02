//! The CUPTI hook's wire format (`tokenscope_cupti_hook::read_hook_stream`):
//! length-delimited `HookMessage`s, as a hook (or anything that reached its socket)
//! sends them. Every message that decodes must encode back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tokenscope_cupti_hook::read_hook_stream;
use tokenscope_cupti_hook::wire::{encode_message, HookMessage};

fuzz_target!(|data: &[u8]| {
    let mut messages = Vec::new();
    let _ = read_hook_stream(data, |msg| messages.push(msg));
    // Each message took at least its one-byte length.
    assert!(messages.len() <= data.len(), "{} messages", messages.len());
    for msg in messages {
        let mut bytes = Vec::new();
        encode_message(&msg, &mut bytes);
        let back = HookMessage::decode_length_delimited(bytes.as_slice())
            .expect("an encoded message decodes");
        assert!(back == msg, "a message survives encoding and decoding");
    }
});
