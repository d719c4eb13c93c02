//! The decoded event model. These prost messages are both the in-memory events
//! the rest of the collector works on and the record file's encoding, so a
//! replayed recording is exactly what the live run saw. Field tags are part of
//! the file format: add fields, never renumber.
//!
//! No payload bytes live here: socket payload prefixes are reduced at decode
//! time to a [`Sniff`] (HTTP start line and allow-listed headers, TLS record
//! headers, SSE events and hashes of bodies), so request bodies, completions, Authorization
//! and Cookie values never leave the process.

mod addr;
mod messages;

pub use addr::Addr;

/// One kernel event, decoded and redacted. Its protobuf encoding is written by hand
/// (`messages`), as prost would (tags 1-5, then the body's oneof tags 10-17), so that
/// the comm is kept inline rather than in a heap string of its own per event.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Event {
    /// CLOCK_MONOTONIC nanoseconds (tag 1).
    pub ts_ns: u64,
    /// Thread group id; 0 when the event ran outside the owning process (softirq) (tag 2).
    pub pid: u32,
    /// Tag 3.
    pub tid: u32,
    /// Tag 4.
    pub cpu: u32,
    /// The thread's name (tag 5): at most 15 bytes from the kernel, so inline.
    pub comm: Comm,
    /// Tags 10-17.
    pub body: Option<event::Body>,
}

/// An event's comm: a string kept inline up to 24 bytes (a kernel comm is at most 15).
pub type Comm = compact_str::CompactString;

/// A sniff's SSE events: one inline (a token per I/O is the common case).
pub type SseEvents = smallvec::SmallVec<[SseEvent; 1]>;

pub mod event {
    // Socket I/O is most events and carries its sniff inline; boxing it would cost an
    // allocation per event to save memory on the rarer kinds.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Body {
        #[prost(message, tag = "10")]
        State(super::StateChange),
        #[prost(message, tag = "11")]
        Io(super::SockIo),
        #[prost(message, tag = "12")]
        Accept(super::Accept),
        #[prost(message, tag = "13")]
        Retransmit(super::Retransmit),
        #[prost(message, tag = "14")]
        Cuda(super::CudaCall),
        #[prost(message, tag = "15")]
        Nvml(super::NvmlSample),
        #[prost(message, tag = "16")]
        Gpu(super::GpuActivity),
        #[prost(message, tag = "17")]
        Ring(super::RingCounters),
    }
}

/// The ring buffer's counters as the recorder read them at the event's time, written
/// when the drops moved: the recording's drops over time.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct RingCounters {
    /// Records the probes tried to put in the ring buffer so far.
    #[prost(uint64, tag = "1")]
    pub submitted: u64,
    /// Of those, records the ring buffer had no room for so far.
    #[prost(uint64, tag = "2")]
    pub dropped: u64,
}

/// A TCP socket: kernel address (its identity for its lifetime) and 4-tuple. Its
/// protobuf encoding is written by hand (`messages`), as prost would, so that the
/// addresses are kept inline rather than in two heap vectors per event.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Sock {
    /// Tag 1.
    pub skaddr: u64,
    /// 4 bytes for IPv4, 16 for IPv6, network order (tag 2).
    pub saddr: Addr,
    /// Tag 3.
    pub sport: u32,
    /// Tag 4.
    pub daddr: Addr,
    /// Tag 5.
    pub dport: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StateChange {
    #[prost(message, optional, tag = "1")]
    pub sock: Option<Sock>,
    #[prost(enumeration = "TcpState", tag = "2")]
    pub old: i32,
    #[prost(enumeration = "TcpState", tag = "3")]
    pub new: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Accept {
    #[prost(message, optional, tag = "1")]
    pub sock: Option<Sock>,
    #[prost(int32, tag = "2")]
    pub fd: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Retransmit {
    #[prost(message, optional, tag = "1")]
    pub sock: Option<Sock>,
    #[prost(enumeration = "TcpState", tag = "2")]
    pub state: i32,
}

/// One NVML reading of one device (a point of each counter series). Fields NVML
/// refused for the device are absent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NvmlSample {
    #[prost(uint32, tag = "1")]
    pub device: u32,
    #[prost(uint32, optional, tag = "2")]
    pub gpu_util_pct: Option<u32>,
    #[prost(uint32, optional, tag = "3")]
    pub mem_util_pct: Option<u32>,
    #[prost(uint32, optional, tag = "4")]
    pub sm_clock_mhz: Option<u32>,
    #[prost(uint32, optional, tag = "5")]
    pub mem_clock_mhz: Option<u32>,
    #[prost(uint64, optional, tag = "6")]
    pub mem_used_bytes: Option<u64>,
    #[prost(uint32, optional, tag = "7")]
    pub power_mw: Option<u32>,
    #[prost(uint32, optional, tag = "8")]
    pub temperature_c: Option<u32>,
    #[prost(uint64, optional, tag = "9")]
    pub throttle_reasons: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    pub pcie_tx_kbps: Option<u32>,
    #[prost(uint32, optional, tag = "11")]
    pub pcie_rx_kbps: Option<u32>,
}

/// A GPU activity record from the CUPTI hook (device time, CLOCK_MONOTONIC).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GpuActivity {
    #[prost(enumeration = "GpuActivityKind", tag = "1")]
    pub kind: i32,
    #[prost(uint64, tag = "2")]
    pub start_ns: u64,
    #[prost(uint64, tag = "3")]
    pub end_ns: u64,
    #[prost(uint32, tag = "4")]
    pub device: u32,
    #[prost(uint32, tag = "5")]
    pub stream: u32,
    #[prost(uint32, tag = "6")]
    pub correlation_id: u32,
    /// Kernel or NVTX range name (kernel names are code, not user data).
    #[prost(string, tag = "7")]
    pub name: String,
    /// Memcpy: bytes.
    #[prost(uint64, tag = "8")]
    pub bytes: u64,
    /// The CUDA graph it belongs to (0: none).
    #[prost(uint32, tag = "9")]
    pub graph_id: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum GpuActivityKind {
    Unknown = 0,
    Kernel = 1,
    Memcpy = 2,
    Graph = 3,
    Marker = 4,
}

/// A libcuda call's entry or return, seen by a uprobe.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CudaCall {
    #[prost(enumeration = "CudaApi", tag = "1")]
    pub api: i32,
    /// Entry (true) or return (false).
    #[prost(bool, tag = "2")]
    pub entry: bool,
    /// CUstream (CUevent for cuEventSynchronize); 0 when none.
    #[prost(uint64, tag = "3")]
    pub stream: u64,
    /// Device-to-host copies: bytes.
    #[prost(uint64, tag = "4")]
    pub bytes: u64,
    /// Returns: the CUresult.
    #[prost(int64, tag = "5")]
    pub result: i64,
    /// Through the per-thread default stream entry point (`cuLaunchKernel_ptsz`...).
    #[prost(bool, tag = "6")]
    pub per_thread_stream: bool,
}

impl CudaCall {
    /// The symbol that was called, `_ptsz` / `_ptds` form included.
    pub fn symbol(&self) -> String {
        let name = self.api().symbol();
        match (self.per_thread_stream, self.api()) {
            (false, _) => name.to_string(),
            (true, CudaApi::MemcpyDtoH) => format!("{name}_ptds"),
            (true, _) => format!("{name}_ptsz"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CudaApi {
    Unknown = 0,
    LaunchKernel = 1,
    LaunchKernelEx = 2,
    GraphLaunch = 3,
    MemcpyDtoHAsync = 4,
    MemcpyDtoH = 5,
    StreamSynchronize = 6,
    CtxSynchronize = 7,
    EventSynchronize = 8,
}

impl CudaApi {
    pub fn symbol(self) -> &'static str {
        match self {
            CudaApi::Unknown => "?",
            CudaApi::LaunchKernel => "cuLaunchKernel",
            CudaApi::LaunchKernelEx => "cuLaunchKernelEx",
            CudaApi::GraphLaunch => "cuGraphLaunch",
            CudaApi::MemcpyDtoHAsync => "cuMemcpyDtoHAsync_v2",
            CudaApi::MemcpyDtoH => "cuMemcpyDtoH_v2",
            CudaApi::StreamSynchronize => "cuStreamSynchronize",
            CudaApi::CtxSynchronize => "cuCtxSynchronize",
            CudaApi::EventSynchronize => "cuEventSynchronize",
        }
    }
}

/// One send or receive on a TCP socket.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SockIo {
    #[prost(message, optional, tag = "1")]
    pub sock: Option<Sock>,
    #[prost(enumeration = "Direction", tag = "2")]
    pub dir: i32,
    #[prost(enumeration = "Syscall", tag = "3")]
    pub syscall: i32,
    /// -1 when no syscall of ours carried it (sendfile, splice, io_uring).
    #[prost(int32, tag = "4")]
    pub fd: i32,
    /// Bytes the socket layer moved.
    #[prost(uint64, tag = "5")]
    pub bytes: u64,
    /// Bytes of payload the probe copied (<= bytes, <= the probe's cap).
    #[prost(uint32, tag = "6")]
    pub captured: u32,
    /// A user-memory read failed while copying the payload.
    #[prost(bool, tag = "7")]
    pub payload_fault: bool,
    #[prost(message, optional, tag = "8")]
    pub sniff: Option<Sniff>,
}

/// What the captured payload showed, read as part of its socket's byte stream
/// in one direction (see protocol::stream), with nothing private kept. Its protobuf
/// encoding is written by hand (model/messages.rs: the bytes prost's derive wrote), each
/// field's wire type and tag in its doc.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sniff {
    /// 64-bit FNV-1a of the captured prefix, in recordings written before be611d6; 0 since
    /// (no reader joins by it: SSE events, bodies and prefixes carry their own prints, and
    /// hashing every captured byte was 8% of the recorder's CPU).
    /// Wire: fixed64, tag = 1.
    pub fingerprint: u64,
    /// An HTTP head that completed in this I/O, or the TLS record headers in it.
    /// Wire: oneof = sniff::Kind, tags = 10, 11, 12.
    pub kind: Option<sniff::Kind>,
    /// The first byte of a new HTTP message is in this I/O.
    /// Wire: bool, tag = 20.
    pub message_start: bool,
    /// The HTTP message (head and body) ended in this I/O.
    /// Wire: bool, tag = 21.
    pub message_end: bool,
    /// Message body bytes in this I/O (after chunked framing is removed).
    /// Wire: uint64, tag = 22.
    pub body_bytes: u64,
    /// Set on the I/O where the body's fingerprint became known.
    /// Wire: message, optional, tag = 23.
    pub body_print: Option<BodyPrint>,
    /// Server-sent events that ended in this I/O, in order: nearly always one (a token),
    /// kept inline rather than in an allocation per I/O.
    /// Wire: message, repeated, tag = 24.
    pub sse: SseEvents,
    /// Bytes that could not be read as HTTP or TLS (garbage, another protocol,
    /// or a stream the parser lost because bytes went uncaptured).
    /// Wire: bool, tag = 25.
    pub unparsed: bool,
    /// The body is compressed (Content-Encoding). A gzip event stream is inflated to
    /// read its events; other encodings hide them.
    /// Wire: bool, tag = 26.
    pub compressed: bool,
    /// On the I/O that ended a request body: the hash of its first 1, 2, 3, ... KiB
    /// (whole KiB only, up to 64 KiB, until bytes went uncaptured). Prompts that share
    /// a prefix share the first hashes.
    /// Wire: fixed64, repeated, tag = 27.
    pub prefix_prints: Vec<u64>,
    /// HTTP/2: what each stream did in this I/O, in frame order (empty for HTTP/1.x
    /// and TLS records). Each stream's own sniff carries its head, body and events as
    /// an HTTP/1.x message would; the fields above describe the connection only.
    /// Wire: message, repeated, tag = 28.
    pub h2_streams: Vec<H2StreamSniff>,
    /// HTTP/2 frames that belong to no request (SETTINGS, PING, GOAWAY,
    /// connection WINDOW_UPDATE, PRIORITY): counted, never an exchange.
    /// Wire: uint32, tag = 29.
    pub h2_control_frames: u32,
    /// Malformed HTTP/2 input in this I/O (bad lengths, unknown frame types, truncated
    /// HPACK, oversized header blocks): counted, the frame skipped.
    /// Wire: uint32, tag = 30.
    pub h2_errors: u32,
    /// This I/O opened an HTTP/2 connection: the client preface, or a server's
    /// first SETTINGS.
    /// Wire: bool, tag = 31.
    pub h2_preface: bool,
    /// The parser bounds this I/O reached, one bit per `protocol::limits::Limit`
    /// (`Sniff::hit`, `Sniff::hits`). Tag 32 (a gzip-only flag) is retired.
    /// Wire: uint32, tag = 33.
    pub limits: u32,
}

/// One HTTP/2 stream's share of an I/O.
#[derive(Clone, PartialEq, prost::Message)]
pub struct H2StreamSniff {
    #[prost(uint32, tag = "1")]
    pub stream_id: u32,
    /// As for an HTTP/1.x message: `kind` is the request or response head (version
    /// "HTTP/2") when HEADERS ended here, `message_start` on the HEADERS that opened
    /// the stream in this direction, `message_end` on END_STREAM, then body bytes,
    /// body print, prefix prints and the SSE events of its DATA frames.
    #[prost(message, optional, tag = "2")]
    pub sniff: Option<Sniff>,
    /// RST_STREAM: the stream was cancelled.
    #[prost(bool, tag = "3")]
    pub reset: bool,
    /// Header fields that referenced HPACK table entries added before the parser
    /// joined the connection: counted, never guessed.
    #[prost(uint32, tag = "4")]
    pub unknown_headers: u32,
    /// The stream's first frame seen was not its opening HEADERS (the recording
    /// started mid-connection, or bytes went uncaptured).
    #[prost(bool, tag = "5")]
    pub attached_mid: bool,
}

/// Identifies a request body across hops without keeping it: a hash of its
/// first bytes and its length.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct BodyPrint {
    #[prost(fixed64, tag = "1")]
    pub hash: u64,
    #[prost(uint64, tag = "2")]
    pub length: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct SseEvent {
    /// FNV-1a of the event's data.
    #[prost(fixed64, tag = "1")]
    pub fingerprint: u64,
    #[prost(enumeration = "SseKind", tag = "2")]
    pub kind: i32,
    /// Whose shape the event has (recordings older than this field: `Unspecified`).
    #[prost(enumeration = "Api", tag = "3")]
    pub api: i32,
    /// The choice a token belongs to (OpenAI `n > 1`: each index is a stream of its own).
    #[prost(uint32, tag = "4")]
    pub choice: u32,
    #[prost(enumeration = "TokenKind", tag = "5")]
    pub token: i32,
    /// A token's text hashed (FNV-1a of the unescaped string; `protocol::shape`), never
    /// the text; 0 for none (and in recordings older than this field).
    #[prost(fixed64, tag = "6")]
    pub text_print: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum SseKind {
    /// No data lines (comments, keep-alives).
    Other = 0,
    /// A token event, by its API's rule (`protocol::shape`): for OpenAI a data event
    /// whose JSON carries a non-empty `choices`.
    Choice = 1,
    /// Any other data event (e.g. the final usage event, a ping).
    Data = 2,
    /// The stream's end: `data: [DONE]`, or the API's own end event.
    Done = 3,
}

/// The streaming API an event's shape belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Api {
    /// Recorded before events carried their API (OpenAI's shape was the only one read).
    Unspecified = 0,
    /// A data event of no shape below.
    Unknown = 1,
    OpenaiChat = 2,
    OpenaiCompletions = 3,
    OpenaiResponses = 4,
    Anthropic = 5,
    Gemini = 6,
    Tgi = 7,
    Ollama = 8,
    /// `choices` without the object or fields that tell chat from completions.
    Openai = 9,
}

impl Api {
    /// The name reports and `top` show.
    pub fn label(self) -> &'static str {
        match self {
            Api::Unspecified | Api::Openai => "openai",
            Api::Unknown => "unknown-sse",
            Api::OpenaiChat => "openai-chat",
            Api::OpenaiCompletions => "openai-completions",
            Api::OpenaiResponses => "openai-responses",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
            Api::Tgi => "tgi",
            Api::Ollama => "ollama",
        }
    }
}

/// What a token carries: answer text, reasoning, or a tool call's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum TokenKind {
    Text = 0,
    Reasoning = 1,
    Tool = 2,
}

pub mod sniff {
    /// Heads boxed: they are on a few I/Os of each exchange, and inline they made every
    /// event (moved several times on its way through the pipeline) 88 bytes larger.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, boxed, tag = "10")]
        HttpRequest(Box<super::HttpRequestHead>),
        #[prost(message, boxed, tag = "11")]
        HttpResponse(Box<super::HttpResponseHead>),
        #[prost(message, tag = "12")]
        Tls(super::TlsRecords),
    }
}

/// A request head. Its texts are inline up to 24 bytes (a method, a version and most
/// paths), so reading one does not allocate for them; its protobuf encoding is written
/// by hand (model/messages.rs) for that, as prost's derive wrote it for `String`s.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HttpRequestHead {
    /// Wire: string, tag = 1.
    pub method: CompactString,
    /// The path without its query string (queries can carry keys). Wire: string, tag = 2.
    pub path: CompactString,
    /// Wire: bool, tag = 3.
    pub has_query: bool,
    /// Wire: string, tag = 4.
    pub version: CompactString,
    /// Wire: message, repeated, tag = 5.
    pub headers: Vec<Header>,
    /// The head ended inside the captured prefix. Wire: bool, tag = 6.
    pub complete: bool,
}

/// A response head; its version inline, as `HttpRequestHead`'s texts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HttpResponseHead {
    /// Wire: string, tag = 1.
    pub version: CompactString,
    /// Wire: uint32, tag = 2.
    pub status: u32,
    /// Wire: message, repeated, tag = 3.
    pub headers: Vec<Header>,
    /// Wire: bool, tag = 4.
    pub complete: bool,
}

/// A header: its name always, its value only for allow-listed names. Both inline up to
/// 24 bytes (nearly every name and kept value), so reading a head does not allocate per
/// header; its protobuf encoding is written by hand (model/messages.rs) for that.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    /// Wire: string, tag = 1.
    pub name: CompactString,
    /// Wire: string, optional, tag = 2.
    pub value: Option<CompactString>,
}

pub use compact_str::CompactString;

#[derive(Clone, PartialEq, prost::Message)]
pub struct TlsRecords {
    /// Record headers that start inside the captured prefix, in order.
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<TlsRecord>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TlsRecord {
    /// 20 change_cipher_spec, 21 alert, 22 handshake, 23 application_data.
    #[prost(uint32, tag = "1")]
    pub content_type: u32,
    /// Record-layer version, e.g. 0x0303.
    #[prost(uint32, tag = "2")]
    pub version: u32,
    #[prost(uint32, tag = "3")]
    pub length: u32,
    /// For handshake records, the first message's type (1 ClientHello, 2 ServerHello, ...) when captured.
    #[prost(uint32, optional, tag = "4")]
    pub handshake_type: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum TcpState {
    Unknown = 0,
    Established = 1,
    SynSent = 2,
    SynRecv = 3,
    FinWait1 = 4,
    FinWait2 = 5,
    TimeWait = 6,
    Close = 7,
    CloseWait = 8,
    LastAck = 9,
    Listen = 10,
    Closing = 11,
    NewSynRecv = 12,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Direction {
    Unknown = 0,
    Send = 1,
    Recv = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Syscall {
    None = 0,
    Write = 1,
    Writev = 2,
    Sendto = 3,
    Sendmsg = 4,
    Read = 5,
    Readv = 6,
    Recvfrom = 7,
    Recvmsg = 8,
    /// TLS plaintext from OpenSSL's SSL_write / SSL_write_ex (uprobes).
    SslWrite = 9,
    /// TLS plaintext from OpenSSL's SSL_read / SSL_read_ex (uprobes).
    SslRead = 10,
}

impl TcpState {
    pub fn label(self) -> &'static str {
        match self {
            TcpState::Unknown => "UNKNOWN",
            TcpState::Established => "ESTABLISHED",
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::FinWait1 => "FIN_WAIT1",
            TcpState::FinWait2 => "FIN_WAIT2",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Close => "CLOSE",
            TcpState::CloseWait => "CLOSE_WAIT",
            TcpState::LastAck => "LAST_ACK",
            TcpState::Listen => "LISTEN",
            TcpState::Closing => "CLOSING",
            TcpState::NewSynRecv => "NEW_SYN_RECV",
        }
    }
}

impl Syscall {
    pub fn label(self) -> &'static str {
        match self {
            Syscall::None => "-",
            Syscall::Write => "write",
            Syscall::Writev => "writev",
            Syscall::Sendto => "sendto",
            Syscall::Sendmsg => "sendmsg",
            Syscall::Read => "read",
            Syscall::Readv => "readv",
            Syscall::Recvfrom => "recvfrom",
            Syscall::Recvmsg => "recvmsg",
            Syscall::SslWrite => "SSL_write",
            Syscall::SslRead => "SSL_read",
        }
    }
    /// The I/O is the application's plaintext of a TLS connection, not socket bytes.
    pub fn is_tls_plaintext(self) -> bool {
        matches!(self, Syscall::SslWrite | Syscall::SslRead)
    }
}

impl Sock {
    pub fn src(&self) -> std::net::SocketAddr {
        socket_addr(&self.saddr, self.sport)
    }
    pub fn dst(&self) -> std::net::SocketAddr {
        socket_addr(&self.daddr, self.dport)
    }
}

fn socket_addr(addr: &[u8], port: u32) -> std::net::SocketAddr {
    let ip = match addr.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(addr).expect("length checked")),
        16 => {
            let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(addr).expect("length checked"));
            v6.to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
        }
        _ => std::net::IpAddr::from([0, 0, 0, 0]),
    };
    std::net::SocketAddr::new(ip, port as u16)
}

impl Event {
    /// The socket the event is about, for every kind that has one.
    pub fn sock(&self) -> Option<&Sock> {
        match self.body.as_ref()? {
            event::Body::State(s) => s.sock.as_ref(),
            event::Body::Io(s) => s.sock.as_ref(),
            event::Body::Accept(s) => s.sock.as_ref(),
            event::Body::Retransmit(s) => s.sock.as_ref(),
            event::Body::Cuda(_)
            | event::Body::Nvml(_)
            | event::Body::Gpu(_)
            | event::Body::Ring(_) => None,
        }
    }
    pub fn io(&self) -> Option<&SockIo> {
        match self.body.as_ref()? {
            event::Body::Io(io) => Some(io),
            _ => None,
        }
    }
}
