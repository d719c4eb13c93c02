//! The engine's own view of each request: when it arrived and when each token's SSE frame
//! was handed to the connection (the "engine write" observation point, for checking the
//! profiler against ground truth).
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// One request as the engine served it, CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ServedRequest {
    pub request_id: u64,
    /// The `id` field of the response (`cmpl-lab-N` / `chatcmpl-lab-N`); bench records it.
    pub response_id: String,
    pub stream: bool,
    pub prompt_tokens: u32,
    pub cached_prompt_tokens: u32,
    /// The read that brought the request's head off the socket (the handler's entry when
    /// unknown): where a server's TTFT from its first request byte starts.
    pub head_ns: u64,
    /// Body read and request handed to the scheduler.
    pub received_ns: u64,
    /// When each token's frame was handed to the HTTP connection.
    pub token_ns: Vec<u64>,
    pub finished: bool,
}

/// Keeps a long-running engine bounded; tests stay far below it.
const MAX_REQUESTS_KEPT: usize = 100_000;

/// Shared log of served requests, keyed by request id.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    requests: Arc<Mutex<BTreeMap<u64, ServedRequest>>>,
}

impl RequestLog {
    pub(crate) fn received(&self, r: ServedRequest) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MAX_REQUESTS_KEPT {
            m.pop_first();
        }
        m.insert(r.request_id, r);
    }

    pub(crate) fn token(&self, request_id: u64, t_ns: u64, cached: usize, finished: bool) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = m.get_mut(&request_id) {
            r.token_ns.push(t_ns);
            r.cached_prompt_tokens = cached as u32;
            r.finished |= finished;
        }
    }

    /// Every request so far, by id.
    pub fn snapshot(&self) -> Vec<ServedRequest> {
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        m.values().cloned().collect()
    }

    /// The request whose response carried this `id`.
    pub fn by_response_id(&self, response_id: &str) -> Option<ServedRequest> {
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        m.values().find(|r| r.response_id == response_id).cloned()
    }
}
