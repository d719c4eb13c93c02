//! Why NVML sampling could not start, as one line a user can act on.

use nvml_wrapper::error::NvmlError as WrapperError;

#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be opened, or it is not NVML: there is no NVIDIA driver.
    #[error("NVML not available: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?): {0}")]
    NotAvailable(String),
    /// The library loaded but nvmlInit refused: kernel module missing, no permission, ...
    #[error("driver not loaded / NVML init failed: {0}")]
    InitFailed(WrapperError),
    /// NVML initialised, then a query every sampler needs failed.
    #[error("NVML {what} failed: {source}")]
    Query {
        what: &'static str,
        source: WrapperError,
    },
    #[error("NVML sampler thread could not be started: {0}")]
    Thread(#[from] std::io::Error),
}

impl NvmlError {
    /// Sorts an error from `Nvml::builder().init()` into "no library" vs "init refused".
    pub(crate) fn from_init(error: WrapperError) -> Self {
        match error {
            WrapperError::LibloadingError(e) => NvmlError::NotAvailable(e.to_string()),
            WrapperError::FailedToLoadSymbol(e) => {
                NvmlError::NotAvailable(format!("the library lacks nvmlInit_v2: {e}"))
            }
            other => NvmlError::InitFailed(other),
        }
    }

    pub(crate) fn query(what: &'static str) -> impl FnOnce(WrapperError) -> Self {
        move |source| NvmlError::Query { what, source }
    }
}
