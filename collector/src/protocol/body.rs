//! HTTP/1.x message body framing: Content-Length, chunked, or until close.
//! Fed the captured bytes of each I/O in order; told how many bytes went
//! uncaptured so it can keep its place (or say it lost it).

const MAX_SIZE_LINE: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyReader {
    /// Content-Length: bytes left.
    Length(u64),
    Chunked(Chunk),
    /// No length: the body runs until the connection closes.
    UntilClose,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Reading a chunk-size line (hex, optional extensions, CRLF).
    Size(Vec<u8>),
    /// Chunk data bytes left.
    Data(u64),
    /// The CRLF after chunk data: how many of its bytes were seen.
    DataEnd(u8),
    /// After the last chunk: trailer lines until an empty one; bytes in the current line.
    Trailer(usize),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the input that belonged to this body (framing included).
    pub consumed: usize,
    pub ended: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct FramingError;

impl BodyReader {
    /// Consumes body bytes from `input`, handing content (framing removed) to `content`.
    pub fn feed<'a>(
        &mut self,
        input: &'a [u8],
        content: &mut dyn FnMut(&'a [u8]),
    ) -> Result<Progress, FramingError> {
        let mut at = 0;
        while at < input.len() {
            let rest = &input[at..];
            match self {
                BodyReader::UntilClose => {
                    content(rest);
                    at = input.len();
                }
                BodyReader::Length(left) => {
                    let n = (*left).min(rest.len() as u64) as usize;
                    content(&rest[..n]);
                    *left -= n as u64;
                    at += n;
                    if *left == 0 {
                        return Ok(Progress {
                            consumed: at,
                            ended: true,
                        });
                    }
                }
                BodyReader::Chunked(state) => {
                    let (used, ended) = chunk_step(state, rest, content)?;
                    at += used;
                    if ended {
                        return Ok(Progress {
                            consumed: at,
                            ended: true,
                        });
                    }
                }
            }
        }
        Ok(Progress {
            consumed: at,
            ended: matches!(self, BodyReader::Length(0)),
        })
    }

    /// `n` bytes of this body went uncaptured. `Ok(ended)` if the place is
    /// still known, `Err` if those bytes could have held framing we needed.
    pub fn skip(&mut self, n: u64) -> Result<bool, FramingError> {
        match self {
            BodyReader::UntilClose => Ok(false),
            BodyReader::Length(left) if n <= *left => {
                *left -= n;
                Ok(*left == 0)
            }
            BodyReader::Chunked(Chunk::Data(left)) if n < *left => {
                *left -= n;
                Ok(false)
            }
            _ => Err(FramingError),
        }
    }
}

/// One step of the chunked decoder; returns (bytes used, body ended).
fn chunk_step<'a>(
    state: &mut Chunk,
    rest: &'a [u8],
    content: &mut dyn FnMut(&'a [u8]),
) -> Result<(usize, bool), FramingError> {
    match state {
        Chunk::Size(line) => {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                line.extend_from_slice(rest);
                return if line.len() > MAX_SIZE_LINE {
                    Err(FramingError)
                } else {
                    Ok((rest.len(), false))
                };
            };
            // A size line within one piece (nearly all) is read in place.
            let size = if line.is_empty() {
                parse_chunk_size(&rest[..nl])?
            } else {
                line.extend_from_slice(&rest[..nl]);
                parse_chunk_size(line)?
            };
            *state = if size == 0 {
                Chunk::Trailer(0)
            } else {
                Chunk::Data(size)
            };
            Ok((nl + 1, false))
        }
        Chunk::Data(left) => {
            let n = (*left).min(rest.len() as u64) as usize;
            content(&rest[..n]);
            *left -= n as u64;
            if *left == 0 {
                *state = Chunk::DataEnd(0);
            }
            Ok((n, false))
        }
        Chunk::DataEnd(seen) => {
            let expected = if *seen == 0 { b'\r' } else { b'\n' };
            match rest[0] {
                b if b == expected && *seen == 0 => *seen = 1,
                b'\n' => *state = Chunk::Size(Vec::new()),
                _ => return Err(FramingError),
            }
            Ok((1, false))
        }
        Chunk::Trailer(line_len) => {
            let b = rest[0];
            if b == b'\n' {
                if *line_len == 0 {
                    return Ok((1, true));
                }
                *line_len = 0;
            } else if b != b'\r' {
                *line_len += 1;
            }
            Ok((1, false))
        }
    }
}

fn parse_chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let hex = line
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if hex.is_empty() || hex.len() > 15 {
        return Err(FramingError);
    }
    let s = std::str::from_utf8(hex).map_err(|_| FramingError)?;
    u64::from_str_radix(s, 16).map_err(|_| FramingError)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(
        reader: &mut BodyReader,
        input: &[u8],
    ) -> (Vec<u8>, Result<Progress, FramingError>) {
        let mut out = Vec::new();
        let p = reader.feed(input, &mut |c| out.extend_from_slice(c));
        (out, p)
    }

    const CHUNKED: &[u8] = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";

    #[test]
    fn chunked_whole_and_split_everywhere() {
        let (out, p) = decode_all(&mut BodyReader::Chunked(Chunk::Size(Vec::new())), CHUNKED);
        assert_eq!(out, b"hello, world");
        assert_eq!(
            p,
            Ok(Progress {
                consumed: CHUNKED.len() - 4,
                ended: true
            }),
            "stops before the next message"
        );
        for cut in 0..CHUNKED.len() - 4 {
            let mut r = BodyReader::Chunked(Chunk::Size(Vec::new()));
            let (mut a, p1) = decode_all(&mut r, &CHUNKED[..cut]);
            assert_eq!(
                p1,
                Ok(Progress {
                    consumed: cut,
                    ended: false
                }),
                "first part of split at {cut}"
            );
            let (b, p2) = decode_all(&mut r, &CHUNKED[cut..]);
            a.extend(b);
            assert_eq!(a, b"hello, world", "split at {cut}");
            assert_eq!(p2.expect("valid").consumed, CHUNKED.len() - 4 - cut);
        }
    }

    #[test]
    fn content_length_and_skips() {
        let mut r = BodyReader::Length(10);
        let (out, p) = decode_all(&mut r, b"abcd");
        assert_eq!(
            (out.as_slice(), p),
            (
                &b"abcd"[..],
                Ok(Progress {
                    consumed: 4,
                    ended: false
                })
            )
        );
        assert_eq!(r.skip(5), Ok(false));
        let (_, p) = decode_all(&mut r, b"zNEXT");
        assert_eq!(
            p,
            Ok(Progress {
                consumed: 1,
                ended: true
            })
        );
        assert_eq!(
            BodyReader::Length(3).skip(4),
            Err(FramingError),
            "skipping past the body loses the place"
        );
        assert_eq!(BodyReader::Chunked(Chunk::Data(100)).skip(50), Ok(false));
        assert_eq!(
            BodyReader::Chunked(Chunk::Data(100)).skip(100),
            Err(FramingError),
            "the CRLF and next size line are unseen"
        );
    }

    #[test]
    fn bad_chunk_framing_is_an_error() {
        let (_, p) = decode_all(&mut BodyReader::Chunked(Chunk::Size(Vec::new())), b"zz\r\n");
        assert_eq!(p, Err(FramingError));
        let (_, p) = decode_all(
            &mut BodyReader::Chunked(Chunk::Size(Vec::new())),
            b"2\r\nabXY",
        );
        assert_eq!(p, Err(FramingError), "chunk data must be followed by CRLF");
        let long = vec![b'1'; 400];
        let (_, p) = decode_all(&mut BodyReader::Chunked(Chunk::Size(Vec::new())), &long);
        assert_eq!(p, Err(FramingError), "size lines are bounded");
    }
}
