//! A small JSON Schema checker for the subset schema/report.schema.json uses
//! (type, enum, properties, required, additionalProperties, items, oneOf,
//! $ref to $defs), so the committed schema is tested against real output.

use serde_json::Value;

pub fn check(schema: &Value, value: &Value) -> Result<(), String> {
    at(schema, schema, value, "$")
}

fn at(root: &Value, s: &Value, v: &Value, path: &str) -> Result<(), String> {
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r
            .strip_prefix("#/$defs/")
            .ok_or_else(|| format!("{path}: unsupported $ref {r}"))?;
        let def = root["$defs"]
            .get(name)
            .ok_or_else(|| format!("{path}: unknown $ref {r}"))?;
        at(root, def, v, path)?;
    }
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        let ok = alts.iter().filter(|a| at(root, a, v, path).is_ok()).count();
        if ok != 1 {
            return Err(format!(
                "{path}: matches {ok} of oneOf's {} alternatives",
                alts.len()
            ));
        }
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(x) => vec![x.as_str()],
            Value::Array(xs) => xs.iter().filter_map(Value::as_str).collect(),
            _ => return Err(format!("{path}: bad type in schema")),
        };
        if !types.iter().any(|t| is_type(v, t)) {
            return Err(format!("{path}: expected {types:?}, got {v}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{path}: {v} not in {e:?}"));
        }
    }
    if let (Some(obj), true) = (v.as_object(), s.get("type").is_some_and(|t| t == "object")) {
        let props = s.get("properties").and_then(Value::as_object);
        for req in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let k = req.as_str().unwrap_or_default();
            if !obj.contains_key(k) {
                return Err(format!("{path}: missing required {k}"));
            }
        }
        for (k, val) in obj {
            let sub = format!("{path}.{k}");
            match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                (Some(ps), _) => at(root, ps, val, &sub)?,
                (None, Some(Value::Bool(false))) => {
                    return Err(format!("{sub}: not in the schema"))
                }
                (None, Some(extra)) if extra.is_object() => at(root, extra, val, &sub)?,
                _ => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            at(root, items, x, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}
