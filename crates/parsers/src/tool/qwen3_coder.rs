//! `qwen3_coder`: Qwen3-Coder's XML calls,
//! `<tool_call><function=NAME><parameter=P>value</parameter>...</function></tool_call>`.
//! Each value is text, converted by the type the request's schema gives the parameter
//! (integers, numbers, booleans, objects and arrays parsed; strings kept), and the arguments
//! are `json.dumps` of the resulting object. The text before the first call is content unless
//! it is only whitespace. As vLLM's `Qwen3CoderToolParser`, which also accepts calls without
//! the `<tool_call>` wrapper and parameters without their closing tag.

use super::python::{integral_digits, literal_eval, python_float, python_int};
use super::*;

const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";
const FUNCTION_START: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAM_START: &str = "<parameter=";
const PARAM_END: &str = "</parameter>";

/// The JSON value of parameter `name`'s text, as the schema of `function` types it.
fn convert(value: &str, name: &str, function: Option<&FunctionSpec>) -> Json {
    let text = || Json::Str(value.to_owned());
    let Some(schema) = function.and_then(|f| properties(&f.parameters)).and_then(|p| p.get(name)) else {
        return text();
    };
    let (kind, nullable) = schema_type(schema);
    let lower = value.to_lowercase();
    let is_null = lower == "null" || lower == "none";
    if nullable && is_null {
        return Json::Null;
    }
    if ["string", "str", "text", "varchar", "char", "enum"].contains(&kind.as_str()) {
        return text();
    }
    if is_null {
        return Json::Null;
    }
    if ["int", "uint", "long", "short", "unsigned"].iter().any(|p| kind.starts_with(p)) {
        return python_int(value).map(Json::Int).unwrap_or_else(text);
    }
    if kind.starts_with("num") || kind.starts_with("float") {
        return match python_float(value) {
            Some(v) if v.is_finite() && v.fract() == 0.0 => Json::Int(integral_digits(v)),
            Some(v) if v.is_finite() => Json::Float(v),
            _ => text(),
        };
    }
    if ["boolean", "bool", "binary"].contains(&kind.as_str()) {
        // vLLM reads anything but "true" as false.
        return Json::Bool(lower == "true");
    }
    let container =
        ["object", "array", "arr"].contains(&kind.as_str()) || kind.starts_with("dict") || kind.starts_with("list");
    // A template that wrote `json.dumps(str(value))` leaves a Python repr inside a string.
    let unwrap = |parsed: Json| match &parsed {
        Json::Str(inner) if container => literal_eval(inner).unwrap_or(parsed),
        _ => parsed,
    };
    if container {
        if let Some(parsed) = Json::parse(value) {
            return unwrap(parsed);
        }
    }
    literal_eval(value).map(unwrap).unwrap_or_else(text)
}

/// A function's parameter schemas: `properties`, or the parameters object itself.
fn properties(parameters: &serde_json::Value) -> Option<&serde_json::Map<String, serde_json::Value>> {
    let object = parameters.as_object()?;
    match object.get("properties") {
        Some(properties) => properties.as_object(),
        None => Some(object),
    }
}

/// A parameter schema's type, lowercased, and whether it admits null. Unions (`anyOf`, a list
/// of types) give their first non-null type.
fn schema_type(schema: &serde_json::Value) -> (String, bool) {
    let name = |t: &serde_json::Value| match t {
        serde_json::Value::String(s) => s.trim().to_lowercase(),
        other => other.to_string().to_lowercase(),
    };
    let union = |types: Vec<String>| {
        let nullable = types.iter().any(|t| t == "null");
        let first = types.into_iter().find(|t| t != "null").unwrap_or_else(|| "string".to_owned());
        (first, nullable)
    };
    match (schema.get("type"), schema.get("anyOf")) {
        (Some(serde_json::Value::Array(types)), _) => union(types.iter().map(name).collect()),
        (Some(t), _) => {
            let t = name(t);
            let nullable = t == "null";
            (t, nullable)
        }
        (None, Some(serde_json::Value::Array(options))) => {
            union(options.iter().filter_map(|o| o.get("type")).map(name).collect())
        }
        _ => ("string".to_owned(), false),
    }
}

/// A parameter's text without the one newline after its opening tag and before its closing one.
fn trim_value(value: &str) -> &str {
    let value = value.strip_prefix('\n').unwrap_or(value);
    value.strip_suffix('\n').unwrap_or(value)
}

/// The `, "name": value` piece a parameter adds to the arguments (`{` instead of `, ` first).
fn member(first: bool, name: &str, value: &Json) -> String {
    let mut piece = String::from(if first { "{" } else { ", " });
    json::push_string(&mut piece, name);
    piece.push_str(": ");
    value.write(&mut piece);
    piece
}

/// One function's text (after `<function=`, up to its end): its call, or `None` when a name or
/// parameter lacks its `>`, which vLLM cannot read either.
fn function_call(text: &str, tools: &[FunctionSpec]) -> Option<ToolCall> {
    let (name, mut body) = text.split_once('>')?;
    let function = find_function(tools, name);
    let mut members: Vec<(String, Json)> = Vec::new();
    while let Some(at) = body.find(PARAM_START) {
        let rest = &body[at + PARAM_START.len()..];
        // A value ends at its closing tag, or where the next parameter or the function starts.
        let (end, next) = match find_first(rest, 0, &[PARAM_END, PARAM_START, FUNCTION_END]) {
            Some((end, PARAM_END)) => (end, end + PARAM_END.len()),
            Some((end, _)) => (end, end),
            None => (rest.len(), rest.len()),
        };
        let (param, value) = rest[..end].split_once('>')?;
        json::insert_member(&mut members, param.to_owned(), convert(trim_value(value), param, function));
        body = &rest[next..];
    }
    Some(ToolCall { id: random_tool_call_id(), name: name.to_owned(), arguments: Json::Object(members).dumps() })
}

/// Each `open ... close` region of `text`; the last may run to the end unclosed.
fn regions<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut pos = 0;
    while let Some((at, _)) = find_first(text, pos, &[open]) {
        let start = at + open.len();
        match text[start..].find(close) {
            Some(len) => {
                found.push(&text[start..start + len]);
                pos = start + len + close.len();
            }
            None => {
                found.push(&text[start..]);
                break;
            }
        }
    }
    found
}

#[derive(Default)]
pub(super) struct Qwen3Coder {
    pos: usize,
    phase: Phase,
    /// Whether content has been sent (whitespace before a call is dropped unless it follows
    /// other content).
    sent_content: bool,
    /// The call in progress: its function's name and how many parameters were sent.
    function: String,
    params: usize,
}

#[derive(Default)]
enum Phase {
    #[default]
    Content,
    /// Looking for the next `<function=`.
    Seek,
    /// The function's name, up to `>`.
    Name,
    /// Inside a function, between parameters.
    Body,
    /// A parameter's name, up to `>`.
    ParamName,
    /// A parameter's value, from `start`.
    Value { name: String, start: usize },
}

impl Format for Qwen3Coder {
    fn extract(&self, output: &str, tools: &[FunctionSpec]) -> ExtractedToolCalls {
        if !output.contains(FUNCTION_START) {
            return all_content(output);
        }
        let mut wrapped = regions(output, CALL_START, CALL_END);
        if wrapped.is_empty() {
            wrapped.push(output);
        }
        let functions = wrapped.iter().flat_map(|region| regions(region, FUNCTION_START, FUNCTION_END));
        let Some(calls) = functions.map(|function| function_call(function, tools)).collect::<Option<Vec<_>>>() else {
            return all_content(output);
        };
        if calls.is_empty() {
            return all_content(output);
        }
        let content_end = output.find(CALL_START).or_else(|| output.find(FUNCTION_START)).unwrap_or(0);
        let content = &output[..content_end];
        let content = if content.trim().is_empty() { None } else { Some(content.to_owned()) };
        ExtractedToolCalls { tool_calls: calls, content }
    }

    fn advance(&mut self, text: &str, tools: &[FunctionSpec], events: &mut Vec<Event>) {
        loop {
            match std::mem::take(&mut self.phase) {
                Phase::Content => {
                    let (end, found) = content_end(text, self.pos, &[CALL_START, FUNCTION_START]);
                    let piece = &text[self.pos..end];
                    // Whitespace alone before a call is not content; it waits to see what follows.
                    if self.sent_content || !piece.trim().is_empty() {
                        content_event(events, piece);
                        self.sent_content |= !piece.is_empty();
                        self.pos = end;
                    }
                    match found {
                        Some(at) => {
                            self.pos = at;
                            self.phase = Phase::Seek;
                        }
                        None => return,
                    }
                }
                Phase::Seek => match find_first(text, self.pos, &[FUNCTION_START]) {
                    Some((at, _)) => {
                        self.pos = at + FUNCTION_START.len();
                        self.phase = Phase::Name;
                    }
                    None => {
                        self.pos = (text.len() - partial_marker_len(text, FUNCTION_START)).max(self.pos);
                        self.phase = Phase::Seek;
                        return;
                    }
                },
                Phase::Name => match text[self.pos..].find('>') {
                    Some(len) => {
                        self.function = text[self.pos..self.pos + len].to_owned();
                        events.push(Event::Call { name: self.function.clone(), id: None });
                        self.pos += len + 1;
                        self.params = 0;
                        self.phase = Phase::Body;
                    }
                    None => {
                        self.phase = Phase::Name;
                        return;
                    }
                },
                Phase::Body => match find_first(text, self.pos, &[PARAM_START, FUNCTION_END, CALL_END]) {
                    Some((at, PARAM_START)) => {
                        self.pos = at + PARAM_START.len();
                        self.phase = Phase::ParamName;
                    }
                    Some((at, end)) => {
                        events.push(Event::Args(if self.params == 0 { "{}" } else { "}" }.to_owned()));
                        self.pos = at + end.len();
                        self.phase = Phase::Seek;
                    }
                    None => {
                        self.phase = Phase::Body;
                        return;
                    }
                },
                Phase::ParamName => match text[self.pos..].find('>') {
                    Some(len) => {
                        let name = text[self.pos..self.pos + len].to_owned();
                        self.pos += len + 1;
                        self.phase = Phase::Value { name, start: self.pos };
                    }
                    None => {
                        self.phase = Phase::ParamName;
                        return;
                    }
                },
                Phase::Value { name, start } => {
                    match find_first(text, self.pos, &[PARAM_END, PARAM_START, FUNCTION_END, CALL_END]) {
                        Some((at, marker)) => {
                            let function = find_function(tools, &self.function);
                            let value = convert(trim_value(&text[start..at]), &name, function);
                            events.push(Event::Args(member(self.params == 0, &name, &value)));
                            self.params += 1;
                            self.pos = if marker == PARAM_END { at + PARAM_END.len() } else { at };
                            self.phase = Phase::Body;
                        }
                        None => {
                            // Only a marker's start can straddle the end: look from there next time.
                            let longest = PARAM_END.len().max(FUNCTION_END.len());
                            let back = text.len().saturating_sub(longest).max(start);
                            self.pos = (back..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
                            self.phase = Phase::Value { name, start };
                            return;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Cases from vLLM's tests/tool_parsers/test_qwen3coder_tool_parser.py.

    use super::super::test_support::*;
    use super::super::*;
    use serde_json::json;

    fn sample_tools() -> Vec<FunctionSpec> {
        tools(&[
            (
                "get_current_weather",
                json!({"type": "object", "properties": {
                    "city": {"type": "string", "description": "The city name"},
                    "state": {"type": "string", "description": "The state code"},
                    "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]}},
                    "required": ["city", "state"]}),
            ),
            (
                "calculate_area",
                json!({"type": "object", "properties": {
                    "shape": {"type": "string"}, "dimensions": {"type": "object"}, "precision": {"type": "integer"}}}),
            ),
        ])
    }

    const DALLAS: &str = "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>";

    fn check(output: &str, tools: &[FunctionSpec]) -> ExtractedToolCalls {
        assert_streams_match("qwen3_coder", output, tools, true)
    }

    #[test]
    fn no_tools() {
        let text = "This is a test response without any tool calls";
        assert_eq!(check(text, &sample_tools()).content.as_deref(), Some(text));
    }

    #[test]
    fn single_and_parallel_calls() {
        let tools = sample_tools();
        let whole = check(DALLAS, &tools);
        assert_eq!(whole.content, None);
        assert_eq!(whole.tool_calls[0].name, "get_current_weather");
        assert_eq!(whole.tool_calls[0].arguments, r#"{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}"#);

        let whole = check(&format!("Sure! Let me check the weather for you.{DALLAS}"), &tools);
        assert_eq!(whole.content.as_deref(), Some("Sure! Let me check the weather for you."));

        let orlando = DALLAS.replace("Dallas", "Orlando").replace("TX", "FL").replace("fahrenheit", "celsius");
        let whole = check(&format!("{DALLAS}\n{orlando}"), &tools);
        assert_eq!(whole.tool_calls.len(), 2);
        assert_eq!(args(&whole.tool_calls[1]), json!({"city": "Orlando", "state": "FL", "unit": "celsius"}));
    }

    #[test]
    fn typed_parameters() {
        let tools = sample_tools();
        let whole = check(
            "<tool_call>\n<function=calculate_area>\n<parameter=shape>\nrectangle\n</parameter>\n<parameter=dimensions>\n{\"width\": 10, \n \"height\": 20}\n</parameter>\n<parameter=precision>\n2\n</parameter>\n</function>\n</tool_call>",
            &tools,
        );
        assert_eq!(
            args(&whole.tool_calls[0]),
            json!({"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2})
        );
        let whole = check(
            "Let me calculate that area for you.<tool_call>\n<function=calculate_area>\n<parameter=shape>\ncircle\n</parameter>\n<parameter=dimensions>\n{\"radius\": 15.5}\n</parameter>\n<parameter=precision>\n3\n</parameter>\n</function>\n</tool_call>",
            &tools,
        );
        assert_eq!(whole.content.as_deref(), Some("Let me calculate that area for you."));
        assert_eq!(
            whole.tool_calls[0].arguments,
            r#"{"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3}"#
        );
    }

    #[test]
    fn type_conversion() {
        let tools = tools(&[(
            "test_types",
            json!({"type": "object", "properties": {
                "int_param": {"type": "integer"}, "float_param": {"type": "float"},
                "bool_param": {"type": "boolean"}, "str_param": {"type": "string"},
                "obj_param": {"type": "object"}, "num_param": {"type": "number"},
                "null_param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "list_param": {"type": ["array", "null"]}}}),
        )]);
        let whole = check(
            "<tool_call>\n<function=test_types>\n<parameter=int_param>\n42\n</parameter>\n<parameter=float_param>\n3.14\n</parameter>\n<parameter=bool_param>\ntrue\n</parameter>\n<parameter=str_param>\nhello world\n</parameter>\n<parameter=obj_param>\n{\"key\": \"value\"}\n</parameter>\n<parameter=num_param>\n5.0\n</parameter>\n<parameter=null_param>\nNone\n</parameter>\n<parameter=list_param>\n[1, 'two']\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>",
            &tools,
        );
        assert_eq!(
            whole.tool_calls[0].arguments,
            concat!(
                r#"{"int_param": 42, "float_param": 3.14, "bool_param": true, "str_param": "hello world", "#,
                r#""obj_param": {"key": "value"}, "num_param": 5, "null_param": null, "list_param": [1, "two"], "#,
                r#""extra": "7"}"#
            )
        );
        // A Python repr where JSON was expected.
        let whole = check(
            "<tool_call>\n<function=test_types>\n<parameter=obj_param>\n{'key': 'value'}\n</parameter>\n</function>\n</tool_call>",
            &tools,
        );
        assert_eq!(args(&whole.tool_calls[0]), json!({"obj_param": {"key": "value"}}));
        // Values that do not fit their type stay text; booleans other than true are false.
        let whole = check(
            "<function=test_types>\n<parameter=int_param>\nmany\n</parameter>\n<parameter=bool_param>\nyes\n</parameter>\n<parameter=str_param>\nnull\n</parameter>\n</function>",
            &tools,
        );
        assert_eq!(args(&whole.tool_calls[0]), json!({"int_param": "many", "bool_param": false, "str_param": "null"}));
    }

    #[test]
    fn missing_tags() {
        let tools = sample_tools();
        // No <tool_call> wrapper.
        let whole = check(
            "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n</function>",
            &tools,
        );
        assert_eq!(args(&whole.tool_calls[0]), json!({"city": "Dallas", "state": "TX"}));
        let whole = check(
            "I'll check the weather for you.\n\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
            &tools,
        );
        assert_eq!(whole.content.as_deref(), Some("I'll check the weather for you.\n\n"));
        assert_eq!(args(&whole.tool_calls[0])["unit"], "fahrenheit");
        // A parameter without its closing tag ends where the next one starts.
        let whole = check(
            "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
            &tools,
        );
        assert_eq!(whole.content.as_deref(), Some("Let me check the weather for you:\n"));
        assert_eq!(args(&whole.tool_calls[0]), json!({"city": "Dallas", "state": "TX", "unit": "fahrenheit"}));
    }

    #[test]
    fn whitespace_before_a_call_is_not_content() {
        let whole = check(
            "\n\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n</function>\n</tool_call>",
            &sample_tools(),
        );
        assert_eq!(whole.content, None);
        assert_eq!(args(&whole.tool_calls[0]), json!({"city": "Dallas", "state": "TX"}));
    }

    #[test]
    fn streaming_is_incremental() {
        let text = "I'll check the weather.<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n</function>\n</tool_call>";
        let tools = sample_tools();
        let mut parser = parser("qwen3_coder").unwrap();
        let mut previous = String::new();
        let mut deltas = Vec::new();
        for piece in token_chunks(text) {
            deltas.extend(parser.extract_streaming(&previous, &piece, &tools));
            previous.push_str(&piece);
        }
        assert_eq!(deltas[0].content.as_deref(), Some("I"));
        let header = deltas.iter().flat_map(|d| &d.tool_calls).find(|c| c.id.is_some()).unwrap();
        assert_eq!(header.name.as_deref(), Some("get_current_weather"));
        assert_eq!(header.arguments.as_deref(), Some(""));
        let pieces: Vec<&str> =
            deltas.iter().flat_map(|d| &d.tool_calls).filter_map(|c| c.arguments.as_deref()).collect();
        assert_eq!(pieces, ["", "{\"city\": \"Dallas\"", ", \"state\": \"TX\"", "}"]);
    }

    #[test]
    fn unterminated_call_is_closed_by_finish() {
        let text = "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX";
        let whole = assert_streams_match("qwen3_coder", text, &sample_tools(), false);
        assert_eq!(whole.tool_calls[0].arguments, r#"{"city": "Dallas", "state": "TX"}"#);
    }

    #[test]
    fn unreadable_calls_are_content() {
        for text in ["<tool_call>\n<function=get_weather", "text <function=f>\n<parameter=city"] {
            let whole = parser("qwen3_coder").unwrap().extract(text, &[]);
            assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) });
        }
    }
}
