"""Images and videos in chat requests: `ferrite serve` on the tiny Qwen2-VL fixture, driven with the
official `openai` client. Images arrive as data URIs and from a loopback HTTP server, videos as
vLLM's `data:video/jpeg;base64,<frame>,<frame>,...` frame lists; the whole path (content parts,
fetching, decoding, the image and video processors, placeholder expansion, the vision encoder,
MRoPE) is held to transformers' greedy tokens recorded in the fixture's oracle.json."""

import base64
import http.server
import json
import threading

import openai
import pytest

from conftest import NAME, REPO, Server

VL = REPO / "fixtures" / "models" / "qwen2-vl"
ORACLE = json.loads((VL / "oracle.json").read_text())


def data_uri(image):
    return "data:image/png;base64," + base64.b64encode((VL / "images" / f"{image}.png").read_bytes()).decode()


def video_uri(family_dir, video):
    """vLLM's frame-list data URI of a fixture video. The frames are PNGs: the media type names the
    list, and each frame is opened whatever its format (by Pillow in vLLM, here as well)."""
    frames = sorted((family_dir / "videos" / video).glob("*.png"), key=lambda f: int(f.stem))
    return "data:video/jpeg;base64," + ",".join(base64.b64encode(f.read_bytes()).decode() for f in frames)


def parts(case, url_of, family_dir=VL):
    """The case's message content as OpenAI content parts, images given by `url_of(name)`."""
    out = []
    for p in case["messages"][0]["content"]:
        if p["type"] == "image":
            out.append({"type": "image_url", "image_url": {"url": url_of(p["image"])}})
        elif p["type"] == "video":
            out.append({"type": "video_url", "video_url": {"url": video_uri(family_dir, p["video"])}})
        else:
            out.append({"type": "text", "text": p["text"]})
    return out


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("vl"), "--limit-mm-per-prompt", '{"image": 2}',
               model_args=["--model", str(VL)], max_model_len=512)
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture(scope="module")
def image_host():
    """Serves the fixture's images over loopback HTTP."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            path = VL / "images" / self.path.lstrip("/")
            if not path.is_file():
                self.send_error(404)
                return
            body = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def complete(vl, content, **extra):
    client = vl.client()
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": content}], max_tokens=16, temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True, **extra})


@pytest.mark.parametrize("case", [c for c in ORACLE["cases"] if c["images"]], ids=lambda c: c["name"])
def test_image_chats_match_transformers(vl, case):
    r = complete(vl, parts(case, data_uri))
    assert r.prompt_token_ids == case["prompt_ids"]
    assert r.usage.prompt_tokens == len(case["prompt_ids"])
    assert r.choices[0].token_ids == case["output_ids"], case["name"]


def test_images_fetched_over_http_equal_data_uris(vl, image_host):
    case = next(c for c in ORACLE["cases"] if c["name"] == "two-images")
    r = complete(vl, parts(case, lambda name: f"{image_host}/{name}.png"))
    assert r.choices[0].token_ids == case["output_ids"]


def test_concurrent_image_requests_are_batched_exactly(vl):
    import concurrent.futures

    cases = [c for c in ORACLE["cases"] if c["images"]] * 2
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(lambda c: complete(vl, parts(c, data_uri)), cases))
    for case, r in zip(cases, results):
        assert r.choices[0].token_ids == case["output_ids"], case["name"]


def test_bad_images_are_400s(vl, image_host):
    client = vl.client()
    import openai

    def refused(content, **extra):
        with pytest.raises(openai.BadRequestError) as e:
            complete(vl, content, **extra)
        return e.value.response.json()["error"]["message"]

    text = {"type": "text", "text": "hi"}
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"not a png").decode()}}
    assert "messages[0].content[0]" in refused([bad, text])
    three = [{"type": "image_url", "image_url": {"url": data_uri("square")}}] * 3
    assert "At most 2 image(s)" in refused(three + [text])
    missing = {"type": "image_url", "image_url": {"url": f"{image_host}/nope.png"}}
    assert "404" in refused([missing, text])
    assert "mm_processor_kwargs" in json.dumps(
        refused([{"type": "image_url", "image_url": {"url": data_uri("square")}}, text],
                mm_processor_kwargs={"no_such_key": 1}))
    mp4 = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(b"mp4").decode()}}
    assert "cannot be decoded" in refused([mp4, text])
    broken_frame = {"type": "video_url", "video_url": {"url": video_uri(VL, "short") + ",bm90IGEgZnJhbWU="}}
    assert "frame 2" in refused([broken_frame, text])
    assert client.models.list().data[0].id == NAME


def test_processor_kwargs_shrink_the_image(vl):
    content = [{"type": "image_url", "image_url": {"url": data_uri("large")}}, {"type": "text", "text": "hi"}]
    full = complete(vl, content)
    small = complete(vl, content, mm_processor_kwargs={"max_pixels": 3136})
    # 200x150 is 12 merged tokens by default and 2 under 3136 pixels.
    assert full.usage.prompt_tokens - small.usage.prompt_tokens == 10


def test_a_text_model_refuses_images(server):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(
            model=NAME, max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_uri("square")}}]}])
    assert "does not accept image input" in e.value.response.json()["error"]["message"]


def oracle_of(family):
    return json.loads((REPO / "fixtures" / "models" / family / "oracle.json").read_text())


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A server per other vision-language family, started on first use."""
    started = {}

    def get(family):
        if family not in started:
            started[family] = Server(tmp_path_factory.mktemp(family), max_model_len=512,
                                     model_args=["--model", str(REPO / "fixtures" / "models" / family)])
        return started[family]

    yield get
    for s in started.values():
        assert s.stop() == 0, s.logs()


OTHER_FAMILIES = [(family, case) for family in ("qwen2.5-vl", "qwen3-vl", "qwen3-vl-moe", "qwen3.5-vl", "llava",
                                                             "llava-siglip", "llava-next", "mistral3", "gemma3-vl")
                  for case in oracle_of(family)["cases"] if case["images"]]


@pytest.mark.parametrize("family,case", OTHER_FAMILIES, ids=lambda v: v if isinstance(v, str) else v["name"])
def test_other_families_image_chats_match_transformers(servers, family, case):
    """Qwen2.5-VL's windowed tower and its videos; Qwen3-VL's 16-pixel patches and DeepStack, and its
    videos sampled by time, each temporal patch written after its `<t seconds>` in a run of its own;
    LLaVA's CLIP processor (resize, centre crop) and tower, its `<image>` expanded to 16 tokens;
    LLaVA-interleave's SigLIP processor and tower, every row of it projected; LLaVA-NeXT's anyres
    processor (the whole image and its best pinpoint's tiles), its `<image>` expanded to as many
    tokens as the image's aspect ratio leaves after unpadding; Mistral 3's Pixtral processor (the
    image at its own size in whole merged patches) and tower, its `[IMG]` expanded to rows of `[IMG]`
    closed by `[IMG_BREAK]` and `[IMG_END]`; Qwen3.5's hybrid text model behind Qwen3-VL's tower;
    Gemma 3's bilinear processor, SigLIP tower and `<start_of_image>` expanded in the prompt's text
    (its newlines tokenized with the text around them), its image tokens attending both ways, and
    with `do_pan_and_scan` the wide image and its two crops written around their own expansions:
    the same path, each with its own oracle (and the case's `mm_processor_kwargs`)."""
    images = REPO / "fixtures" / "models" / family / "images"

    def uri(image):
        return "data:image/png;base64," + base64.b64encode((images / f"{image}.png").read_bytes()).decode()

    kwargs = {"mm_processor_kwargs": case["mm_processor_kwargs"]} if "mm_processor_kwargs" in case else {}
    r = complete(servers(family), parts(case, uri, REPO / "fixtures" / "models" / family), **kwargs)
    assert r.prompt_token_ids == case["prompt_ids"]
    assert r.choices[0].token_ids == case["output_ids"], case["name"]


@pytest.mark.parametrize("family", ["llava", "llava-next", "mistral3", "gemma3-vl"])
def test_models_without_video_input_refuse_videos(servers, family):
    with pytest.raises(openai.BadRequestError) as e:
        complete(servers(family), [{"type": "video_url", "video_url": {"url": video_uri(VL, "short")}}])
    assert "does not accept video input" in e.value.response.json()["error"]["message"]


@pytest.mark.parametrize("family", ["llava", "llava-next", "mistral3"])
def test_llava_refuses_processor_kwargs(servers, family):
    client = servers(family).client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=NAME, max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_uri("square")}},
                                                   {"type": "text", "text": "hi"}]}],
            extra_body={"mm_processor_kwargs": {"max_pixels": 3136}})
    assert "mm_processor_kwargs" in str(e.value)


def test_gemma3_pan_and_scan_kwargs_are_checked(servers):
    """Pan-and-scan's settings are Gemma 3's only processor kwargs; a bad value or another key is the
    request's fault (400), and an image its thresholds leave uncropped is written plainly."""
    server = servers("gemma3-vl")
    case = next(c for c in oracle_of("gemma3-vl")["cases"] if c["name"] == "pan-and-scan")
    images = REPO / "fixtures" / "models" / "gemma3-vl" / "images"

    def uri(image):
        return "data:image/png;base64," + base64.b64encode((images / f"{image}.png").read_bytes()).decode()

    content = parts(case, uri)
    for kwargs, message in [({"do_pan_and_scan": "yes"}, "`do_pan_and_scan` must be true or false"),
                            ({"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 0},
                             "`pan_and_scan_min_crop_size` must be a positive integer"),
                            ({"pan_and_scan_max_num_crops": -2}, "`pan_and_scan_max_num_crops` must be a positive"),
                            ({"pan_and_scan_min_ratio_to_activate": "x"}, "must be a number"),
                            ({"max_pixels": 3136}, "unknown key `max_pixels`")]:
        with pytest.raises(openai.BadRequestError) as e:
            complete(server, content, mm_processor_kwargs=kwargs)
        assert message in e.value.response.json()["error"]["message"], kwargs
    # The processor's default minimum crop (256 pixels) leaves the 112x56 image whole: one image.
    plain = complete(server, content, mm_processor_kwargs={"do_pan_and_scan": True})
    soft = json.loads((images.parent / "config.json").read_text())["image_token_index"]
    assert case["prompt_ids"].count(soft) == 3 * 16
    assert plain.prompt_token_ids.count(soft) == 16, plain.prompt_token_ids


def test_qwen3_video_sampling_kwargs_and_bad_videos(servers):
    """Qwen3-VL's video processor samples the frame list at `fps` of an assumed 24 (as transformers
    does for frames without metadata): 2 by default keeps 4 of "long"'s 16 frames, 24 keeps them
    all, 8 temporal patches each behind its timestamp. A video too short for one temporal patch,
    or `num_frames` beside the default `fps`, is the request's fault."""
    family = REPO / "fixtures" / "models" / "qwen3-vl"
    server = servers("qwen3-vl")
    long = [{"type": "video_url", "video_url": {"url": video_uri(family, "long")}}, {"type": "text", "text": "hi"}]
    default = complete(server, long)
    every_frame = complete(server, long, mm_processor_kwargs={"fps": 24})
    tokenizer = json.loads((family / "tokenizer.json").read_text())
    vision_start = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|vision_start|>")
    # The template's own vision start, then one per temporal patch.
    assert default.prompt_token_ids.count(vision_start) == 1 + 2
    assert every_frame.prompt_token_ids.count(vision_start) == 1 + 8

    def refused(content, **extra):
        with pytest.raises(openai.BadRequestError) as e:
            complete(server, content, **extra)
        return e.value.response.json()["error"]["message"]

    frame = base64.b64encode((family / "videos" / "long" / "0.png").read_bytes()).decode()
    assert "too short" in refused([{"type": "video_url", "video_url": {"url": "data:video/jpeg;base64," + frame}}])
    assert "mutually exclusive" in refused(long, mm_processor_kwargs={"num_frames": 4})
    assert "unknown key" in refused(long, mm_processor_kwargs={"max_frames": 4})
