//! Ring-buffer records -> [`Event`]s, with every length checked against the
//! ABI. An I/O record's payload prefix comes back beside its event, borrowed
//! from the record: the caller (protocol's `Decoder`, one stream parser per
//! socket and direction) reduces it to a [`crate::ingest::model::Sniff`] and
//! drops it, so nothing after decoding can leak it.

use probe_ebpf::abi::{self, read_prefix, TsHeader, TsSock};

use super::model::{
    event::Body, Accept, Addr, Comm, CudaApi, CudaCall, Direction, Event, Retransmit, Sock, SockIo,
    StateChange, Syscall, TcpState,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {0} bytes is shorter than an event header")]
    Short(usize),
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
    #[error("event kind {kind}: expected {expected} bytes, got {got}")]
    Length {
        kind: u32,
        expected: usize,
        got: usize,
    },
    #[error("socket I/O claims {claimed} payload bytes; the probe copies at most {max}")]
    PayloadTooLong { claimed: usize, max: usize },
}

/// Decodes one ring-buffer record: the event (an I/O's `sniff` still unset) and
/// the payload prefix it carried (empty for every other kind).
pub fn decode_record(raw: &[u8]) -> Result<(Event, &[u8]), DecodeError> {
    let mut event = Event::default();
    let payload = decode_record_onto(raw, &mut event)?;
    Ok((event, payload))
}

/// `decode_record` into `event`, a default one where the caller keeps it (a batch):
/// an event is 360 bytes, and returning it through each call copied it at each.
/// Untouched on an error.
pub fn decode_record_onto<'r>(raw: &'r [u8], event: &mut Event) -> Result<&'r [u8], DecodeError> {
    let hdr: TsHeader = read_prefix(raw).ok_or(DecodeError::Short(raw.len()))?;
    let exact = |expected: usize| {
        if raw.len() == expected {
            Ok(())
        } else {
            Err(DecodeError::Length {
                kind: hdr.kind,
                expected,
                got: raw.len(),
            })
        }
    };
    let mut payload: &[u8] = &[];
    let body = match hdr.kind {
        abi::EV_STATE => {
            exact(abi::STATE_EVENT_SIZE)?;
            let e: abi::TsStateEvent = read_prefix(raw).expect("length checked");
            Body::State(StateChange {
                sock: Some(sock(&e.sock)),
                old: state(e.oldstate),
                new: state(e.newstate),
            })
        }
        abi::EV_ACCEPT => {
            exact(abi::STATE_EVENT_SIZE)?;
            let e: abi::TsAcceptEvent = read_prefix(raw).expect("length checked");
            Body::Accept(Accept {
                sock: Some(sock(&e.sock)),
                fd: e.fd,
            })
        }
        abi::EV_RETRANSMIT => {
            exact(abi::STATE_EVENT_SIZE)?;
            let e: abi::TsRetransmitEvent = read_prefix(raw).expect("length checked");
            Body::Retransmit(Retransmit {
                sock: Some(sock(&e.sock)),
                state: state(e.state),
            })
        }
        abi::EV_CUDA => {
            exact(abi::CUDA_EVENT_SIZE)?;
            let e: abi::TsCudaEvent = read_prefix(raw).expect("length checked");
            Body::Cuda(CudaCall {
                api: CudaApi::try_from((e.call & !abi::CU_PER_THREAD) as i32)
                    .unwrap_or(CudaApi::Unknown) as i32,
                entry: e.phase == abi::CUDA_ENTRY,
                stream: e.stream,
                bytes: e.bytes,
                result: e.result,
                per_thread_stream: e.call & abi::CU_PER_THREAD != 0,
            })
        }
        abi::EV_IO => {
            let (io, prefix) = io(raw)?;
            payload = prefix;
            Body::Io(io)
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    event.ts_ns = hdr.ts_ns;
    event.pid = hdr.pid;
    event.tid = hdr.tid;
    event.cpu = hdr.cpu;
    event.comm = comm(&hdr.comm);
    event.body = Some(body);
    Ok(payload)
}

/// The fixed part of an I/O record and its payload prefix.
fn io(raw: &[u8]) -> Result<(SockIo, &[u8]), DecodeError> {
    let e: abi::TsIoEventHead = read_prefix(raw).ok_or(DecodeError::Length {
        kind: abi::EV_IO,
        expected: abi::IO_EVENT_HEAD_SIZE,
        got: raw.len(),
    })?;
    let len = e.payload_len as usize;
    if len > abi::PAYLOAD_MAX {
        return Err(DecodeError::PayloadTooLong {
            claimed: len,
            max: abi::PAYLOAD_MAX,
        });
    }
    // The kernel submits the head plus exactly payload_len bytes; the ring buffer may pad to 8.
    let expected = abi::IO_EVENT_HEAD_SIZE + len;
    if raw.len() < expected || raw.len() > expected.next_multiple_of(8) {
        return Err(DecodeError::Length {
            kind: abi::EV_IO,
            expected,
            got: raw.len(),
        });
    }
    let payload = &raw[abi::IO_EVENT_HEAD_SIZE..expected];
    let dir = match e.dir {
        abi::DIR_SEND => Direction::Send,
        abi::DIR_RECV => Direction::Recv,
        _ => Direction::Unknown,
    };
    let io = SockIo {
        sock: Some(sock(&e.sock)),
        dir: dir as i32,
        syscall: Syscall::try_from(e.syscall as i32).unwrap_or(Syscall::None) as i32,
        fd: e.fd,
        bytes: e.bytes.max(0) as u64,
        captured: len as u32,
        payload_fault: e.flags & abi::IO_F_PAYLOAD_FAULT != 0,
        sniff: None,
    };
    Ok((io, payload))
}

fn sock(s: &TsSock) -> Sock {
    let (saddr, daddr) = if s.family == abi::AF_INET {
        (
            Addr::from_slice(&s.saddr[..4]),
            Addr::from_slice(&s.daddr[..4]),
        )
    } else {
        (Addr::from_slice(&s.saddr), Addr::from_slice(&s.daddr))
    };
    Sock {
        skaddr: s.skaddr,
        saddr,
        sport: u32::from(s.sport),
        daddr,
        dport: u32::from(s.dport),
    }
}

fn state(raw: i32) -> i32 {
    TcpState::try_from(raw).unwrap_or(TcpState::Unknown) as i32
}

fn comm(raw: &[u8; abi::COMM_LEN]) -> Comm {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    // from_utf8 first: `from_utf8_lossy`'s chunk iterator took three times its
    // instructions per event (1.8% of the recorder path) for the same text.
    match std::str::from_utf8(&raw[..end]) {
        Ok(text) => Comm::from(text),
        Err(_) => Comm::from(String::from_utf8_lossy(&raw[..end])),
    }
}

/// Raw records for tests here and in protocol's `Decoder`.
#[cfg(test)]
pub(crate) mod test_records {
    use super::{abi, TsHeader, TsSock};

    pub(crate) fn as_bytes<T: abi::Plain>(v: &T) -> Vec<u8> {
        // SAFETY: Plain types are repr(C) integers with explicit padding.
        unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    pub(crate) fn header(kind: u32) -> TsHeader {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"curl");
        TsHeader {
            ts_ns: 1_000,
            kind,
            pid: 7,
            tid: 8,
            cpu: 1,
            comm,
        }
    }

    pub(crate) fn tcp_sock() -> TsSock {
        let mut s = TsSock {
            skaddr: 0xffff_0001,
            family: abi::AF_INET,
            sport: 40000,
            dport: 8080,
            ..Default::default()
        };
        s.saddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        s.daddr[..4].copy_from_slice(&[127, 0, 0, 2]);
        s
    }

    pub(crate) fn io_record(payload: &[u8]) -> Vec<u8> {
        io_record_on(tcp_sock().skaddr, payload)
    }

    /// An I/O on the socket at kernel address `skaddr`.
    pub(crate) fn io_record_on(skaddr: u64, payload: &[u8]) -> Vec<u8> {
        io_record_moving(skaddr, payload, 1000)
    }

    /// An I/O that moved just what the probe copied of it.
    pub(crate) fn io_record_whole(payload: &[u8]) -> Vec<u8> {
        io_record_moving(tcp_sock().skaddr, payload, payload.len() as i64)
    }

    fn io_record_moving(skaddr: u64, payload: &[u8], bytes: i64) -> Vec<u8> {
        let head = abi::TsIoEventHead {
            hdr: header(abi::EV_IO),
            sock: TsSock {
                skaddr,
                ..tcp_sock()
            },
            dir: abi::DIR_SEND,
            syscall: abi::SYS_SENDTO,
            fd: 3,
            flags: 0,
            bytes,
            payload_len: payload.len() as u32,
            _pad: 0,
        };
        let mut raw = as_bytes(&head);
        raw.extend_from_slice(payload);
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::test_records::{as_bytes, header, io_record, tcp_sock};
    use super::*;

    #[test]
    fn state_event_round_trip() {
        let e = abi::TsStateEvent {
            hdr: header(abi::EV_STATE),
            sock: tcp_sock(),
            oldstate: 2,
            newstate: 1,
        };
        let raw = as_bytes(&e);
        let (ev, payload) = decode_record(&raw).expect("valid state event");
        assert!(payload.is_empty(), "a state event carries no payload");
        assert_eq!((ev.pid, ev.comm.as_str(), ev.ts_ns), (7, "curl", 1_000));
        let Some(Body::State(s)) = ev.body else {
            panic!("expected a state change")
        };
        assert_eq!(
            (s.old(), s.new()),
            (TcpState::SynSent, TcpState::Established)
        );
        let sock = s.sock.expect("sock");
        assert_eq!(sock.src().to_string(), "127.0.0.1:40000");
        assert_eq!(sock.dst().to_string(), "127.0.0.2:8080");
    }

    #[test]
    fn io_event_comes_back_with_its_payload_unsniffed() {
        let raw = io_record(b"GET / HTTP/1.1\r\n");
        let (ev, payload) = decode_record(&raw).expect("valid io event");
        let io = ev.io().expect("io body");
        assert_eq!(
            (io.bytes, io.captured, io.syscall(), payload),
            (1000, 16, Syscall::Sendto, &b"GET / HTTP/1.1\r\n"[..])
        );
        assert_eq!(io.sniff, None, "sniffing is the stream parser's job");
    }

    #[test]
    fn bad_lengths_are_errors_not_panics() {
        assert_eq!(decode_record(&[1, 2, 3]), Err(DecodeError::Short(3)));
        let mut unknown = as_bytes(&header(99));
        unknown.resize(96, 0);
        assert_eq!(decode_record(&unknown), Err(DecodeError::UnknownKind(99)));
        let state = abi::TsStateEvent {
            hdr: header(abi::EV_STATE),
            ..Default::default()
        };
        let raw = as_bytes(&state);
        assert!(
            matches!(decode_record(&raw[..90]), Err(DecodeError::Length { .. })),
            "truncated state event"
        );
        let io = io_record(b"abcdef");
        assert!(
            matches!(
                decode_record(&io[..io.len() - 3]),
                Err(DecodeError::Length { .. })
            ),
            "payload cut short"
        );
        let mut lying = io_record(b"");
        lying[112..116].copy_from_slice(&(abi::PAYLOAD_MAX as u32 + 1).to_ne_bytes());
        assert!(matches!(
            decode_record(&lying),
            Err(DecodeError::PayloadTooLong { .. })
        ));
        // Every prefix of a valid record decodes or errs, never panics.
        for n in 0..io.len() {
            let _ = decode_record(&io[..n]);
        }
    }
}
