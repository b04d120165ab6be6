//! The oracle fixtures record the ids transformers produced for each prompt; our tokenizer and
//! chat template must produce the same ids from the same text / messages.

use std::path::{Path, PathBuf};

use ferrite_tokenizer::{ChatMessage, Tokenizer};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models")
}

/// Checks every case of an oracle file; returns how many were checked. A vision-language
/// fixture's prompt ids have each image's and video's placeholder expanded to its embeddings (the
/// processors' work): they are compared with each run of a `placeholders` token taken back to one.
///
/// Gemma 3's processor expands each image in the prompt's text instead (`expansion`: the
/// placeholder and what it becomes, as the server's `TextExpansion` writes it), so those prompts
/// (transformers' rendering, with content parts our `ChatMessage` does not take; the server's
/// end-to-end test renders them) are expanded and tokenized whole. So are the prompts with
/// Qwen3-VL's videos, whose processor writes each temporal patch as its timestamp, vision start,
/// placeholders and vision end ([`qwen3_video_text`]).
///
/// Mistral 3's processor closes each row of an image's placeholders with a break token and the
/// last with an end token (`row_breaks`: the break, then the end): those are dropped from a run
/// as it is taken back.
fn check_cases(
    tok: &Tokenizer,
    oracle: &Value,
    label: &str,
    placeholders: &[u32],
    row_breaks: &[u32],
    expansion: Option<&(String, String)>,
) -> usize {
    let cases = oracle["cases"].as_array().expect("cases");
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let mut want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).expect("prompt_ids");
        if let Some((placeholder, replacement)) = expansion {
            let text = case["prompt"].as_str().expect("the rendered prompt");
            let got = tok.encode(&gemma3_text(text, case, placeholder, replacement), false).unwrap();
            assert_eq!(got, want, "{label}/{name}: prompt ids differ");
            continue;
        }
        if let Some(text) = qwen3_video_text(case) {
            assert_eq!(tok.encode(&text, false).unwrap(), want, "{label}/{name}: prompt ids differ");
            continue;
        }
        // A run's row breaks go first; its end token stays until the runs are taken back, so that
        // two adjacent images stay two placeholders.
        let closes_run = |ids: &mut Vec<u32>, tokens: &[u32]| {
            let mut last = None;
            ids.retain(|&t| {
                let closing = tokens.contains(&t) && last.is_some_and(|l| placeholders.contains(&l));
                if !closing {
                    last = Some(t);
                }
                !closing
            });
        };
        let (breaks, ends) = row_breaks.split_at(row_breaks.len().min(1));
        closes_run(&mut want, breaks);
        want.dedup_by(|a, b| a == b && placeholders.contains(a));
        closes_run(&mut want, ends);
        let got = if case["chat"].as_bool().unwrap_or(false) {
            let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).expect("messages");
            let text = tok.apply_chat_template(&messages, true).expect("template renders");
            assert_eq!(text, case["prompt"].as_str().unwrap(), "{label}/{name}: rendered chat prompt differs");
            tok.encode_chat(&messages, true).unwrap()
        } else {
            tok.encode(case["prompt"].as_str().unwrap(), true).unwrap()
        };
        assert_eq!(got, want, "{label}/{name}: prompt ids differ");
    }
    cases.len()
}

/// A Gemma 3 case's rendered prompt with each image's `placeholder` expanded as `Gemma3Processor`
/// expands it: to `replacement`, or, for an image with pan-and-scan crops (its items that follow
/// it with a `crop` index), to the original and the crops each expanded, in transformers' words.
fn gemma3_text(prompt: &str, case: &Value, placeholder: &str, replacement: &str) -> String {
    let mut crops = Vec::new();
    for item in case["images"].as_array().into_iter().flatten() {
        match item.get("crop") {
            Some(_) => *crops.last_mut().expect("a crop follows its image") += 1,
            None => crops.push(0usize),
        }
    }
    let mut pieces = prompt.split(placeholder);
    let mut text = pieces.next().unwrap_or_default().to_string();
    for (image, piece) in pieces.enumerate() {
        match crops.get(image).copied().unwrap_or(0) {
            0 => text.push_str(replacement),
            n => {
                text.push_str(&format!(
                    "Here is the original image {replacement} and here are some crops to help you see better "
                ));
                text.push_str(&vec![replacement; n].join(" "));
            }
        }
        text.push_str(piece);
    }
    text
}

/// A case's rendered prompt with each image and video expanded as Qwen3-VL's processor expands
/// them in the text, when it has a video with `video_timestamps` (2x2 merged patches): an image
/// to its placeholders, a video to `<t seconds><|vision_start|>` + a temporal patch's
/// placeholders + `<|vision_end|>` per patch.
fn qwen3_video_text(case: &Value) -> Option<String> {
    let items = case["images"].as_array()?;
    items.iter().find(|item| item.get("video_timestamps").is_some())?;
    let pieces = case["prompt"].as_str()?.split_inclusive('>');
    let (mut images, mut videos) =
        (items.iter().filter(|i| i.get("frames").is_none()), items.iter().filter(|i| i.get("frames").is_some()));
    let tokens = |item: &Value| {
        let grid: Vec<usize> = serde_json::from_value(item["grid_thw"].clone()).unwrap();
        grid[1] * grid[2] / 4
    };
    let mut text = String::new();
    for piece in pieces {
        if let Some(before) = piece.strip_suffix("<|image_pad|>") {
            let image = images.next().expect("an image per placeholder");
            text.push_str(before);
            text.push_str(&"<|image_pad|>".repeat(tokens(image)));
        } else if let Some(before) = piece.strip_suffix("<|video_pad|>") {
            let video = videos.next().expect("a video per placeholder");
            text.push_str(before);
            for seconds in video["video_timestamps"].as_array().unwrap() {
                let pads = "<|video_pad|>".repeat(tokens(video));
                text.push_str(&format!(
                    "<{:.1} seconds><|vision_start|>{pads}<|vision_end|>",
                    seconds.as_f64().unwrap()
                ));
            }
        } else {
            text.push_str(piece);
        }
    }
    Some(text)
}

#[test]
fn every_fixture_prompt_tokenizes_as_transformers_did() {
    let mut checked = 0;
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let dir = entry.unwrap().path();
        let oracle_path = dir.join("oracle.json");
        if !oracle_path.exists() {
            continue;
        }
        let oracle: Value = serde_json::from_str(&std::fs::read_to_string(&oracle_path).unwrap()).unwrap();
        let tok = Tokenizer::from_dir(&dir).unwrap();
        // (Some configs hold Python's non-finite literals; none of those is a vision model's.)
        let config = serde_json::from_str::<Value>(&std::fs::read_to_string(dir.join("config.json")).unwrap()).ok();
        // LLaVA's configs name the image token `image_token_index`.
        let placeholders: Vec<u32> = ["image_token_id", "image_token_index", "video_token_id"]
            .iter()
            .filter_map(|key| config.as_ref().and_then(|c| c[key].as_u64()))
            .map(|id| id as u32)
            .collect();
        // Gemma 3: `\n\n<boi>` + `image_seq_length` soft tokens + `<eoi>\n\n` per image.
        let expansion = config.as_ref().filter(|c| c["model_type"] == "gemma3").map(|c| {
            let token = |key: &str| tok.id_to_token(c[key].as_u64().expect(key) as u32).expect(key);
            let (boi, image, eoi) = (token("boi_token_index"), token("image_token_index"), token("eoi_token_index"));
            let tokens = c["mm_tokens_per_image"].as_u64().unwrap() as usize;
            (boi.clone(), format!("\n\n{boi}{}{eoi}\n\n", image.repeat(tokens)))
        });
        // Mistral 3: `[IMG]` rows closed by `[IMG_BREAK]`, the last by `[IMG_END]`.
        let row_breaks: Vec<u32> = match config.as_ref().is_some_and(|c| c["model_type"] == "mistral3") {
            true => ["[IMG_BREAK]", "[IMG_END]"].iter().map(|t| tok.token_to_id(t).expect(t)).collect(),
            false => Vec::new(),
        };
        checked +=
            check_cases(&tok, &oracle, &dir.display().to_string(), &placeholders, &row_breaks, expansion.as_ref());
    }
    assert!(checked >= 8, "only {checked} cases found");
}

#[test]
fn eos_comes_from_generation_config_and_tokenizer_config() {
    let tok = Tokenizer::from_dir(&fixtures().join("llama")).unwrap();
    let eos = tok.eos_token().expect("fixture tokenizer declares an eos token");
    assert!(tok.eos_token_ids().contains(&tok.token_to_id(eos).unwrap()));
}
