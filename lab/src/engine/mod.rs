//! The simulated inference engine: a scheduler thread that runs continuous-batching steps
//! on the stand-in GPU, and the HTTP server of every streaming API in front of it.
pub mod config;
pub mod requests;
pub mod scheduler;
pub mod steplog;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{mpsc as tmpsc, watch};

use crate::cuda::{self, CudaCallCounts, CudaCounterReader, CudaDriver, CudaError};
use crate::words::pseudo_word;
use collector::clock::monotonic_ns;
pub use config::EngineConfig;
pub use requests::{RequestLog, ServedRequest};
pub use scheduler::Prompt;
use scheduler::{Scheduler, Sequence, StepPlan};
pub use steplog::{Step, StepKind, StepLog, StepRequest};

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot create a directory for the stand-in libcuda: {0}")]
    TempDir(std::io::Error),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error("the scheduler thread could not start: {0}")]
    Thread(String),
}

/// One sampled token on its way to the request's HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEvent {
    pub index: usize,
    pub text: String,
    pub finished: bool,
    /// Prompt tokens served from the prefix cache (known once the request was scheduled).
    pub cached_prompt_tokens: usize,
}

/// A request handed to the scheduler thread.
pub(crate) struct Submission {
    pub id: u64,
    pub prompt: Prompt,
    pub max_tokens: usize,
    pub seed: u64,
    pub sink: tmpsc::UnboundedSender<TokenEvent>,
}

enum Command {
    Submit(Submission),
    Stop,
}

/// What the HTTP side needs to submit work; cheap to clone.
#[derive(Clone)]
pub(crate) struct EngineCore {
    pub cfg: Arc<EngineConfig>,
    pub requests: RequestLog,
    commands: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
}

impl EngineCore {
    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a request; false when the engine has stopped.
    pub(crate) fn submit(&self, s: Submission) -> bool {
        self.commands.send(Command::Submit(s)).is_ok()
    }
}

/// A running engine: scheduler thread, stand-in GPU and HTTP server on `addr()`.
pub struct Engine {
    addr: SocketAddr,
    core: EngineCore,
    step_log: StepLog,
    libcuda_path: PathBuf,
    counters: Option<CudaCounterReader>,
    shutdown: watch::Sender<bool>,
    server: Option<tokio::task::JoinHandle<()>>,
    scheduler: Option<thread::JoinHandle<()>>,
    // Declared last: dropped after the library that lives in it was closed.
    _libcuda_dir: Option<tempfile::TempDir>,
}

impl Engine {
    /// Starts an engine listening on `listen` (port 0 picks a free port). Must be called
    /// inside a tokio runtime.
    pub async fn start(cfg: EngineConfig, listen: SocketAddr) -> Result<Engine, EngineError> {
        let (libcuda_path, dir) = match &cfg.libcuda_path {
            // A path that does not exist yet gets the stand-in, kept there (stable for probes).
            Some(p) if !p.exists() => {
                std::fs::write(p, cuda::STAND_IN_LIBCUDA).map_err(|source| CudaError::Write {
                    path: p.clone(),
                    source,
                })?;
                (p.clone(), None)
            }
            Some(p) => (p.clone(), None),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("tokenscope-lab-cuda-")
                    .tempdir()
                    .map_err(EngineError::TempDir)?;
                (cuda::install_stand_in(dir.path())?, Some(dir))
            }
        };
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| EngineError::Listen {
                addr: listen,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| EngineError::Listen {
                addr: listen,
                source,
            })?;
        let step_log = StepLog::default();
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let thread_cfg = cfg.clone();
        let thread_log = step_log.clone();
        let thread_path = libcuda_path.clone();
        let scheduler = thread::Builder::new()
            .name("lab-scheduler".into())
            .spawn(move || {
                let driver = match CudaDriver::open(
                    &thread_path,
                    thread_cfg.per_thread_stream,
                    thread_cfg.device_sync,
                ) {
                    Ok(d) => {
                        let _ = ready_tx.send(Ok(()));
                        d
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                SchedulerLoop::new(thread_cfg, driver, thread_log).run(rx);
            })
            .map_err(|e| EngineError::Thread(e.to_string()))?;
        match ready_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(EngineError::Thread("exited during start".into())),
        }
        let counters = CudaCounterReader::open(&libcuda_path);
        let core = EngineCore {
            cfg: Arc::new(cfg),
            requests: RequestLog::default(),
            commands: tx,
            next_id: Arc::new(AtomicU64::new(1)),
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        let server = tokio::spawn(crate::server::serve(listener, core.clone(), shutdown_rx));
        Ok(Engine {
            addr,
            core,
            step_log,
            libcuda_path,
            counters,
            shutdown,
            server: Some(server),
            scheduler: Some(scheduler),
            _libcuda_dir: dir,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the base of every API's routes (/v1/..., /api/..., /generate_stream).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.core.cfg
    }

    /// The step log, shared: it keeps filling while the engine runs.
    pub fn step_log(&self) -> StepLog {
        self.step_log.clone()
    }

    /// Requests as the engine served them (arrival, each token's write), shared.
    pub fn request_log(&self) -> RequestLog {
        self.core.requests.clone()
    }

    /// The libcuda.so.1 file the engine loaded (what GPU uprobes attach to).
    pub fn libcuda_path(&self) -> &Path {
        &self.libcuda_path
    }

    /// Calls the stand-in libcuda received so far; None when the loaded library is not
    /// the stand-in.
    pub fn cuda_call_counts(&self) -> Option<CudaCallCounts> {
        self.counters.as_ref().map(|c| c.read())
    }

    /// Stops the server and the scheduler and waits for both.
    pub async fn shutdown(mut self) {
        self.stop();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        if let Some(t) = self.scheduler.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }

    fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        let _ = self.core.commands.send(Command::Stop);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
        if let Some(server) = self.server.take() {
            server.abort();
        }
        // Not joined: the scheduler exits after its current step (up to a long prefill),
        // and Drop may run on a runtime thread. The mapped library survives its file.
        drop(self.scheduler.take());
    }
}

/// The scheduler thread: admits requests, runs steps through the driver, emits tokens.
struct SchedulerLoop {
    sched: Scheduler,
    driver: CudaDriver,
    log: StepLog,
    sinks: HashMap<u64, (tmpsc::UnboundedSender<TokenEvent>, u64)>,
    steps: u64,
}

impl SchedulerLoop {
    fn new(cfg: EngineConfig, driver: CudaDriver, log: StepLog) -> Self {
        SchedulerLoop {
            sched: Scheduler::new(cfg),
            driver,
            log,
            sinks: HashMap::new(),
            steps: 0,
        }
    }

    fn accept(&mut self, s: Submission) {
        self.sinks.insert(s.id, (s.sink, s.seed));
        self.sched.add(Sequence::new(s.id, s.prompt, s.max_tokens));
    }

    fn run(mut self, commands: mpsc::Receiver<Command>) {
        loop {
            if self.sched.is_idle() {
                match commands.recv() {
                    Ok(Command::Submit(s)) => self.accept(s),
                    Ok(Command::Stop) | Err(_) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(Command::Submit(s)) => self.accept(s),
                    Ok(Command::Stop) | Err(mpsc::TryRecvError::Disconnected) => return,
                    Err(mpsc::TryRecvError::Empty) => break,
                }
            }
            // vLLM aborts a request when its client disconnects; so do we, before planning.
            let gone: Vec<u64> = self
                .sinks
                .iter()
                .filter(|(_, (sink, _))| sink.is_closed())
                .map(|(id, _)| *id)
                .collect();
            for id in gone {
                self.sinks.remove(&id);
                self.sched.abort(id);
            }
            let Some(plan) = self.sched.plan_step() else {
                continue;
            };
            if let Err(e) = self.run_step(plan) {
                // A failing driver is a broken lab, not a request error: stop serving.
                eprintln!("tokenscope-lab: scheduler stopped: {e}");
                return;
            }
        }
    }

    /// Issues the step's GPU work as vLLM does (prefill kernels, one decode graph, token
    /// copy, synchronize) and hands out the sampled tokens.
    fn run_step(&mut self, plan: StepPlan) -> Result<(), CudaError> {
        let cfg = self.sched.config().clone();
        let cost = plan.cost_ns(&cfg);
        let start = monotonic_ns();
        let mut kernel_launches = 0;
        let mut graph_launches = 0;
        let mut overhead_left = cfg.step_overhead_ns;
        if !plan.decode.is_empty() {
            let decode_ns = overhead_left + cfg.decode_seq_ns * plan.decode.len() as u64;
            overhead_left = 0;
            self.driver.graph_launch(decode_ns)?;
            graph_launches += 1;
        }
        let k = cfg.kernels_per_prefill.max(1);
        for &(_, tokens, _) in &plan.prefill {
            let chunk_ns = cfg.prefill_token_ns * tokens as u64;
            for i in 0..k {
                let mut d = chunk_ns / k as u64;
                if i == 0 {
                    d += chunk_ns % k as u64 + overhead_left;
                    overhead_left = 0;
                }
                self.driver.launch_kernel(d)?;
                kernel_launches += 1;
            }
        }
        // vLLM V1 samples a token for every scheduled request, copies them all to the host
        // and drops there the rows of prompts still in prefill.
        self.driver
            .copy_token_ids(plan.prefill.len() + plan.decode.len())?;
        let sampled = plan.sampled();
        let host = Duration::from_nanos(cfg.host_overhead_ns);
        if cfg.async_scheduling {
            // The next step's host work, overlapped with this step's GPU work.
            std::thread::sleep(host);
        }
        self.driver.synchronize()?;
        let end = monotonic_ns();
        let gpu = self.driver.last_sync_span();
        if !cfg.async_scheduling {
            // Output processing and the next step's scheduling, the GPU waiting.
            std::thread::sleep(host);
        }
        self.log.push(Step {
            index: self.steps,
            start_ns: start,
            end_ns: end,
            gpu_start_ns: gpu.map(|g| g.0),
            gpu_end_ns: gpu.map(|g| g.1),
            kind: plan.kind(),
            requests: plan.step_requests(),
            prefill_tokens: plan.prefill_tokens() as u32,
            decode_seqs: plan.decode.len() as u32,
            cost_ns: cost,
            kernel_launches,
            graph_launches,
            preempted: self.sched.take_preempted(),
        });
        self.steps += 1;
        let cached: HashMap<u64, usize> = sampled
            .iter()
            .filter_map(|id| self.sched.cached_tokens(*id).map(|c| (*id, c)))
            .collect();
        for (id, index, finished) in self.sched.finish_step(&plan) {
            let Some((sink, seed)) = self.sinks.get(&id) else {
                continue;
            };
            let event = TokenEvent {
                index,
                text: format!(" {}", pseudo_word(*seed, index as u64)),
                finished,
                cached_prompt_tokens: cached.get(&id).copied().unwrap_or(0),
            };
            let delivered = sink.send(event).is_ok();
            if finished || !delivered {
                self.sinks.remove(&id);
                if !delivered {
                    self.sched.abort(id);
                }
            }
        }
        Ok(())
    }
}
