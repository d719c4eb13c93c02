//! The committed report schema (schema/report.schema.json), checked by a real JSON Schema
//! validator: types, enums, required and unknown fields, and minimum/maximum too.

use serde_json::Value;

/// schema/report.schema.json, parsed.
pub fn report_schema() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/report.schema.json");
    let text = std::fs::read_to_string(path).expect("schema/report.schema.json is readable");
    serde_json::from_str(&text).expect("schema/report.schema.json is JSON")
}

/// Checks `report` against the committed schema; the error names every violation with
/// its JSON pointer.
pub fn check_report_schema(report: &Value) -> Result<(), String> {
    let schema = report_schema();
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| format!("schema/report.schema.json is not a valid JSON Schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(report)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
