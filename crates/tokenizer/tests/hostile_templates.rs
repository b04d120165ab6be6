//! Chat templates from strangers (issue 34). A request may bring its own template
//! (`--trust-request-chat-template`) and a checkpoint's `tokenizer_config.json` is whatever its
//! author wrote. The seeds are the repo's real templates (`fixtures/chat_templates`, the fixture
//! checkpoints' `tokenizer_config.json`); each case mutates one (cuts, splices from another,
//! inserts Jinja fragments that loop, recurse, divide by zero, slice, format or call our
//! functions with odd arguments) and renders it over random messages, tools and kwargs. A case
//! passes when the template is compiled or refused, and rendered or refused, without a panic,
//! within the fuel bound's time and the output bound's size.
//!
//! 256 cases by default; `PROPTEST_CASES=N` runs more (`scripts/fuzz.sh`).

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferrite_tokenizer::{ChatRender, ChatTemplate};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Map, Value};

/// A render under the fuel bound takes well under this on a slow machine; a case beyond it
/// means a loop the fuel does not count.
const RENDER_LIMIT: Duration = Duration::from_secs(60);
/// The output bound of `ChatTemplate` (32 MiB), which a successful render never exceeds.
const MAX_RENDERED_BYTES: usize = 32 << 20;

fn seeds() -> &'static [String] {
    static SEEDS: OnceLock<Vec<String>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut files: Vec<_> =
            std::fs::read_dir(root.join("chat_templates")).unwrap().map(|e| e.unwrap().path()).collect();
        for model in std::fs::read_dir(root.join("models")).unwrap() {
            files.push(model.unwrap().path().join("tokenizer_config.json"));
        }
        files.sort();
        let mut seeds: Vec<String> = files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .filter_map(|text| serde_json::from_str::<Value>(&text).ok()?["chat_template"].as_str().map(str::to_string))
            .collect();
        seeds.sort();
        seeds.dedup();
        assert!(seeds.len() >= 5, "only {} seed templates", seeds.len());
        seeds
    })
}

const FRAGMENTS: &[&str] = &[
    "{% for message in messages %}",
    "{% endfor %}",
    "{% if messages[0]['role'] == 'system' %}",
    "{% else %}",
    "{% endif %}",
    "{{ messages[-1]['content'] }}",
    "{{ messages[99]['content'] }}",
    "{{ message.content[::-1] }}",
    "{{ message['content'][-100000:100000] }}",
    "{{ message.tool_calls[0].function.arguments | tojson }}",
    "{{ tools | tojson(indent=4) }}",
    "{{ tools | tojson(indent=-3) }}",
    "{{ messages | tojson(indent=100000) }}",
    "{{ messages | map(attribute='content') | join('|') }}",
    "{{ messages | selectattr('role', 'equalto', 'tool') | list | length }}",
    "{% set ns = namespace(found=false, n=0) %}",
    "{% set ns.n = ns.n + 1 %}",
    "{{ ns.missing.deeper }}",
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ 7 % 0 }}",
    "{{ 10 ** 10 ** 10 }}",
    "{{ 9223372036854775807 + 1 }}",
    "{{ -9223372036854775808 - 1 }}",
    "{{ 'x' * 100000000 }}",
    "{{ '%s and %d' % (messages, 'a') }}",
    "{{ range(1000000000) | list | length }}",
    "{% for i in range(100000) %}{{ i }}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% macro g() %}{{ caller() }}{% endmacro %}{% call g() %}x{% endcall %}",
    "{{ raise_exception('refused by the template') }}",
    "{{ raise_exception() }}",
    "{{ raise_exception(messages) }}",
    "{{ strftime_now('%Y-%m-%d') }}",
    "{{ strftime_now('%') }}",
    "{{ strftime_now('%Q%-%E%O') }}",
    "{{ strftime_now(42) }}",
    "{{ strftime_now() }}",
    "{{ tojson() }}",
    "{{ none | tojson }}",
    "{{ message.content.split(None, -1) }}",
    "{{ message.content.strip('\\u{1F600}') }}",
    "{{ message.content.startswith(('a', 'b')) }}",
    "{{ message.content | replace('', 'x') }}",
    "{{ message.content.title().upper().lower()[::2] }}",
    "{{ message.items() | list }}",
    "{{ message.get('tool_calls', [])[0] }}",
    "{{ bos_token * 1000000 }}",
    "{{ eos_token ~ bos_token }}",
    "{% include 'chat' %}",
    "{% include '/etc/passwd' %}",
    "{% import 'chat' as self %}",
    "{% extends 'chat' %}",
    "{% block b %}{% endblock %}",
    "{% filter upper %}",
    "{% endfilter %}",
    "{{ (messages | first).role }}",
    "{{ messages | sort(attribute='content') }}",
    "{{ messages | groupby('role') }}",
    "{{ messages | batch(0) }}",
    "{{ messages | slice(0) }}",
    "{{ [1, 2, 3] | sum(start=[]) }}",
    "{{ '\\x00\\uffff' }}",
    "{% raw %}{{ {% endraw %}",
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "'",
    "\"",
];

#[derive(Debug, Clone)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, fragment: usize },
    Splice { at: usize, from_seed: usize, start: usize, len: usize },
    Repeat { at: usize, len: usize, times: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0usize..200).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), 0..FRAGMENTS.len()).prop_map(|(at, fragment)| Mutation::Insert { at, fragment }),
        (any::<usize>(), any::<usize>(), any::<usize>(), 0usize..400)
            .prop_map(|(at, from_seed, start, len)| Mutation::Splice { at, from_seed, start, len }),
        (any::<usize>(), 1usize..80, 2usize..6).prop_map(|(at, len, times)| Mutation::Repeat { at, len, times }),
    ]
}

/// The char boundary at or before `at % (len + 1)`.
fn boundary(s: &str, at: usize) -> usize {
    let mut i = at % (s.len() + 1);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn mutate(mut text: String, mutations: &[Mutation]) -> String {
    let seeds = seeds();
    for m in mutations {
        match *m {
            Mutation::Delete { at, len } => {
                let start = boundary(&text, at);
                let end = boundary(&text, start + len.min(text.len() - start));
                text.replace_range(start..end, "");
            }
            Mutation::Insert { at, fragment } => {
                let at = boundary(&text, at);
                text.insert_str(at, FRAGMENTS[fragment]);
            }
            Mutation::Splice { at, from_seed, start, len } => {
                let donor = &seeds[from_seed % seeds.len()];
                let start = boundary(donor, start);
                let end = boundary(donor, start + len.min(donor.len() - start));
                let at = boundary(&text, at);
                text.insert_str(at, &donor[start..end]);
            }
            Mutation::Repeat { at, len, times } => {
                let start = boundary(&text, at);
                let end = boundary(&text, start + len.min(text.len() - start));
                let piece = text[start..end].repeat(times);
                text.replace_range(start..end, &piece);
            }
        }
    }
    text
}

/// Strings that look like the things templates look for, and things that break naive code.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ,.!?]{0,40}",
        Just(String::new()),
        Just("<|im_start|>assistant\n<think>".to_string()),
        Just("{{ messages }}{% for %}".to_string()),
        Just("\u{0}\u{FEFF}\u{1F600}é\r\n\t".to_string()),
        Just("</tool_call>[TOOL_CALLS]<|python_tag|>".to_string()),
        "\\PC{0,30}",
    ]
}

fn json_value(depth: u32) -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        3 => leaf,
        1 => prop::collection::vec(json_value(depth - 1), 0..4).prop_map(Value::from),
        1 => prop::collection::vec(("[a-z_]{1,10}", json_value(depth - 1)), 0..4)
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
    ]
    .boxed()
}

fn tool_call() -> impl Strategy<Value = Value> {
    ("[a-z_]{1,12}", prop_oneof![json_value(2), text().prop_map(Value::from)])
        .prop_map(|(name, arguments)| json!({"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}))
}

fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        4 => prop::sample::select(vec!["system", "user", "assistant", "tool", "developer"]).prop_map(str::to_string),
        1 => text(),
    ];
    let content = prop_oneof![
        4 => text().prop_map(Value::from),
        1 => prop::collection::vec(text().prop_map(|t| json!({"type": "text", "text": t})), 0..3).prop_map(Value::from),
        1 => json_value(2),
    ];
    let extras = (
        prop::option::of(prop::collection::vec(tool_call(), 0..3)),
        prop::option::of("[a-z0-9_]{0,10}"),
        prop::option::of(text()),
    );
    (role, content, extras).prop_map(|(role, content, (tool_calls, tool_call_id, reasoning))| {
        let mut m = json!({"role": role, "content": content});
        if let Some(calls) = tool_calls {
            m["tool_calls"] = Value::from(calls);
        }
        if let Some(id) = tool_call_id {
            m["tool_call_id"] = id.into();
        }
        if let Some(r) = reasoning {
            m["reasoning_content"] = r.into();
        }
        m
    })
}

fn tools() -> impl Strategy<Value = Option<Vec<Value>>> {
    let tool = prop_oneof![
        3 => ("[a-z_]{1,12}", json_value(3)).prop_map(|(name, parameters)| {
            json!({"type": "function", "function": {"name": name, "description": "d", "parameters": parameters}})
        }),
        1 => json_value(2),
    ];
    prop::option::of(prop::collection::vec(tool, 0..3))
}

fn kwargs() -> impl Strategy<Value = Option<Map<String, Value>>> {
    let key = prop_oneof![
        Just("enable_thinking".to_string()),
        Just("date_string".to_string()),
        Just("messages".to_string()),
        Just("tools".to_string()),
        "[a-z_]{1,10}",
    ];
    prop::option::of(prop::collection::vec((key, json_value(1)), 0..3).prop_map(|kv| kv.into_iter().collect()))
}

proptest! {
    #[test]
    fn mutated_templates_render_or_fail_within_bounds(
        seed in any::<usize>(),
        mutations in prop::collection::vec(mutation(), 0..6),
        messages in prop::collection::vec(message(), 0..6),
        tools in tools(),
        kwargs in kwargs(),
        flags in (any::<bool>(), any::<bool>()),
    ) {
        let source = mutate(seeds()[seed % seeds().len()].clone(), &mutations);
        let Ok(template) = ChatTemplate::new(source, "<s>".into(), "</s>".into()) else { return Ok(()) };
        let render = ChatRender {
            messages: &messages,
            tools: tools.as_deref(),
            add_generation_prompt: flags.0,
            continue_final_message: flags.1,
            kwargs: kwargs.as_ref(),
        };
        let start = Instant::now();
        let rendered = template.render_chat(&render);
        prop_assert!(start.elapsed() < RENDER_LIMIT, "a render took {:?}", start.elapsed());
        if let Ok(text) = rendered {
            prop_assert!(text.len() <= MAX_RENDERED_BYTES);
        }
    }
}

/// The generators reach the interesting outcomes: some mutated templates still render, some
/// fail to compile, some fail while rendering. A fuzz target whose cases all end the same way
/// would test nothing.
#[test]
fn the_mutations_reach_every_outcome() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (any::<usize>(), prop::collection::vec(mutation(), 0..4), prop::collection::vec(message(), 1..4));
    let (mut compiled_out, mut failed, mut rendered) = (0, 0, 0);
    for _ in 0..300 {
        let (seed, mutations, messages) = strategy.new_tree(&mut runner).unwrap().current();
        let source = mutate(seeds()[seed % seeds().len()].clone(), &mutations);
        match ChatTemplate::new(source, "<s>".into(), "</s>".into()) {
            Err(_) => compiled_out += 1,
            Ok(t) => match t.render_chat(&ChatRender { messages: &messages, ..Default::default() }) {
                Ok(_) => rendered += 1,
                Err(_) => failed += 1,
            },
        }
    }
    eprintln!("outcomes: {compiled_out} refused, {failed} failed, {rendered} rendered");
    assert!(compiled_out >= 10 && failed >= 10 && rendered >= 10, "{compiled_out} {failed} {rendered}");
}
