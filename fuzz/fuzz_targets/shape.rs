//! The API shape classifier (`protocol::shape`): one event's data, JSON of any
//! streaming API or none, to verdicts; where the fast reading of OpenAI chunks answers,
//! it answers as the general (serde) reading does.
#![no_main]

use collector::protocol::shape;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let verdicts = shape::classify(data);
    assert!(!verdicts.is_empty(), "every event gets a verdict");
    assert!(
        verdicts.len() <= data.len().max(1),
        "{} verdicts from {} bytes",
        verdicts.len(),
        data.len()
    );
    if let Some(fast) = shape::classify_fast(data) {
        assert_eq!(
            fast,
            shape::classify_general(data),
            "the fast reading differs from serde's"
        );
    }
});
