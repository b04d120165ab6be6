"""Every way a request can be wrong: OpenAI error JSON with the right status, and the server
stays up."""

import json

import openai
import pytest

from conftest import MAX_MODEL_LEN, NAME, health_during


def assert_error(status, body, expected_status, fragment=None, param=None):
    assert status == expected_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["code"] == expected_status
    assert isinstance(err["message"], str) and err["message"]
    if fragment:
        assert fragment in err["message"], err["message"]
    if param:
        assert err["param"] == param, err
    return err


COMPLETION_400 = [
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens must be at least 1", "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be at least 1", "max_tokens"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature", "temperature"),
    ({"prompt": "hi", "temperature": 3.0}, "temperature", "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p", "top_p"),
    ({"prompt": "hi", "top_k": -5}, "top_k", "top_k"),
    ({"prompt": "hi", "min_p": 2}, "min_p", "min_p"),
    ({"prompt": "hi", "presence_penalty": 9}, "presence_penalty", "presence_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", "repetition_penalty"),
    ({"prompt": "hi", "n": 0}, "n must be at least 1", "n"),
    ({"prompt": "hi", "n": 1000000000}, "n must be at most", "n"),
    ({"prompt": "hi", "logprobs": -1}, "logprobs", "logprobs"),
    ({"prompt": "hi", "logprobs": 21}, "logprobs", "logprobs"),
    ({"prompt": "hi", "min_tokens": -1}, "min_tokens", "min_tokens"),
    ({"prompt": "hi", "min_tokens": 20, "max_tokens": 10}, "min_tokens", "min_tokens"),
    ({"prompt": "hi", "stop_token_ids": [10**9]}, "out of vocabulary", "stop_token_ids"),
    ({"prompt": "hi", "max_tokens": 1e30}, "Invalid request body", None),
    ({"prompt": [10**9]}, "out of vocabulary", "prompt"),
    ({"prompt": [-1]}, "out of vocabulary", "prompt"),
    ({"prompt": [[1, 2], [999999]]}, "out of vocabulary", "prompt"),
    ({"prompt": []}, "must not be empty", "prompt"),
    ({"prompt": ""}, "cannot be empty", "prompt"),
    ({"prompt": {"text": "hi"}}, "prompt must be", "prompt"),
    ({"prompt": [1, "a"]}, "prompt must be", "prompt"),
    ({"prompt": [1.5]}, "prompt must be", "prompt"),
    ({"prompt": [5] * (MAX_MODEL_LEN + 10)}, "maximum context length", None),
    ({"prompt": [5] * (MAX_MODEL_LEN - 4), "max_tokens": 16}, "maximum context length", None),
    ({"prompt": "hi", "suffix": "x"}, "suffix", "suffix"),
    ({"prompt": "hi", "logit_bias": {"five": 1}}, "logit_bias", "logit_bias"),
    # Bounded per-token work: stop strings and bad words are checked every step.
    ({"prompt": "hi", "stop": ["x"] * 300}, "at most 256", "stop"),
    ({"prompt": "hi", "bad_words": ["y" * 5000]}, "at most 4096 bytes", "bad_words"),
    ({}, "missing field `prompt`", None),
    ({"prompt": "hi", "stream": "yes"}, "Invalid request body", None),
]


@pytest.mark.parametrize("body,fragment,param", COMPLETION_400)
def test_completion_bad_requests(server, body, fragment, param):
    status, resp = server.json("POST", "/v1/completions", {"model": NAME, **body})
    err = assert_error(status, resp, 400, fragment, param)
    assert err["type"] == "BadRequestError"


CHAT_400 = [
    ({"messages": []}, "at least one message", "messages"),
    ({}, "missing field `messages`", None),
    ({"messages": [{"content": "hi"}]}, "missing field `role`", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url", "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}, "yaml", "response_format"),
    # Tools default to tool_choice "auto", which needs the server's parser flags (as in vLLM).
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}, "--enable-auto-tool-choice", "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"function": {"name": "f"}}]}, "tools[0]", "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "has not been passed", "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, "at least one tool", "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages }}"}, "--trust-request-chat-template", "chat_template"),
    ({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True, "add_generation_prompt": True}, "Cannot set both", "continue_final_message"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "logprobs", "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 50}, "logprobs", "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3}, "max_tokens must be at least 1", "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_MODEL_LEN}, "maximum context length", None),
    ({"messages": [{"role": "user", "content": "hi " * (MAX_MODEL_LEN + 10)}]}, "maximum context length", None),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature", "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2, "temperature": 0}, "greedy", "n"),
]


@pytest.mark.parametrize("body,fragment,param", CHAT_400)
def test_chat_bad_requests(server, body, fragment, param):
    status, resp = server.json("POST", "/v1/chat/completions", {"model": NAME, **body})
    assert_error(status, resp, 400, fragment, param)


@pytest.mark.parametrize("instructions", [[["deep"]], {"a": 1}, 7, True])
def test_responses_instructions_must_be_a_string(server, instructions):
    # A nested array was once taken and echoed back whole in the response object.
    status, resp = server.json("POST", "/v1/responses",
                               {"model": NAME, "input": "hi", "instructions": instructions, "max_output_tokens": 2})
    assert_error(status, resp, 400, "`instructions` must be a string", "instructions")


@pytest.mark.parametrize("raw", [b"{not json", b'{"prompt": "\xff\xfe"}', b"", b"[1, 2]", b'{"prompt": "hi"'])
def test_malformed_bodies(server, raw):
    for path in ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]:
        status, _, body = server.request("POST", path, raw)
        assert_error(status, json.loads(body), 400, "Invalid request body")


def test_unknown_model_is_404_as_in_vllm(server, client):
    for path, body in [
        ("/v1/completions", {"model": "nope", "prompt": "hi"}),
        ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
        ("/tokenize", {"model": "nope", "prompt": "hi"}),
    ]:
        status, resp = server.json("POST", path, body)
        err = assert_error(status, resp, 404, "The model `nope` does not exist.", "model")
        assert err["type"] == "NotFoundError"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="hi", max_tokens=-1)
    assert e.value.status_code == 400
    assert "max_tokens" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                       response_format={"type": "yaml"})


def test_unknown_routes_and_methods_are_json(server):
    status, body = server.json("GET", "/v1/nope")
    assert_error(status, body, 404)
    status, body = server.json("POST", "/nothing/here", {"a": 1})
    assert_error(status, body, 404)
    status, body = server.json("GET", "/v1/completions")
    assert_error(status, body, 405)
    status, body = server.json("DELETE", "/v1/models")
    assert_error(status, body, 405)


def test_tokenize_errors(server):
    status, body = server.json("POST", "/detokenize", {"tokens": [10**12]})
    assert_error(status, body, 400, "out of vocabulary", "tokens")
    status, body = server.json("POST", "/detokenize", {"tokens": [-3]})
    assert_error(status, body, 400, "out of vocabulary")
    status, body = server.json("POST", "/tokenize", {})
    assert_error(status, body, 400)
    status, body = server.json("POST", "/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]})
    assert_error(status, body, 400)


def test_server_survives_bad_input(server):
    assert server.proc.poll() is None
    assert server.request("GET", "/health")[0] == 200


def test_vllm_fields_not_built_are_refused_by_name_and_unknown_ones_ignored(server):
    for body, field in [({"use_beam_search": True}, "use_beam_search"), ({"prompt_embeds": "AAAA"}, "prompt_embeds"),
                        ({"return_token_offsets": True}, "return_token_offsets"),
                        ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend")]:
        status, resp = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 1, **body})
        err = assert_error(status, resp, 400, field, field)
        assert err["type"] == "BadRequestError"
    # Their "off" values, and fields vLLM does not know either, pass.
    for body in [{"use_beam_search": False, "priority": 0, "spaces_between_special_tokens": True},
                 {"no_such_field": 1}, {"user": "me"}]:
        status, resp = server.json("POST", "/v1/chat/completions",
                                   {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **body})
        assert status == 200, resp


def test_an_oversized_schema_is_refused_without_stalling_the_server(server):
    # llguidance refuses a 300000-value enum after about a second of compiling, on a worker
    # thread: health checks keep answering meanwhile.
    schema = {"enum": [f"value-{i}" for i in range(300_000)]}
    body = {"model": NAME, "prompt": "x", "max_tokens": 2, "guided_json": schema}
    done, worst = health_during(server, "/v1/completions", body)
    assert [status for status, _ in done] == [400, 400], done
    assert worst < 0.5, f"/health took {worst:.2f} s while the schema compiled"
