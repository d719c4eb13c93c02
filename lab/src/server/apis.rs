//! One validated request of any API: what the engine needs (prompt, token budget) and the
//! framer that writes the API's response around the engine's tokens.
use super::anthropic::{self, MessagesFramer, MessagesRequest};
use super::error::ApiError;
use super::framing::{Framer, StreamContext};
use super::gemini::{self, GeminiFramer, GeminiRequest};
use super::ollama::{self, OllamaFramer, OllamaRequest, OllamaRoute};
use super::openai::{self, Endpoint, GenerationRequest, StreamFormatter, WholeResponse};
use super::responses::{self, ResponsesFramer, ResponsesRequest};
use super::tgi::{self, TgiFramer, TgiRequest};
use crate::api::Api;
use crate::engine::EngineConfig;

/// A request the engine will serve, as its API asked for it.
#[derive(Debug, Clone)]
pub(crate) enum Parsed {
    OpenAi(GenerationRequest),
    Responses(ResponsesRequest),
    Anthropic(MessagesRequest),
    Gemini(GeminiRequest),
    Tgi(TgiRequest),
    Ollama(OllamaRequest),
}

impl Parsed {
    /// Validates `body` (and Gemini's path and query) as `api` defines its requests.
    pub(crate) fn parse(
        api: Api,
        path: &str,
        query: Option<&str>,
        body: &[u8],
        cfg: &EngineConfig,
    ) -> Result<Parsed, ApiError> {
        Ok(match api {
            Api::OpenAiChat => {
                Parsed::OpenAi(openai::parse_request(Endpoint::ChatCompletions, body, cfg)?)
            }
            Api::OpenAiCompletions => {
                Parsed::OpenAi(openai::parse_request(Endpoint::Completions, body, cfg)?)
            }
            Api::OpenAiResponses => Parsed::Responses(responses::parse(body, cfg)?),
            Api::Anthropic => Parsed::Anthropic(anthropic::parse(body, cfg)?),
            Api::Gemini => {
                let model = gemini::model_of_path(path).unwrap_or_default();
                Parsed::Gemini(gemini::parse(model, query, body, cfg)?)
            }
            Api::Tgi => Parsed::Tgi(tgi::parse(body, cfg)?),
            Api::OllamaGenerate => Parsed::Ollama(ollama::parse(OllamaRoute::Generate, body, cfg)?),
            Api::OllamaChat => Parsed::Ollama(ollama::parse(OllamaRoute::Chat, body, cfg)?),
        })
    }

    /// The text the engine tokenises.
    pub(crate) fn prompt_text(&self) -> &str {
        match self {
            Parsed::OpenAi(r) => &r.prompt_text,
            Parsed::Responses(r) => &r.prompt_text,
            Parsed::Anthropic(r) => &r.prompt_text,
            Parsed::Gemini(r) => &r.prompt_text,
            Parsed::Tgi(r) => &r.prompt_text,
            Parsed::Ollama(r) => &r.prompt_text,
        }
    }

    /// Engine steps (tokens per choice) to generate.
    pub(crate) fn max_tokens(&self) -> usize {
        match self {
            Parsed::OpenAi(r) => r.max_tokens,
            Parsed::Responses(r) => r.max_tokens,
            Parsed::Anthropic(r) => r.max_tokens,
            Parsed::Gemini(r) => r.max_tokens,
            Parsed::Tgi(r) => r.max_tokens,
            Parsed::Ollama(r) => r.max_tokens,
        }
    }

    /// Streamed, or one body after the last step.
    pub(crate) fn stream(&self) -> bool {
        match self {
            Parsed::OpenAi(r) => r.stream,
            Parsed::Ollama(r) => r.stream,
            Parsed::Responses(_) | Parsed::Anthropic(_) | Parsed::Gemini(_) | Parsed::Tgi(_) => {
                true
            }
        }
    }

    /// The model the response names.
    pub(crate) fn model<'a>(&'a self, cfg: &'a EngineConfig) -> &'a str {
        match self {
            Parsed::OpenAi(r) => &r.model,
            Parsed::Responses(r) => &r.model,
            Parsed::Gemini(r) => &r.model,
            Parsed::Ollama(r) => &r.model,
            Parsed::Anthropic(r) => &r.model,
            Parsed::Tgi(_) => &cfg.model,
        }
    }

    /// The framer of this request's response.
    pub(crate) fn framer(&self, ctx: StreamContext) -> Box<dyn Framer> {
        match self {
            Parsed::OpenAi(r) => {
                let prefix = match r.endpoint {
                    Endpoint::Completions => "cmpl-lab",
                    Endpoint::ChatCompletions => "chatcmpl-lab",
                };
                let id = format!("{prefix}-{}", ctx.request_id);
                if r.stream {
                    Box::new(StreamFormatter::new(
                        r,
                        id,
                        ctx.created_unix,
                        ctx.prompt_tokens,
                    ))
                } else {
                    Box::new(WholeResponse {
                        req: r.clone(),
                        id,
                        created: ctx.created_unix,
                        prompt_tokens: ctx.prompt_tokens,
                    })
                }
            }
            Parsed::Responses(r) => Box::new(ResponsesFramer::new(r, ctx)),
            Parsed::Anthropic(r) => Box::new(MessagesFramer::new(r, ctx)),
            Parsed::Gemini(_) => Box::new(GeminiFramer::new(ctx)),
            Parsed::Tgi(_) => Box::new(TgiFramer::new(&ctx)),
            Parsed::Ollama(r) => Box::new(OllamaFramer::new(r, ctx)),
        }
    }
}
