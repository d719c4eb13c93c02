//! Request-body fields every API validates the same way: the JSON object itself, the
//! model, token limits, booleans and message text. Errors name the field, never its value.
use serde_json::{Map, Value};

use super::error::{field_error, ApiError};
use crate::engine::EngineConfig;

/// The body as a JSON object.
pub(crate) fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    // Parse to Value first: serde's typed errors would quote the offending value.
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            format!(
                "request body is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
            None,
        )
    })?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::bad_request(
            "request body must be a JSON object",
            None,
        )),
    }
}

/// The model asked for: absent means the served one; any other name is a 404.
pub(crate) fn model(obj: &Map<String, Value>, cfg: &EngineConfig) -> Result<String, ApiError> {
    let model = match obj.get("model") {
        None | Some(Value::Null) => cfg.model.clone(),
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(field_error("model", "a string")),
    };
    known_model(model, cfg)
}

/// `model` if the engine serves it, else the 404 OpenAI-style servers give.
pub(crate) fn known_model(model: String, cfg: &EngineConfig) -> Result<String, ApiError> {
    if model == cfg.model {
        Ok(model)
    } else {
        Err(ApiError::new(
            404,
            "NotFoundError",
            format!("The model `{model}` does not exist."),
        ))
    }
}

/// A token limit: absent gives the engine's default; it must lie in 1..=the engine's limit.
pub(crate) fn max_tokens(
    value: Option<&Value>,
    param: &'static str,
    cfg: &EngineConfig,
) -> Result<usize, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(cfg.default_max_tokens),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(t) if t >= 1 && t as usize <= cfg.max_tokens_limit => Ok(t as usize),
            _ => Err(field_error(
                param,
                &format!("an integer from 1 to {}", cfg.max_tokens_limit),
            )),
        },
        Some(_) => Err(field_error(param, "an integer")),
    }
}

/// A boolean field with its default when absent.
pub(crate) fn boolean(
    obj: &Map<String, Value>,
    param: &'static str,
    default: bool,
) -> Result<bool, ApiError> {
    match obj.get(param) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(field_error(param, "a boolean")),
    }
}

/// Refuses a body that does not ask for a stream (`route` serves streams only).
pub(crate) fn streaming_only(obj: &Map<String, Value>, route: &str) -> Result<(), ApiError> {
    if boolean(obj, "stream", false)? {
        return Ok(());
    }
    Err(ApiError::bad_request(
        format!("the lab serves {route} streaming only: send \"stream\": true"),
        Some("stream"),
    ))
}

/// The text of a message's `content`: a string, or a list of parts (objects; their
/// `text` strings count).
/// None when the content is absent or null (assistant turns that only called tools).
pub(crate) fn content_text(
    content: Option<&Value>,
    param: &'static str,
) -> Result<Option<String>, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                // Parts without text (images, tool results) give the engine no words.
                match (part.get("text"), part.is_object()) {
                    (Some(Value::String(t)), _) => {
                        text.push_str(t);
                        text.push(' ');
                    }
                    (None, true) => {}
                    _ => return Err(field_error(param, "content parts that are objects")),
                }
            }
            Ok(Some(text))
        }
        Some(_) => Err(field_error(param, "messages with string content")),
    }
}

/// Messages flattened for the engine's tokeniser: `role: text` lines.
pub(crate) fn messages_text(
    messages: Option<&Value>,
    param: &'static str,
    roles: &[&str],
) -> Result<String, ApiError> {
    let list = match messages {
        Some(Value::Array(a)) if !a.is_empty() => a,
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                format!("'{param}' is required"),
                Some(param),
            ))
        }
        Some(_) => return Err(field_error(param, "a non-empty list of messages")),
    };
    let mut text = String::new();
    for msg in list {
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| field_error(param, "messages with a string 'role'"))?;
        if !roles.contains(&role) {
            return Err(field_error(
                param,
                &format!("messages whose role is one of {roles:?}"),
            ));
        }
        text.push_str(role);
        text.push_str(": ");
        if let Some(t) = content_text(msg.get("content"), param)? {
            text.push_str(&t);
        }
        text.push('\n');
    }
    Ok(text)
}

/// `"2024-05-01T12:34:56.123456789Z"` (RFC 3339, UTC) for a Unix time in ns, as Ollama
/// stamps its lines.
pub(crate) fn rfc3339_utc(unix_ns: u128) -> String {
    let secs = (unix_ns / 1_000_000_000) as i64;
    let nanos = (unix_ns % 1_000_000_000) as u32;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Year, month, day of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000000000Z");
        // 2024-02-29T23:59:59.5Z: a leap day.
        assert_eq!(
            rfc3339_utc(1_709_251_199_500_000_000),
            "2024-02-29T23:59:59.500000000Z"
        );
    }

    #[test]
    fn token_limits_and_models_are_checked() {
        let cfg = EngineConfig::default();
        assert_eq!(
            max_tokens(None, "max_tokens", &cfg),
            Ok(cfg.default_max_tokens)
        );
        assert!(max_tokens(Some(&Value::from(0)), "max_tokens", &cfg).is_err());
        assert!(max_tokens(Some(&Value::from("9")), "max_tokens", &cfg).is_err());
        let obj = json_object(br#"{"model":"other"}"#).expect("an object");
        assert_eq!(model(&obj, &cfg).map_err(|e| e.status), Err(404));
        assert!(json_object(b"[1]").is_err(), "a list is not an object");
    }
}
