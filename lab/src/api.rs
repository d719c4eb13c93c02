//! The streaming APIs the lab engine speaks and bench drives: one name per wire format,
//! shared by the server's routes, bench's `--api` and the records bench writes.
use std::fmt;

use clap::ValueEnum;

/// Most choices one OpenAI request may ask for (`n`): the engine samples each per step.
pub const MAX_CHOICES: usize = 8;

/// One streaming API, named as `bench --api` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Api {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`), SSE `data:` chunks, `[DONE]`.
    #[value(name = "openai-chat")]
    OpenAiChat,
    /// OpenAI (legacy) Completions (`POST /v1/completions`), as vLLM serves it.
    #[value(name = "openai-completions")]
    OpenAiCompletions,
    /// OpenAI Responses (`POST /v1/responses`): typed SSE events with sequence numbers.
    #[value(name = "openai-responses")]
    OpenAiResponses,
    /// Anthropic Messages (`POST /v1/messages`): named SSE events, content blocks, pings.
    #[value(name = "anthropic")]
    Anthropic,
    /// Gemini (`POST /v1beta/models/{model}:streamGenerateContent?alt=sse`).
    #[value(name = "gemini")]
    Gemini,
    /// Hugging Face TGI's native `POST /generate_stream`.
    #[value(name = "tgi")]
    Tgi,
    /// Ollama's native `POST /api/generate`, NDJSON.
    #[value(name = "ollama-generate")]
    OllamaGenerate,
    /// Ollama's native `POST /api/chat`, NDJSON.
    #[value(name = "ollama-chat")]
    OllamaChat,
}

impl Api {
    pub const ALL: [Api; 8] = [
        Api::OpenAiChat,
        Api::OpenAiCompletions,
        Api::OpenAiResponses,
        Api::Anthropic,
        Api::Gemini,
        Api::Tgi,
        Api::OllamaGenerate,
        Api::OllamaChat,
    ];

    /// The name `--api` takes and records carry.
    pub fn name(self) -> &'static str {
        match self {
            Api::OpenAiChat => "openai-chat",
            Api::OpenAiCompletions => "openai-completions",
            Api::OpenAiResponses => "openai-responses",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
            Api::Tgi => "tgi",
            Api::OllamaGenerate => "ollama-generate",
            Api::OllamaChat => "ollama-chat",
        }
    }

    /// The route (path and query) a request of this API is posted to.
    pub fn route(self, model: &str) -> String {
        match self {
            Api::OpenAiChat => "/v1/chat/completions".into(),
            Api::OpenAiCompletions => "/v1/completions".into(),
            Api::OpenAiResponses => "/v1/responses".into(),
            Api::Anthropic => "/v1/messages".into(),
            Api::Gemini => format!("/v1beta/models/{model}:streamGenerateContent?alt=sse"),
            Api::Tgi => "/generate_stream".into(),
            Api::OllamaGenerate => "/api/generate".into(),
            Api::OllamaChat => "/api/chat".into(),
        }
    }

    /// Streams as newline-delimited JSON rather than SSE (Ollama).
    pub fn is_ndjson(self) -> bool {
        matches!(self, Api::OllamaGenerate | Api::OllamaChat)
    }

    /// Whether the server answers `"stream": false` on this API's route with one JSON body.
    pub fn can_answer_whole(self) -> bool {
        matches!(
            self,
            Api::OpenAiChat | Api::OpenAiCompletions | Api::OllamaGenerate | Api::OllamaChat
        )
    }

    /// Whether requests of this API may ask for several choices (`n`).
    pub fn has_choices(self) -> bool {
        matches!(self, Api::OpenAiChat | Api::OpenAiCompletions)
    }

    /// Whether a request can ask for reasoning and forced tool-call output.
    pub fn has_reasoning_and_tools(self) -> bool {
        matches!(self, Api::OpenAiResponses | Api::Anthropic)
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_the_command_line_parser() {
        for api in Api::ALL {
            let parsed = Api::from_str(api.name(), false).expect("every name parses");
            assert_eq!(parsed, api, "{api} parses back to itself");
        }
        assert_eq!(
            Api::Gemini.route("m"),
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            "Gemini's route names the model and asks for SSE"
        );
    }
}
