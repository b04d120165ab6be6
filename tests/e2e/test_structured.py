"""Structured outputs end to end on the real default model (SmolLM2-135M-Instruct, GGUF): the
official `openai` client sends OpenAI's `response_format` and vLLM's `structured_outputs` /
`guided_*` fields, and every sampled output must lie in the constraint's language."""

import json
import os
import re

import jsonschema
import openai
import pytest

from conftest import Server, open_stream, sse_events

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    gguf = os.environ.get("FERRITE_SMOLLM2_GGUF")
    if not gguf:
        pytest.skip("SKIP: FERRITE_SMOLLM2_GGUF (the default model's GGUF, which scripts/test.sh fetches) is not set")
    # No whitespace between JSON tokens and no keys beyond the schema's: a 135M model otherwise pads
    # documents with both.
    s = Server(
        tmp_path_factory.mktemp("structured"),
        "--structured-outputs-config", '{"backend": "guidance", "disable_any_whitespace": true, "disable_additional_properties": true}',
        model_args=["--model", gguf],
        max_model_len=2048,
    )
    yield s
    assert s.stop() == 0, s.logs()


def chat(smol, **kw):
    return smol.client().chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        **kw,
    )


def test_json_schema_outputs_validate(smol):
    r = chat(
        smol,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        temperature=0.8,
        seed=3,
        n=3,
        max_tokens=120,
    )
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_streams_and_reports_masked_logprobs(smol):
    conn, resp = open_stream(smol, "/v1/chat/completions", {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Give me a JSON object."}],
        "response_format": {"type": "json_object"},
        "stream": True, "max_tokens": 80, "temperature": 0.0, "logprobs": True, "top_logprobs": 3,
    })
    assert resp.status == 200
    chunks = [json.loads(e) for e in sse_events(resp) if e != "[DONE]"]
    conn.close()
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    if finish == ["stop"]:
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.startswith("{"), text
    for c in chunks:
        for lp in (c["choices"][0].get("logprobs") or {}).get("content") or []:
            # The sampled token was allowed, so its logprob is finite; the masked ones are not listed.
            assert lp["logprob"] > -1e30, lp
            assert all(t["logprob"] > -1e30 for t in lp["top_logprobs"]), lp


def test_regex_and_choice_hold_on_twenty_samples_at_temperature_one(smol):
    client = smol.client()
    r = client.completions.create(
        model="tiny-llama", prompt="A code:", n=20, temperature=1.0, max_tokens=20, seed=11,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2,5}"}},
    )
    assert len(r.choices) == 20
    for c in r.choices:
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,5}", c.text), c.text
    options = ["yes", "no", "it depends"]
    r = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Is the sky blue?"}],
        n=20, temperature=1.0, max_tokens=10, extra_body={"guided_choice": options},
    )
    seen = {c.message.content for c in r.choices}
    assert seen <= set(options), seen


def test_gbnf_and_lark_grammars_constrain_completions(smol):
    gbnf = r'''
root ::= select " FROM " table
select ::= "SELECT " column ("," column){0,2}
column ::= "id" | "name" | "age"
table ::= "users" | "orders"
'''
    lark = 'start: "ok" | "fine"'
    client = smol.client()
    r = client.completions.create(
        model="tiny-llama", prompt="SQL:", n=5, temperature=1.0, max_tokens=40, seed=5,
        extra_body={"structured_outputs": {"grammar": gbnf}},
    )
    for c in r.choices:
        assert c.finish_reason == "stop", c
        assert re.fullmatch(r"SELECT (id|name|age)(,(id|name|age)){0,2} FROM (users|orders)", c.text), c.text
    r = client.completions.create(
        model="tiny-llama", prompt="Status:", max_tokens=5, temperature=0.0, extra_body={"guided_grammar": lark},
    )
    assert r.choices[0].text in ("ok", "fine")


def test_bad_constraints_are_openai_400s(smol):
    client = smol.client()
    cases = [
        ({"structured_outputs": {"regex": "[0-9"}}, "Grammar error"),
        ({"guided_json": {"type": "no-such-type"}}, "Grammar error"),
        ({"structured_outputs": {"grammar": "root ::= missing"}}, "missing"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "multiple are specified"),
        ({"structured_outputs": {"choice": []}}, "non-empty list"),
        ({"response_format": {"type": "json_schema"}}, "json_schema.schema"),
    ]
    for body, needle in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny-llama", prompt="x", max_tokens=5, extra_body=body)
        assert e.value.status_code == 400
        assert needle in e.value.message, (body, e.value.message)
    # The server still serves after the refusals.
    assert client.completions.create(model="tiny-llama", prompt="x", max_tokens=2).choices


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False},
    },
}


def schema_of(name):
    return next(t["function"]["parameters"] for t in (WEATHER, ADD) if t["function"]["name"] == name)


def test_tool_choice_required_returns_calls_whose_arguments_match_the_schema(smol):
    # One call per message (maxItems 1): a 135M model would otherwise go on listing calls.
    r = chat(smol, tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False,
             temperature=0.8, seed=2, n=3, max_tokens=150)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert calls, choice
        for call in calls:
            assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
            jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))


def test_named_tool_choice_returns_that_call_whole_and_streamed(smol):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = chat(smol, tools=[WEATHER, ADD], tool_choice=named, temperature=0.0, max_tokens=80)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "stop"
    whole = json.loads(call.function.arguments)
    jsonschema.validate(whole, schema_of("get_weather"))
    conn, resp = open_stream(smol, "/v1/chat/completions", {
        "model": "tiny-llama", "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "tools": [WEATHER, ADD], "tool_choice": named, "temperature": 0.0, "max_tokens": 80, "stream": True,
    })
    deltas = [json.loads(e)["choices"][0]["delta"] for e in sse_events(resp) if e != "[DONE]"]
    conn.close()
    pieces = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"].startswith("chatcmpl-tool-")
    assert json.loads("".join(p["function"].get("arguments", "") for p in pieces)) == whole


def test_tool_choice_none_and_tool_history_render(smol):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call1", "content": "21 C"},
    ]
    r = smol.client().chat.completions.create(
        model="tiny-llama", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=5, temperature=0.0)
    assert r.choices[0].message.tool_calls in (None, [])
    with pytest.raises(openai.BadRequestError) as e:
        bad = [dict(messages[1], tool_calls=[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}])]
        smol.client().chat.completions.create(model="tiny-llama", messages=[messages[0], *bad], max_tokens=2)
    assert "not JSON" in e.value.message


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    gguf = os.environ.get("FERRITE_SMOLLM2_GGUF")
    if not gguf:
        pytest.skip("SKIP: FERRITE_SMOLLM2_GGUF is not set")
    s = Server(tmp_path_factory.mktemp("reasoning"), "--reasoning-parser", "deepseek_r1",
               model_args=["--model", gguf], max_model_len=2048)
    yield s
    assert s.stop() == 0, s.logs()


def test_reasoning_parser_splits_and_structured_outputs_wait_for_the_section_end(reasoning_server):
    client = reasoning_server.client()
    # DeepSeek-R1's format: everything before </think> is reasoning. SmolLM2 never writes the
    # tag, so the whole output is reasoning, and a choice constraint (which applies only after
    # the section ends, as in vLLM) leaves it free.
    r = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Is the sky blue?"}],
        max_tokens=12, temperature=0.0, extra_body={"guided_choice": ["yes", "no"]})
    m = r.choices[0].message
    assert m.reasoning_content and m.reasoning_content not in ("yes", "no"), m
    assert m.reasoning == m.reasoning_content and not m.content
    # Streaming gives the same split.
    conn, resp = open_stream(reasoning_server, "/v1/chat/completions", {
        "model": "tiny-llama", "messages": [{"role": "user", "content": "Is the sky blue?"}],
        "max_tokens": 12, "temperature": 0.0, "stream": True, "guided_choice": ["yes", "no"]})
    deltas = [json.loads(e)["choices"][0]["delta"] for e in sse_events(resp) if e != "[DONE]"]
    conn.close()
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == m.reasoning_content
    assert not "".join(d.get("content") or "" for d in deltas)
    # include_reasoning false leaves the section out.
    r = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=12,
        temperature=0.0, extra_body={"include_reasoning": False})
    assert r.choices[0].message.reasoning_content is None and not r.choices[0].message.content


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory):
    gguf = os.environ.get("FERRITE_SMOLLM2_GGUF")
    if not gguf:
        pytest.skip("SKIP: FERRITE_SMOLLM2_GGUF is not set")
    s = Server(tmp_path_factory.mktemp("hermes"), "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               model_args=["--model", gguf], max_model_len=2048)
    yield s
    assert s.stop() == 0, s.logs()


# SmolLM2 does not call tools by itself: a regex makes it write a Hermes tool call, which the
# parser must then find (structured outputs and auto tool choice compose, as in vLLM).
HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,8}", "unit": "celsius"\}\}\n</tool_call>'


def test_auto_tool_choice_parses_hermes_calls_whole_and_streamed(hermes_server):
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER], "max_tokens": 60, "temperature": 0.0,
            "structured_outputs": {"regex": HERMES_CALL}}
    r = hermes_server.client().chat.completions.create(**{k: v for k, v in body.items() if k != "structured_outputs"},
                                                       extra_body={"structured_outputs": body["structured_outputs"]})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("chatcmpl-tool-")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema_of("get_weather"))
    assert not choice.message.content
    conn, resp = open_stream(hermes_server, "/v1/chat/completions", {**body, "stream": True})
    chunks = [json.loads(e) for e in sse_events(resp) if e != "[DONE]"]
    conn.close()
    pieces = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"].startswith("chatcmpl-tool-")
    assert json.loads("".join(p["function"].get("arguments") or "" for p in pieces)) == args
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # Text without a call stays content.
    r = hermes_server.client().chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Say hi."}], tools=[WEATHER], max_tokens=8,
        temperature=0.0, extra_body={"structured_outputs": {"regex": "[a-z]{2,6} there"}})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls in (None, [])
    assert r.choices[0].message.content.endswith(" there")


def token_ids(server, text):
    status, body = server.json("POST", "/tokenize", {"model": "tiny-llama", "prompt": text, "add_special_tokens": False})
    assert status == 200, body
    return body["tokens"]


def test_logit_bias_allowed_token_ids_and_bad_words_act(smol):
    client = smol.client()
    prompt = "The capital of France is Paris. The capital of Italy is"
    (yes,), (no,) = token_ids(smol, " yes"), token_ids(smol, " no")
    r = client.completions.create(model="tiny-llama", prompt=prompt, n=10, temperature=1.0, max_tokens=6, seed=4,
                                  extra_body={"allowed_token_ids": [yes, no]})
    for c in r.choices:
        assert re.fullmatch(r"( yes| no)+", c.text), c.text
    (banana,) = token_ids(smol, " banana")
    r = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=3, temperature=0.0,
                                  logit_bias={str(banana): 100})
    assert r.choices[0].text == " banana banana banana", r.choices[0].text
    plain = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=30, temperature=0.0).choices[0].text
    assert " the " in plain.lower() or plain.lower().startswith("the ") or " the" in plain, plain
    banned = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=30, temperature=0.0,
                                       extra_body={"bad_words": ["the", "The"]}).choices[0].text
    assert not re.search(r"(^|\s)[Tt]he\b", banned), banned
    for body, needle in [({"logit_bias": {"x": 1}}, "token ids"), ({"allowed_token_ids": []}, "at least one"),
                         ({"allowed_token_ids": [10**9]}, "out of vocabulary")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny-llama", prompt="x", max_tokens=2, extra_body=body)
        assert needle in e.value.message, (body, e.value.message)


def test_responses_api_text_stream_structure_tools_and_continuation(smol):
    client = smol.client()
    r = client.responses.create(model="tiny-llama", instructions="Answer briefly.", input="Name a colour.",
                                max_output_tokens=12, temperature=0.0)
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.output_text and r.usage.output_tokens > 0
    # Streaming: typed events whose text deltas add up to the final text.
    events = list(client.responses.create(model="tiny-llama", instructions="Answer briefly.", input="Name a colour.",
                                          max_output_tokens=12, temperature=0.0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == r.output_text
    # A continuation carries the earlier turns: its prompt is longer than the same input alone.
    follow = client.responses.create(model="tiny-llama", input="And another?", previous_response_id=r.id,
                                     max_output_tokens=5, temperature=0.0)
    alone = client.responses.create(model="tiny-llama", input="And another?", max_output_tokens=5, temperature=0.0)
    assert follow.usage.input_tokens > alone.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny-llama", input="x", previous_response_id="resp_nope", max_output_tokens=2)
    # text.format: a JSON schema holds.
    r = client.responses.create(model="tiny-llama", input="Describe a person as JSON.", max_output_tokens=120,
                                temperature=0.7, text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(r.output_text), PERSON)
    # Function tools with tool_choice required come back as function_call items.
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    r = client.responses.create(model="tiny-llama", input="Weather in Paris?", tools=[tool], tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=80, temperature=0.0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), schema_of("get_weather"))
    # The call's output continues the conversation.
    r2 = client.responses.create(model="tiny-llama", previous_response_id=r.id, max_output_tokens=5,
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 C"}])
    assert r2.usage.input_tokens > r.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny-llama", input="x", background=True)
    assert "background" in e.value.message
