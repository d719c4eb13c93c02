//! The engine's side of the stand-in CUDA driver: the lab writes libcuda.so.1 to a
//! directory it owns, dlopens it, and issues each step's GPU work through the real
//! driver entry points, so uprobes on that file see genuine calls.
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The stand-in driver, built by build.rs from cuda/libcuda.c.
pub const STAND_IN_LIBCUDA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libcuda.so.1"));

/// File name the engine loads, as the real driver is named.
pub const LIBCUDA_FILE_NAME: &str = "libcuda.so.1";

#[derive(Debug, Error)]
pub enum CudaError {
    #[error("cannot write the stand-in libcuda to {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("dlopen {path} failed: {reason}")]
    Open { path: PathBuf, reason: String },
    #[error("{path} does not export {symbol}")]
    MissingSymbol { path: PathBuf, symbol: &'static str },
    #[error("{call} returned CUresult {code}")]
    Call { call: &'static str, code: i32 },
}

type CuResult = i32;
type CuInit = unsafe extern "C" fn(u32) -> CuResult;
type CuLaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type CuGraphLaunch = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult;
type CuMemcpyDtoHAsync = unsafe extern "C" fn(*mut c_void, u64, usize, *mut c_void) -> CuResult;
type CuStreamSynchronize = unsafe extern "C" fn(*mut c_void) -> CuResult;
type CuCtxSynchronizeV2 = unsafe extern "C" fn(*mut c_void) -> CuResult;
type LabCudaCounters = unsafe extern "C" fn(*mut CudaCallCounts);
type LabCudaLastSync = unsafe extern "C" fn(*mut u64, *mut u64);

/// Calls the stand-in driver has received, per entry point (since it was loaded).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CudaCallCounts {
    pub init: u64,
    pub launch_kernel: u64,
    pub graph_launch: u64,
    pub memcpy_dtoh_async: u64,
    pub stream_synchronize: u64,
    /// Of the above, calls through the `_ptsz` entry points.
    pub per_thread_stream: u64,
    /// Of the synchronisations, calls through `cuCtxSynchronize` / `cuCtxSynchronize_v2`.
    pub ctx_synchronize: u64,
}

const _: () = assert!(std::mem::size_of::<CudaCallCounts>() == 56);

const LAB_GRAPH_MAGIC: u64 = 0x4c41_4247_5241_5048;

/// Mirror of `struct lab_graph_exec` in cuda/libcuda.c: what our CUgraphExec points to.
#[repr(C)]
struct LabGraphExec {
    magic: u64,
    duration_ns: u64,
}

/// Opaque kernel handle; the stand-in only checks it is not null.
#[repr(C)]
struct LabFunction {
    name: [u8; 16],
}

/// A dlopened libcuda.so.1 and the entry points the engine drives.
pub struct CudaDriver {
    handle: *mut c_void,
    path: PathBuf,
    launch_kernel: CuLaunchKernel,
    graph_launch: CuGraphLaunch,
    memcpy_dtoh_async: CuMemcpyDtoHAsync,
    stream_synchronize: CuStreamSynchronize,
    /// Steps end with the whole device's synchronisation instead of the stream's.
    ctx_synchronize: Option<CuCtxSynchronizeV2>,
    /// The stand-in's device span of the last synchronised work (None: another driver).
    last_sync: Option<LabCudaLastSync>,
    kernel: Box<LabFunction>,
    graph: Box<LabGraphExec>,
    token_ids: Vec<u32>,
}

// SAFETY: the handle and boxed structs are only used from the thread owning the driver;
// moving it between threads is fine (dlopen handles are process-wide).
unsafe impl Send for CudaDriver {}

/// Writes the embedded stand-in driver into `dir` and returns the file's path.
pub fn install_stand_in(dir: &Path) -> Result<PathBuf, CudaError> {
    let path = dir.join(LIBCUDA_FILE_NAME);
    std::fs::write(&path, STAND_IN_LIBCUDA).map_err(|source| CudaError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-null pointer from dlerror is a valid C string.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl CudaDriver {
    /// dlopens the driver at `path` (a libcuda.so.1) and calls cuInit(0). With
    /// `per_thread_stream` the engine calls the `_ptsz` entry points, as a runtime built
    /// with `--default-stream per-thread` (PyTorch's option) does. With `device_sync` each
    /// step ends with `cuCtxSynchronize_v2`, as PyTorch on CUDA 13 does for
    /// `torch.cuda.synchronize()`, instead of `cuStreamSynchronize`.
    pub fn open(
        path: &Path,
        per_thread_stream: bool,
        device_sync: bool,
    ) -> Result<Self, CudaError> {
        let cpath =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| CudaError::Open {
                path: path.to_path_buf(),
                reason: "path contains NUL".into(),
            })?;
        // SAFETY: valid C string; RTLD_NOW resolves every symbol up front.
        let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(CudaError::Open {
                path: path.to_path_buf(),
                reason: dlerror_string(),
            });
        }
        let sym = |name: &'static str| -> Result<*mut c_void, CudaError> {
            let c = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: handle is a live dlopen handle.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            if p.is_null() {
                Err(CudaError::MissingSymbol {
                    path: path.to_path_buf(),
                    symbol: name,
                })
            } else {
                Ok(p)
            }
        };
        let entry = |plain: &'static str, ptsz: &'static str| {
            sym(if per_thread_stream { ptsz } else { plain })
        };
        // SAFETY: each symbol is transmuted to its documented driver signature.
        let driver = unsafe {
            let init: CuInit = std::mem::transmute::<*mut c_void, CuInit>(sym("cuInit")?);
            let driver =
                CudaDriver {
                    handle,
                    path: path.to_path_buf(),
                    launch_kernel: std::mem::transmute::<*mut c_void, CuLaunchKernel>(entry(
                        "cuLaunchKernel",
                        "cuLaunchKernel_ptsz",
                    )?),
                    graph_launch: std::mem::transmute::<*mut c_void, CuGraphLaunch>(entry(
                        "cuGraphLaunch",
                        "cuGraphLaunch_ptsz",
                    )?),
                    memcpy_dtoh_async: std::mem::transmute::<*mut c_void, CuMemcpyDtoHAsync>(
                        entry("cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz")?,
                    ),
                    stream_synchronize: std::mem::transmute::<*mut c_void, CuStreamSynchronize>(
                        entry("cuStreamSynchronize", "cuStreamSynchronize_ptsz")?,
                    ),
                    ctx_synchronize: if device_sync {
                        Some(std::mem::transmute::<*mut c_void, CuCtxSynchronizeV2>(sym(
                            "cuCtxSynchronize_v2",
                        )?))
                    } else {
                        None
                    },
                    last_sync: sym("lab_cuda_last_sync")
                        .ok()
                        .map(|p| std::mem::transmute::<*mut c_void, LabCudaLastSync>(p)),
                    kernel: Box::new(LabFunction {
                        name: *b"lab_prefill_attn",
                    }),
                    graph: Box::new(LabGraphExec {
                        magic: LAB_GRAPH_MAGIC,
                        duration_ns: 0,
                    }),
                    token_ids: vec![0; 1024],
                };
            check("cuInit", init(0))?;
            driver
        };
        Ok(driver)
    }

    /// Path of the loaded file (what uprobes attach to).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues one prefill kernel of the given simulated duration.
    pub fn launch_kernel(&mut self, duration_ns: u64) -> Result<(), CudaError> {
        let mut duration = duration_ns;
        let mut params: [*mut c_void; 1] = [&mut duration as *mut u64 as *mut c_void];
        let f = &mut *self.kernel as *mut LabFunction as *mut c_void;
        // SAFETY: params[0] points to a live u64 for the duration of the call.
        let rc = unsafe {
            (self.launch_kernel)(
                f,
                128,
                1,
                1,
                256,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check("cuLaunchKernel", rc)
    }

    /// Replays the decode CUDA graph with the given simulated duration.
    pub fn graph_launch(&mut self, duration_ns: u64) -> Result<(), CudaError> {
        self.graph.duration_ns = duration_ns;
        let g = &mut *self.graph as *mut LabGraphExec as *mut c_void;
        // SAFETY: g points to a live LabGraphExec with the magic the stand-in checks.
        check("cuGraphLaunch", unsafe {
            (self.graph_launch)(g, std::ptr::null_mut())
        })
    }

    /// Copies `tokens` sampled token ids (u32) back to the host, as every step ends.
    pub fn copy_token_ids(&mut self, tokens: usize) -> Result<(), CudaError> {
        if self.token_ids.len() < tokens {
            self.token_ids.resize(tokens, 0);
        }
        let bytes = tokens * std::mem::size_of::<u32>();
        // SAFETY: destination buffer holds at least `bytes` bytes.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            (self.memcpy_dtoh_async)(
                self.token_ids.as_mut_ptr() as *mut c_void,
                0x7000_0000,
                bytes,
                std::ptr::null_mut(),
            )
        })
    }

    /// The device span (start of the first, end of the last work) the last `synchronize`
    /// waited for, as the stand-in's GPU trace shows it; None from another driver.
    pub fn last_sync_span(&self) -> Option<(u64, u64)> {
        let f = self.last_sync?;
        let (mut start, mut end) = (0u64, 0u64);
        // SAFETY: two valid out-pointers; the stand-in only writes them.
        unsafe { f(&mut start, &mut end) };
        Some((start, end))
    }

    /// Blocks until the queued simulated work is done.
    pub fn synchronize(&mut self) -> Result<(), CudaError> {
        if let Some(ctx_synchronize) = self.ctx_synchronize {
            // SAFETY: plain call; a null context is the current one.
            return check("cuCtxSynchronize_v2", unsafe {
                ctx_synchronize(std::ptr::null_mut())
            });
        }
        // SAFETY: plain call with the default stream.
        check("cuStreamSynchronize", unsafe {
            (self.stream_synchronize)(std::ptr::null_mut())
        })
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // The stand-in keeps global counters; closing lets a fresh engine start at zero
        // when it loads its own copy from another directory.
        // SAFETY: handle came from dlopen and is closed once.
        unsafe { libc::dlclose(self.handle) };
    }
}

fn check(call: &'static str, code: i32) -> Result<(), CudaError> {
    if code == 0 {
        Ok(())
    } else {
        Err(CudaError::Call { call, code })
    }
}

/// Reads the stand-in's call counters from any thread through its own dlopen reference,
/// so the library stays loaded while the reader lives.
pub struct CudaCounterReader {
    handle: *mut c_void,
    read: LabCudaCounters,
}

// SAFETY: the counters function is thread-safe (atomic loads) and the handle is process-wide.
unsafe impl Send for CudaCounterReader {}
// SAFETY: as for Send: shared use only calls the thread-safe counters function.
unsafe impl Sync for CudaCounterReader {}

impl CudaCounterReader {
    /// None when the library at `path` has no lab counters (e.g. a real driver).
    pub fn open(path: &Path) -> Option<Self> {
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: valid C string.
        let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return None;
        }
        // SAFETY: live handle; the symbol has the lab_cuda_counters signature.
        let p = unsafe { libc::dlsym(handle, c"lab_cuda_counters".as_ptr()) };
        if p.is_null() {
            // SAFETY: handle from dlopen above.
            unsafe { libc::dlclose(handle) };
            return None;
        }
        Some(CudaCounterReader {
            handle,
            // SAFETY: see above.
            read: unsafe { std::mem::transmute::<*mut c_void, LabCudaCounters>(p) },
        })
    }

    pub fn read(&self) -> CudaCallCounts {
        let mut c = CudaCallCounts::default();
        // SAFETY: c matches struct lab_cuda_counters.
        unsafe { (self.read)(&mut c) };
        c
    }
}

impl Drop for CudaCounterReader {
    fn drop(&mut self) {
        // SAFETY: handle from dlopen, closed once.
        unsafe { libc::dlclose(self.handle) };
    }
}
