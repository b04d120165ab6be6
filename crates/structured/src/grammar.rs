//! Request constraints -> llguidance grammars, as vLLM's guidance backend serializes them
//! (`serialize_guidance_grammar`): JSON schemas through llguidance's schema compiler, a choice as
//! a Lark alternation of string literals, a regex as one lexeme, grammars in Lark (GBNF
//! converted first), and a structural tag as free text with triggered, schema-shaped segments.

use llguidance::api::TopLevelGrammar;
use llguidance::JsonCompileOptions;
use serde_json::{json, Value};

use crate::StructuredError;

/// What the output must match: exactly one of vLLM's `StructuredOutputsParams` kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON schema.
    Json(Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression (Rust `regex` syntax, as llguidance reads it) for the whole output.
    Regex(String),
    /// One of these strings, exactly.
    Choice(Vec<String>),
    /// A Lark grammar (llguidance's dialect) or a llama.cpp GBNF grammar.
    Grammar(String),
    /// vLLM's structural tag: `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`.
    StructuralTag(Value),
}

/// Options of the JSON schema compiler: a server's defaults (`--structured-outputs-config`),
/// which a request may tighten.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonOptions {
    /// Emit JSON without whitespace between tokens (vLLM's `disable_any_whitespace`).
    pub disable_any_whitespace: bool,
    /// Objects with `properties` and no `additionalProperties` get `additionalProperties: false`.
    pub disable_additional_properties: bool,
    /// A regex for the whitespace allowed between JSON tokens.
    pub whitespace_pattern: Option<String>,
}

impl JsonOptions {
    /// These options with a request's own on top (a request can only tighten them).
    pub fn with(&self, request: &JsonOptions) -> JsonOptions {
        JsonOptions {
            disable_any_whitespace: self.disable_any_whitespace || request.disable_any_whitespace,
            disable_additional_properties: self.disable_additional_properties || request.disable_additional_properties,
            whitespace_pattern: request.whitespace_pattern.clone().or_else(|| self.whitespace_pattern.clone()),
        }
    }

    fn schema(&self, schema: &Value) -> Result<Value, StructuredError> {
        refuse_unboundable_numbers(schema)?;
        let mut schema = schema.clone();
        if self.disable_additional_properties {
            close_objects(&mut schema);
        }
        if self.disable_any_whitespace || self.whitespace_pattern.is_some() {
            let Some(object) = schema.as_object_mut() else {
                return Err(StructuredError::Invalid(format!("a JSON schema must be an object, got {schema}")));
            };
            let options = JsonCompileOptions {
                whitespace_flexible: !self.disable_any_whitespace,
                whitespace_pattern: self.whitespace_pattern.clone(),
                ..Default::default()
            };
            let options = serde_json::to_value(&options).map_err(|e| StructuredError::Invalid(e.to_string()))?;
            object.insert("x-guidance".into(), options);
        }
        Ok(schema)
    }
}

/// llguidance (1.9.1, `rx_int_range`) turns an integer's bounds into `i64`s and negates a
/// negative one while it builds the range's regex: a bound at or below -2^63 saturates to
/// `i64::MIN`, whose negation is itself, and the recursion never ends — a stack overflow that
/// aborts the whole server. Numbers there are refused before llguidance sees them: anywhere in a
/// schema (bounds, `const` and `enum` values alike), and in a grammar that embeds `%json`.
const LOWEST_BOUNDABLE: f64 = -9_223_372_036_854_775_808.0;

fn unboundable(n: f64) -> Result<(), StructuredError> {
    if n <= LOWEST_BOUNDABLE {
        return Err(StructuredError::Invalid(format!(
            "the number {n} in the JSON schema is at or below -2^63, beyond the integers a constraint can bound"
        )));
    }
    Ok(())
}

fn refuse_unboundable_numbers(schema: &Value) -> Result<(), StructuredError> {
    let mut pending = vec![schema];
    while let Some(v) = pending.pop() {
        match v {
            Value::Number(n) => unboundable(n.as_f64().unwrap_or(0.0))?,
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => pending.extend(map.values()),
            _ => {}
        }
    }
    Ok(())
}

/// The numbers written with a minus sign in a Lark grammar's text (its `%json` schemas among them).
fn refuse_unboundable_literals(lark: &str) -> Result<(), StructuredError> {
    if !lark.contains("%json") {
        return Ok(());
    }
    let bytes = lark.as_bytes();
    let digits = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    for (minus, _) in lark.match_indices('-') {
        let start = minus + 1;
        let mut end = digits(start);
        if end == start {
            continue;
        }
        if bytes.get(end) == Some(&b'.') {
            end = digits(end + 1);
        }
        if matches!(bytes.get(end), Some(b'e' | b'E')) {
            let sign = end + 1 + usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
            let exponent_end = digits(sign);
            if exponent_end > sign {
                end = exponent_end;
            }
        }
        if let Ok(n) = lark[minus..end].parse::<f64>() {
            unboundable(n)?;
        }
    }
    Ok(())
}

/// The keywords whose value maps names to subschemas, and those whose value is a subschema or a
/// list of them (vLLM's `_walk_json_for_additional_properties`).
const SCHEMA_MAPS: [&str; 6] =
    ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"];
const SUBSCHEMAS: [&str; 16] = [
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "additionalItems",
    "unevaluatedItems",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
    "items",
    "prefixItems",
    "allOf",
    "anyOf",
    "oneOf",
];

fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            for key in SCHEMA_MAPS {
                if let Some(Value::Object(map)) = object.get_mut(key) {
                    map.values_mut().filter(|v| v.is_object()).for_each(close_objects);
                }
            }
            for key in SUBSCHEMAS {
                if let Some(v @ (Value::Object(_) | Value::Array(_))) = object.get_mut(key) {
                    close_objects(v);
                }
            }
            let has_properties =
                ["properties", "patternProperties"].iter().any(|k| object.get(*k).is_some_and(Value::is_object));
            if has_properties && !object.contains_key("additionalProperties") {
                object.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
        Value::Array(items) => items.iter_mut().filter(|v| v.is_object()).for_each(close_objects),
        _ => {}
    }
}

/// A Lark string literal (Lark's escapes are JSON's).
fn lark_literal(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

pub(crate) fn top_level(constraint: &Constraint, options: &JsonOptions) -> Result<TopLevelGrammar, StructuredError> {
    Ok(match constraint {
        Constraint::Json(schema) => TopLevelGrammar::from_json_schema(options.schema(schema)?),
        Constraint::JsonObject => TopLevelGrammar::from_json_schema(options.schema(&json!({"type": "object"}))?),
        Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Constraint::Choice(choices) => {
            if choices.is_empty() {
                return Err(StructuredError::Invalid("choice must list at least one string".into()));
            }
            let alternatives: Vec<String> = choices.iter().map(|c| lark_literal(c)).collect();
            TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
        }
        Constraint::Grammar(text) => {
            let lark = crate::gbnf::any_to_lark(text).map_err(StructuredError::Invalid)?;
            refuse_unboundable_literals(&lark)?;
            TopLevelGrammar::from_lark(lark)
        }
        Constraint::StructuralTag(tag) => structural_tag(tag, options)?,
    })
}

/// vLLM's guidance backend's structural tag (`llguidance.StructTag.to_grammar`): any text, in
/// which each trigger starts a segment `begin <schema-shaped JSON> end`. A trigger shaped
/// `<...>` is a special token; any other is text that ends the free text lazily.
fn structural_tag(tag: &Value, options: &JsonOptions) -> Result<TopLevelGrammar, StructuredError> {
    let invalid = |m: String| StructuredError::Invalid(format!("structural_tag: {m}"));
    let strings =
        |v: &Value| -> Option<Vec<String>> { v.as_array()?.iter().map(|t| t.as_str().map(str::to_owned)).collect() };
    let triggers =
        tag.get("triggers").and_then(strings).ok_or_else(|| invalid("`triggers` must be a list of strings".into()))?;
    let structures = tag
        .get("structures")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("`structures` must be a list of {begin, schema, end} objects".into()))?;
    if structures.is_empty() {
        return Err(invalid("No structural tags found in the grammar spec.".into()));
    }
    let mut lark = String::from("%llguidance {}\n");
    let options_list: Vec<String> = (0..structures.len()).map(|i| format!("tag_{i}")).collect();
    lark += &format!("start: ({})* tag_end\ntag_end: TAG_TEXT\nTAG_TEXT: /(.|\\n)*/\n", options_list.join(" | "));
    for (i, s) in structures.iter().enumerate() {
        let field = |name: &str| {
            s.get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("structures[{i}].{name} must be a string")))
        };
        let (begin, end) = (field("begin")?, field("end")?);
        let schema = s.get("schema").ok_or_else(|| invalid(format!("structures[{i}].schema is missing")))?;
        let trigger = triggers
            .iter()
            .find(|t| !t.is_empty() && begin.starts_with(t.as_str()))
            .ok_or_else(|| invalid(format!("Trigger {begin} not found in triggers {triggers:?}")))?;
        let schema = serde_json::to_string(&options.schema(schema)?).map_err(|e| invalid(e.to_string()))?;
        let optional = |s: &str| if s.is_empty() { String::new() } else { lark_literal(s) };
        let body = format!("{} %json {schema} {}", optional(&begin[trigger.len()..]), optional(end));
        if trigger.starts_with('<') && trigger.ends_with('>') {
            lark += &format!("tag_{i}: TAG_TEXT {trigger} {body}\n");
        } else {
            lark += &format!("tag_{i}_trig[lazy]: TAG_TEXT {}\ntag_{i}: tag_{i}_trig {body}\n", lark_literal(trigger));
        }
    }
    Ok(TopLevelGrammar::from_lark(lark))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn additional_properties_close_nested_objects_as_vllm_does() {
        let mut schema = json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}},
            "$defs": {"open": {"type": "object", "properties": {}, "additionalProperties": true}},
            "anyOf": [{"properties": {"c": {}}}]
        });
        close_objects(&mut schema);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
        assert_eq!(schema["$defs"]["open"]["additionalProperties"], true);
        assert_eq!(schema["anyOf"][0]["additionalProperties"], false);
    }

    #[test]
    fn options_ride_in_the_schema_only_when_set() {
        let schema = json!({"type": "object"});
        assert_eq!(JsonOptions::default().schema(&schema).unwrap(), schema);
        let tight = JsonOptions { disable_any_whitespace: true, ..Default::default() }.schema(&schema).unwrap();
        assert_eq!(tight["x-guidance"]["whitespace_flexible"], false);
        let err = JsonOptions { disable_any_whitespace: true, ..Default::default() }.schema(&json!(true));
        assert!(matches!(err, Err(StructuredError::Invalid(_))));
    }

    #[test]
    fn request_options_only_tighten_server_defaults() {
        let server = JsonOptions { disable_any_whitespace: true, ..Default::default() };
        assert!(server.with(&JsonOptions::default()).disable_any_whitespace);
        let request = JsonOptions { disable_additional_properties: true, ..Default::default() };
        let both = server.with(&request);
        assert!(both.disable_any_whitespace && both.disable_additional_properties);
    }

    #[test]
    fn structural_tags_need_a_trigger_for_each_begin() {
        let tag = json!({
            "structures": [{"begin": "<function=f>", "schema": {"type": "object"}, "end": "</function>"}],
            "triggers": ["<tool"]
        });
        let err = top_level(&Constraint::StructuralTag(tag), &JsonOptions::default()).unwrap_err();
        assert!(err.to_string().contains("Trigger <function=f> not found"), "{err}");
        let empty = json!({"structures": [], "triggers": ["<f"]});
        assert!(top_level(&Constraint::StructuralTag(empty), &JsonOptions::default()).is_err());
        assert!(top_level(&Constraint::Choice(vec![]), &JsonOptions::default()).is_err());
    }
}
