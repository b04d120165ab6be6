//! The request fields that ask for structured outputs -> one engine constraint, as vLLM reads
//! them: OpenAI's `response_format`, vLLM's `structured_outputs` object and its older
//! `guided_*` fields. At most one constraint may be given, whichever field carries it.

use ferrite_engine::{Constraint, JsonOptions, StructuredOutputs};
use serde_json::Value;

use crate::error::ApiError;
use crate::protocol::SamplingFields;

const KINDS: [&str; 6] = ["json", "regex", "choice", "grammar", "json_object", "structural_tag"];
const OPTIONS: [&str; 3] = ["disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"];

/// A JSON schema given as an object or as its serialized text.
fn schema(param: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(text) => serde_json::from_str(text)
            .map_err(|e| ApiError::invalid(param, format!("{param} is not a valid JSON schema: {e}"))),
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        _ => Err(ApiError::invalid(param, format!("{param} must be a JSON schema (an object), got {v}"))),
    }
}

fn string(param: &str, v: &Value) -> Result<String, ApiError> {
    v.as_str().map(str::to_owned).ok_or_else(|| ApiError::invalid(param, format!("{param} must be a string, got {v}")))
}

fn choices(param: &str, v: &Value) -> Result<Vec<String>, ApiError> {
    let list = v.as_array().and_then(|a| a.iter().map(|c| c.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>());
    match list {
        Some(list) if !list.is_empty() => Ok(list),
        _ => Err(ApiError::invalid(param, format!("{param} must be a non-empty list of strings, got {v}"))),
    }
}

fn flag(param: &str, v: &Value) -> Result<bool, ApiError> {
    v.as_bool().ok_or_else(|| ApiError::invalid(param, format!("{param} must be a boolean, got {v}")))
}

fn response_format(format: &Value) -> Result<Option<Constraint>, ApiError> {
    const P: &str = "response_format";
    let kind = format.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            P,
            "response_format must be an object with a `type` (text, json_object, json_schema, structural_tag)",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Constraint::JsonObject)),
        "json_schema" => {
            let s = format
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| ApiError::invalid(P, "response_format of type json_schema needs json_schema.schema"))?;
            Ok(Some(Constraint::Json(schema("response_format.json_schema.schema", s)?)))
        }
        "structural_tag" => Ok(Some(Constraint::StructuralTag(format.clone()))),
        other => Err(ApiError::invalid(
            P,
            format!("response_format type {other:?} is not one of text, json_object, json_schema, structural_tag"),
        )),
    }
}

/// The request's structured-output constraint, if any.
pub fn from_request(fields: &SamplingFields) -> Result<Option<StructuredOutputs>, ApiError> {
    let mut found: Vec<(&str, Constraint)> = Vec::new();
    let mut options = JsonOptions::default();
    if let Some(so) = &fields.structured_outputs {
        let Some(object) = so.as_object() else {
            return Err(ApiError::invalid(
                "structured_outputs",
                format!("structured_outputs must be an object, got {so}"),
            ));
        };
        if let Some(unknown) = object.keys().find(|k| !KINDS.contains(&k.as_str()) && !OPTIONS.contains(&k.as_str())) {
            return Err(ApiError::invalid(
                "structured_outputs",
                format!("structured_outputs.{unknown} is not supported; the fields are {KINDS:?} and {OPTIONS:?}"),
            ));
        }
        let given = |k: &str| object.get(k).filter(|v| !v.is_null());
        let before = found.len();
        if let Some(v) = given("json") {
            found.push(("structured_outputs.json", Constraint::Json(schema("structured_outputs.json", v)?)));
        }
        if let Some(v) = given("regex") {
            found.push(("structured_outputs.regex", Constraint::Regex(string("structured_outputs.regex", v)?)));
        }
        if let Some(v) = given("choice") {
            found.push(("structured_outputs.choice", Constraint::Choice(choices("structured_outputs.choice", v)?)));
        }
        if let Some(v) = given("grammar") {
            found.push(("structured_outputs.grammar", Constraint::Grammar(string("structured_outputs.grammar", v)?)));
        }
        if let Some(v) = given("json_object") {
            // vLLM counts the field as given whatever its value.
            flag("structured_outputs.json_object", v)?;
            found.push(("structured_outputs.json_object", Constraint::JsonObject));
        }
        if let Some(v) = given("structural_tag") {
            let tag = match v {
                Value::String(text) => serde_json::from_str(text).map_err(|e| {
                    ApiError::invalid("structured_outputs", format!("structured_outputs.structural_tag: {e}"))
                })?,
                v => v.clone(),
            };
            found.push(("structured_outputs.structural_tag", Constraint::StructuralTag(tag)));
        }
        if found.len() == before {
            return Err(ApiError::invalid(
                "structured_outputs",
                "You must use one kind of structured outputs constraint but none are specified.",
            ));
        }
        if let Some(v) = given("disable_any_whitespace") {
            options.disable_any_whitespace = flag("structured_outputs.disable_any_whitespace", v)?;
        }
        if let Some(v) = given("disable_additional_properties") {
            options.disable_additional_properties = flag("structured_outputs.disable_additional_properties", v)?;
        }
        if let Some(v) = given("whitespace_pattern") {
            options.whitespace_pattern = Some(string("structured_outputs.whitespace_pattern", v)?);
        }
    }
    if let Some(v) = &fields.guided_json {
        found.push(("guided_json", Constraint::Json(schema("guided_json", v)?)));
    }
    if let Some(v) = &fields.guided_regex {
        found.push(("guided_regex", Constraint::Regex(string("guided_regex", v)?)));
    }
    if let Some(v) = &fields.guided_choice {
        found.push(("guided_choice", Constraint::Choice(choices("guided_choice", v)?)));
    }
    if let Some(v) = &fields.guided_grammar {
        found.push(("guided_grammar", Constraint::Grammar(string("guided_grammar", v)?)));
    }
    if let Some(v) = &fields.guided_whitespace_pattern {
        options.whitespace_pattern = Some(string("guided_whitespace_pattern", v)?);
    }
    if let Some(c) = fields.response_format.as_ref().map(response_format).transpose()?.flatten() {
        found.push(("response_format", c));
    }
    match found.len() {
        0 => Ok(None),
        1 => {
            let (_, constraint) = found.remove(0);
            Ok(Some(StructuredOutputs { constraint, options }))
        }
        _ => {
            let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
            Err(ApiError::invalid(
                names[1],
                format!(
                    "You can only use one kind of structured outputs constraint but multiple are specified: {}",
                    names.join(", ")
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(v: Value) -> SamplingFields {
        serde_json::from_value(v).unwrap()
    }

    fn constraint(v: Value) -> Option<Constraint> {
        from_request(&fields(v)).unwrap().map(|s| s.constraint)
    }

    fn error(v: Value) -> String {
        from_request(&fields(v)).map(|_| ()).unwrap_err().to_json()
    }

    #[test]
    fn every_spelling_maps_to_its_constraint() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(constraint(json!({})), None);
        assert_eq!(constraint(json!({"response_format": {"type": "text"}})), None);
        assert_eq!(constraint(json!({"response_format": {"type": "json_object"}})), Some(Constraint::JsonObject));
        assert_eq!(
            constraint(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}})
            ),
            Some(Constraint::Json(schema.clone()))
        );
        assert_eq!(
            constraint(json!({"structured_outputs": {"json": schema.to_string()}})),
            Some(Constraint::Json(schema.clone()))
        );
        assert_eq!(constraint(json!({"guided_json": schema})), Some(Constraint::Json(schema.clone())));
        assert_eq!(constraint(json!({"structured_outputs": {"regex": "a+"}})), Some(Constraint::Regex("a+".into())));
        assert_eq!(constraint(json!({"guided_regex": "a+"})), Some(Constraint::Regex("a+".into())));
        assert_eq!(
            constraint(json!({"guided_choice": ["x", "y"]})),
            Some(Constraint::Choice(vec!["x".into(), "y".into()]))
        );
        assert_eq!(
            constraint(json!({"structured_outputs": {"grammar": "start: \"a\""}})),
            Some(Constraint::Grammar("start: \"a\"".into()))
        );
        assert_eq!(constraint(json!({"structured_outputs": {"json_object": true}})), Some(Constraint::JsonObject));
        let tag = json!({"type": "structural_tag", "structures": [], "triggers": []});
        assert_eq!(constraint(json!({"response_format": tag})), Some(Constraint::StructuralTag(tag.clone())));
    }

    #[test]
    fn json_options_come_from_the_request() {
        let so = from_request(&fields(json!({
            "structured_outputs": {"json_object": true, "disable_any_whitespace": true, "whitespace_pattern": " ?"}
        })))
        .unwrap()
        .unwrap();
        assert!(so.options.disable_any_whitespace);
        assert_eq!(so.options.whitespace_pattern.as_deref(), Some(" ?"));
    }

    #[test]
    fn conflicting_missing_or_malformed_constraints_are_400s_naming_the_field() {
        let e = error(json!({"guided_regex": "a", "response_format": {"type": "json_object"}}));
        assert!(e.contains("multiple are specified") && e.contains("guided_regex"), "{e}");
        assert!(error(json!({"structured_outputs": {"disable_any_whitespace": true}})).contains("none are specified"));
        assert!(error(json!({"structured_outputs": {"regexp": "a"}})).contains("structured_outputs.regexp"));
        assert!(error(json!({"guided_choice": []})).contains("non-empty list"));
        assert!(error(json!({"guided_json": "{not json"})).contains("not a valid JSON schema"));
        assert!(error(json!({"response_format": {"type": "json_schema"}})).contains("json_schema.schema"));
        assert!(error(json!({"response_format": {"type": "yaml"}})).contains("yaml"));
    }
}
