//! Engine knobs: the costs of the simulated GPU and the vLLM-style scheduling switches.
use std::path::PathBuf;
use std::time::Duration;

/// Everything that shapes the simulated engine. Defaults give ~18 ms decode steps at a
/// batch of 16 and 0.2 ms per prompt token.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Model name served on /v1/models and accepted in requests.
    pub model: String,
    /// vLLM --enable-prefix-caching: a prompt whose prefix was seen skips that prefill.
    pub prefix_cache: bool,
    /// vLLM --enable-chunked-prefill: long prefills split into chunks beside decodes.
    pub chunked_prefill: bool,
    /// Fixed cost of every step (kernel launches, sampling, scheduling).
    pub step_overhead_ns: u64,
    /// Cost per prompt token computed in a step.
    pub prefill_token_ns: u64,
    /// Cost per sequence decoding in a step.
    pub decode_seq_ns: u64,
    /// Token budget of one step (vLLM --max-num-batched-tokens); with chunked prefill off
    /// a single prompt may exceed it, as it cannot be split.
    pub max_batched_tokens: usize,
    /// Sequences running at once (vLLM --max-num-seqs); more requests queue.
    pub max_running_seqs: usize,
    /// With chunked prefill, prompts with more tokens left than this are "long" and get
    /// the step budget only after shorter ones (vLLM --long-prefill-token-threshold), so
    /// one pasted document does not hold every new question's first token.
    pub long_prefill_token_threshold: usize,
    /// Prefix-cache granularity in tokens (vLLM block size).
    pub block_size: usize,
    /// Kernel launches per prefill chunk (one per simulated layer group).
    pub kernels_per_prefill: u32,
    /// max_tokens when a request gives none.
    pub default_max_tokens: usize,
    /// Largest max_tokens accepted.
    pub max_tokens_limit: usize,
    /// Time the gateway auth endpoint (/_lab/auth) takes to answer.
    pub auth_delay: Duration,
    /// Send `X-Accel-Buffering: no` on streams (makes nginx forward each chunk).
    pub x_accel_buffering_no: bool,
    /// Set TCP_NODELAY on accepted connections, as uvicorn does. Off, Nagle's algorithm
    /// holds a small write while an earlier small segment waits for the client's ACK.
    pub tcp_nodelay: bool,
    /// Write each chunk of a streamed response in two writes, the chunk and then its
    /// closing CRLF, and send the response head with the first token, as servers that
    /// frame chunks by hand do. With `tcp_nodelay` off this is the write-write pattern
    /// that waits for the client's delayed ACK.
    pub split_chunk_writes: bool,
    /// SO_SNDBUF of accepted connections (nginx's `listen ... sndbuf=`); None keeps the
    /// kernel's autotuning (up to 4 MiB, which a token stream never fills).
    pub send_buffer_bytes: Option<usize>,
    /// How often APIs with keep-alive events (Anthropic's `ping`) send one while they
    /// stream.
    pub ping_interval: Duration,
    /// KV-cache size in tokens (vLLM's blocks x block size, set by --gpu-memory-utilization);
    /// when running sequences outgrow it the newest is preempted and recomputed later.
    /// None: unbounded.
    pub kv_cache_tokens: Option<usize>,
    /// Host work per step with the GPU idle (output processing, detokenising, scheduling
    /// the next step), as a Python engine loop spends it: between a step's synchronisation
    /// and the next step's launches.
    pub host_overhead_ns: u64,
    /// vLLM --async-scheduling / SGLang's overlap scheduler: the host work of the next
    /// step runs while this step's work is on the GPU, so it costs nothing while it is
    /// shorter than the step.
    pub async_scheduling: bool,
    /// Call the driver's per-thread default stream entry points (`cuLaunchKernel_ptsz`...),
    /// as engines built with `--default-stream per-thread` do.
    pub per_thread_stream: bool,
    /// End each step with `cuCtxSynchronize_v2` (the whole device), as PyTorch on CUDA 13
    /// does for `torch.cuda.synchronize()`, instead of `cuStreamSynchronize`.
    pub device_sync: bool,
    /// Load this libcuda.so.1 instead of writing the embedded stand-in to a temp dir; a
    /// path that does not exist yet gets the stand-in written there and kept.
    pub libcuda_path: Option<PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            model: "lab-model".to_string(),
            prefix_cache: true,
            chunked_prefill: true,
            step_overhead_ns: 15_000_000,
            prefill_token_ns: 200_000,
            decode_seq_ns: 200_000,
            max_batched_tokens: 40,
            max_running_seqs: 32,
            long_prefill_token_threshold: 256,
            block_size: 16,
            kernels_per_prefill: 4,
            default_max_tokens: 64,
            max_tokens_limit: 4096,
            auth_delay: Duration::from_millis(40),
            x_accel_buffering_no: false,
            tcp_nodelay: true,
            split_chunk_writes: false,
            send_buffer_bytes: None,
            ping_interval: Duration::from_secs(5),
            kv_cache_tokens: None,
            host_overhead_ns: 0,
            async_scheduling: false,
            per_thread_stream: false,
            device_sync: false,
            libcuda_path: None,
        }
    }
}

impl EngineConfig {
    /// The untuned engine of the demo: no prefix cache, no chunked prefill.
    pub fn untuned() -> Self {
        EngineConfig {
            prefix_cache: false,
            chunked_prefill: false,
            ..EngineConfig::default()
        }
    }

    /// The tuned engine of the demo: prefix cache on, and chunked prefill with a step
    /// budget whose prefill chunk costs about what the step's decodes do (96 tokens: ~17
    /// ms of prefill beside ~17 ms of decoding at the default costs), as rule 5's fix
    /// says to size it. A much smaller budget stretches a long prompt over many steps'
    /// fixed overhead (at 40 tokens, 3.6x its unchunked prefill).
    pub fn tuned() -> Self {
        EngineConfig {
            max_batched_tokens: 96,
            ..EngineConfig::default()
        }
    }

    /// Cost of a decode-only step at a given batch size.
    pub fn decode_step_ns(&self, batch: usize) -> u64 {
        self.step_overhead_ns + self.decode_seq_ns * batch as u64
    }
}
