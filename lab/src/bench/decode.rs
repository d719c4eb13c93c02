//! Undoes Content-Encoding: gzip incrementally, so events are timed when the client could
//! first decode them (a compressing gateway holds tokens until its gzip block fills).
use std::io::Write;

use flate2::write::GzDecoder;

/// The response body's content coding.
pub enum BodyDecoder {
    Identity,
    Gzip(Box<GzDecoder<Vec<u8>>>),
}

impl BodyDecoder {
    /// Chooses by the Content-Encoding header value (None: identity).
    pub fn for_encoding(encoding: Option<&str>) -> Result<BodyDecoder, String> {
        match encoding.map(|e| e.trim().to_ascii_lowercase()) {
            None => Ok(BodyDecoder::Identity),
            Some(e) if e.is_empty() || e == "identity" => Ok(BodyDecoder::Identity),
            Some(e) if e == "gzip" || e == "x-gzip" => {
                Ok(BodyDecoder::Gzip(Box::new(GzDecoder::new(Vec::new()))))
            }
            Some(e) => Err(format!("unsupported content-encoding {e}")),
        }
    }

    /// Decoded bytes available after this piece of body.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            BodyDecoder::Identity => Ok(data.to_vec()),
            BodyDecoder::Gzip(d) => {
                d.write_all(data).map_err(|e| format!("gzip: {e}"))?;
                d.flush().map_err(|e| format!("gzip: {e}"))?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;

    #[test]
    fn gzip_stream_decodes_piece_by_piece() {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(b"data: one\n\n").unwrap();
        enc.flush().unwrap();
        let first_len = enc.get_ref().len();
        enc.write_all(b"data: two\n\n").unwrap();
        let all = enc.finish().unwrap();
        let mut d = BodyDecoder::for_encoding(Some("gzip")).unwrap();
        let a = d.push(&all[..first_len]).unwrap();
        assert_eq!(
            a, b"data: one\n\n",
            "a sync-flushed block decodes on arrival"
        );
        let b = d.push(&all[first_len..]).unwrap();
        assert_eq!(b, b"data: two\n\n");
        assert!(
            BodyDecoder::for_encoding(Some("br")).is_err(),
            "unknown codings are errors"
        );
    }
}
