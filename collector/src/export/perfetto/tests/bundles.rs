//! The default trace (packets deflated in bundles) against the uncompressed one.

use perfetto_protos::trace::Trace;
use protobuf::Message;

use super::super::bundle;
use super::*;

#[test]
fn deflated_bundles_hold_the_packets_an_uncompressed_trace_holds_in_a_fraction_of_the_bytes() {
    let (header, events) = lab_recording();
    let write = |compression| {
        let mut buf = Vec::new();
        let s = write_events(&header, &events, &mut buf, Windowing::whole(), compression)
            .expect("trace written");
        assert_eq!(s.bytes, buf.len() as u64, "bytes counted as written");
        (s, buf)
    };
    let (plain_summary, plain) = write(Compression::None);
    let (summary, deflated) = write(Compression::Deflate);
    assert_eq!(plain_summary.bundles, 0);
    assert_eq!(plain_summary.uncompressed_bytes, plain_summary.bytes);
    assert_eq!(
        summary.uncompressed_bytes, plain_summary.bytes,
        "the same packets before compression"
    );
    let top = Trace::parse_from_bytes(&deflated).expect("decodes");
    assert_eq!(
        top.packet.len() as u64,
        summary.bundles,
        "nothing outside the bundles"
    );
    assert!(top.packet.iter().all(|p| p.has_compressed_packets()));
    assert!(
        bundle::expand(&deflated).expect("expands") == plain,
        "expanded, the bundles are the uncompressed trace byte for byte"
    );
    println!(
        "{} token events: {} B uncompressed, {} B deflated in {} bundles ({:.1} / {:.1} B per token event)",
        summary.token_instants,
        plain.len(),
        deflated.len(),
        summary.bundles,
        plain.len() as f64 / summary.token_instants as f64,
        deflated.len() as f64 / summary.token_instants as f64
    );
    assert!(
        deflated.len() * 3 < plain.len(),
        "deflated to under a third: {} of {} B",
        deflated.len(),
        plain.len()
    );
}
