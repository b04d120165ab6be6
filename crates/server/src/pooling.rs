//! Pooling models over HTTP, as vLLM serves them: `POST /v1/embeddings` (OpenAI), `/score` and
//! `/v1/score`, `/rerank`, `/v1/rerank` and `/v2/rerank` (Jina / Cohere shape), `/classify` and
//! `/v1/classify`, plus `/v1/models`, `/health`, `/version` and Prometheus `/metrics`.
//!
//! An embedding model answers embeddings, and scores pairs by the cosine of their embeddings; a
//! classifier answers classify, and (with one label: a cross-encoder) scores pairs read as one
//! sequence, `[CLS] a [SEP] b [SEP]`. Requests are tokenized and validated in the handler, then
//! handed to the engine's [`PoolingClient`], which batches them.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use ferrite_engine::pooling::{classifier_activation, cosine, kind_name, PoolingInput, PoolingTask, ServeTask};
use ferrite_engine::PoolingClient;
use ferrite_tokenizer::Tokenizer;
use tokio::net::TcpListener;

use crate::error::{parse_json, ApiError};
use crate::metrics::{Finish, FinishedChoice, Metrics};
use crate::params::engine_error;
use crate::protocol::{
    ClassificationData, ClassificationRequest, Embedding, EmbeddingData, EmbeddingRequest, Input, ListResponse,
    RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankUsage, ScoreData, ScoreRequest, Usage,
};
use crate::{
    finish_router, off_runtime, random_id, serve_router, unix_now, with_common_routes, Served, ServedModel,
    ServerConfig,
};

pub struct PoolingState {
    client: PoolingClient,
    tokenizer: Arc<Tokenizer>,
    served: ServedModel,
    metrics: Metrics,
}

impl PoolingState {
    pub fn new(client: PoolingClient, config: ServerConfig) -> Arc<PoolingState> {
        let tokenizer = client.tokenizer();
        let vocab_bound = tokenizer.vocab_size().min(client.info().vocab_size);
        let max_model_len = client.max_model_len();
        Arc::new(PoolingState {
            served: ServedModel::new(config, max_model_len, vocab_bound),
            tokenizer,
            client,
            metrics: Metrics::new(max_model_len),
        })
    }

    fn is_embedding(&self) -> bool {
        self.client.info().task == PoolingTask::Embed
    }

    /// Runs tokenized inputs through the engine.
    async fn run(&self, inputs: Vec<PoolingInput>) -> Result<Vec<Vec<f32>>, ApiError> {
        self.client.run(inputs).await.map_err(engine_error)
    }

    /// vLLM's `truncate_prompt_tokens`: -1 means the model's length, larger than it is an error.
    fn truncation(&self, value: Option<i64>) -> Result<Option<usize>, ApiError> {
        match value {
            None => Ok(None),
            Some(-1) => Ok(Some(self.served.max_model_len)),
            Some(k) if k < 1 => {
                Err(ApiError::invalid("truncate_prompt_tokens", format!("truncate_prompt_tokens must be -1 or at least 1, got {k}")))
            }
            Some(k) if k as u64 > self.served.max_model_len as u64 => Err(ApiError::invalid(
                "truncate_prompt_tokens",
                format!(
                    "truncate_prompt_tokens value ({k}) is greater than max_model_len ({}). Please, select a smaller truncation size.",
                    self.served.max_model_len
                ),
            )),
            Some(k) => Ok(Some(k as usize)),
        }
    }

    fn check_length(&self, n: usize, param: &str) -> Result<(), ApiError> {
        if n == 0 {
            return Err(ApiError::invalid(param, "The input is empty (no tokens)."));
        }
        if n > self.served.max_model_len {
            return Err(ApiError::invalid(
                param,
                format!(
                    "This model's maximum context length is {} tokens. However, you requested {n} tokens in the input. Please reduce the length of the input.",
                    self.served.max_model_len
                ),
            ));
        }
        Ok(())
    }

    fn encode_text(
        &self,
        text: &str,
        truncate: Option<usize>,
        add_special: bool,
        param: &str,
    ) -> Result<PoolingInput, ApiError> {
        let ids = if add_special {
            self.tokenizer.encode_truncated(text, truncate)
        } else {
            self.tokenizer.encode(text, false).map(|mut ids| {
                if let Some(k) = truncate {
                    ids.truncate(k);
                }
                ids
            })
        }
        .map_err(|e| ApiError::invalid(param, e.to_string()))?;
        self.check_length(ids.len(), param)?;
        Ok(ids.into())
    }

    fn encode_ids(&self, ids: &[i64], truncate: Option<usize>, param: &str) -> Result<PoolingInput, ApiError> {
        let mut ids = self.served.check_token_ids(ids, param)?;
        if let Some(k) = truncate {
            // vLLM keeps the last `k` tokens of a token-id prompt.
            ids = ids.split_off(ids.len().saturating_sub(k));
        }
        self.check_length(ids.len(), param)?;
        Ok(ids.into())
    }

    fn encode_input(
        &self,
        input: Input,
        truncate: Option<usize>,
        add_special: bool,
    ) -> Result<Vec<PoolingInput>, ApiError> {
        let inputs = match input {
            Input::Text(t) => vec![self.encode_text(&t, truncate, add_special, "input")?],
            Input::Texts(ts) => {
                ts.iter().map(|t| self.encode_text(t, truncate, add_special, "input")).collect::<Result<_, _>>()?
            }
            Input::Ids(ids) => vec![self.encode_ids(&ids, truncate, "input")?],
            Input::IdLists(lists) => {
                lists.iter().map(|ids| self.encode_ids(ids, truncate, "input")).collect::<Result<_, _>>()?
            }
        };
        if inputs.is_empty() {
            return Err(ApiError::invalid("input", "The input list is empty."));
        }
        Ok(inputs)
    }

    fn encode_pair(&self, a: &str, b: &str, truncate: Option<usize>) -> Result<PoolingInput, ApiError> {
        let (ids, type_ids) =
            self.tokenizer.encode_pair(a, b, truncate).map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.check_length(ids.len(), "text_2")?;
        Ok(PoolingInput { ids, type_ids: Some(type_ids) })
    }

    /// Relevance of each `(a, b)` pair and the prompt tokens used: a cross-encoder's activated
    /// logit, or the cosine of an embedding model's embeddings.
    async fn score_pairs(
        self: &Arc<Self>,
        pairs: Vec<(String, String)>,
        truncate: Option<usize>,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        let embedding = self.is_embedding();
        if !embedding && self.client.info().labels.len() != 1 {
            return Err(ApiError::bad_request(format!(
                "Scoring needs a cross-encoder with one output label; this model has {}.",
                self.client.info().labels.len()
            )));
        }
        // Tokenizing long texts must not stall the async runtime.
        let inputs = off_runtime({
            let state = self.clone();
            move || {
                let mut inputs: Vec<PoolingInput> = Vec::with_capacity(pairs.len() * 2);
                for (a, b) in &pairs {
                    if embedding {
                        inputs.push(state.encode_text(a, truncate, true, "text_1")?);
                        inputs.push(state.encode_text(b, truncate, true, "text_2")?);
                    } else {
                        inputs.push(state.encode_pair(a, b, truncate)?);
                    }
                }
                Ok(inputs)
            }
        })
        .await?;
        let tokens = prompt_tokens(&inputs);
        let out = self.run(inputs).await?;
        if embedding {
            return Ok((out.chunks(2).map(|p| cosine(&p[0], &p[1]) as f32).collect(), tokens));
        }
        Ok((out.iter().map(|l| self.client.score_activation().apply(l[0])).collect(), tokens))
    }

    /// [`PoolingState::encode_input`] off the async runtime (long texts take CPU time).
    async fn encode_input_off(
        self: &Arc<Self>,
        input: Input,
        truncate: Option<usize>,
        add_special: bool,
    ) -> Result<Vec<PoolingInput>, ApiError> {
        let state = self.clone();
        off_runtime(move || state.encode_input(input, truncate, add_special)).await
    }
}

fn prompt_tokens(inputs: &[PoolingInput]) -> usize {
    inputs.iter().map(|s| s.ids.len()).sum()
}

fn unsupported(state: &PoolingState, api: &str) -> ApiError {
    ApiError::bad_request(format!(
        "The model does not support {api} API (served with --task {}; {} is {} model)",
        state.client.task().as_str(),
        state.client.info().architecture,
        kind_name(state.client.info().task)
    ))
}

async fn embeddings(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: EmbeddingRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if !state.is_embedding() {
        return Err(unsupported(&state, "Embeddings"));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format must be `float` or `base64`, got `{other}`"),
            ))
        }
    };
    let dimensions = match req.dimensions {
        None => None,
        Some(d) => {
            let d = usize::try_from(d).unwrap_or(0);
            state
                .client
                .check_dimensions(state.served.model_name(), d)
                .map_err(|m| ApiError::invalid("dimensions", m))?;
            Some(d)
        }
    };
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let inputs = state.encode_input_off(req.input, truncate, req.add_special_tokens.unwrap_or(true)).await?;
    let tokens = prompt_tokens(&inputs);
    let outputs = state.run(inputs).await?;
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            state.client.finish_embedding(&mut v, dimensions, req.normalize);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                EmbeddingData::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                EmbeddingData::Float(v)
            };
            Embedding { index, object: "embedding", embedding }
        })
        .collect();
    let response = ListResponse {
        id: format!("embd-{}", random_id()),
        object: "list",
        created: unix_now(),
        model: state.served.model_name().to_owned(),
        data,
        usage: Usage::new(tokens, 0),
    };
    Ok(Json(response).into_response())
}

/// vLLM's pairing: one `text_1` against every `text_2`, or two lists of the same length zipped.
fn pairs<'a>(text_1: &'a [String], text_2: &'a [String]) -> Result<Vec<(&'a str, &'a str)>, ApiError> {
    if text_1.is_empty() {
        return Err(ApiError::invalid("text_1", "At least one text element must be given"));
    }
    if text_2.is_empty() {
        return Err(ApiError::invalid("text_2", "At least one text_pair element must be given"));
    }
    if text_1.len() > 1 && text_1.len() != text_2.len() {
        return Err(ApiError::bad_request("text_1 and text_2 lists must have the same length"));
    }
    Ok(text_2
        .iter()
        .enumerate()
        .map(|(i, b)| (text_1[if text_1.len() == 1 { 0 } else { i }].as_str(), b.as_str()))
        .collect())
}

async fn score(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ScoreRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if state.client.task() == ServeTask::Classify {
        return Err(unsupported(&state, "Score"));
    }
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let (t1, t2) = (req.text_1.into_vec(), req.text_2.into_vec());
    let pairs = pairs(&t1, &t2)?.into_iter().map(|(a, b)| (a.to_owned(), b.to_owned())).collect();
    let (scores, tokens) = state.score_pairs(pairs, truncate).await?;
    let data =
        scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
    Ok(Json(ListResponse {
        id: format!("score-{}", random_id()),
        object: "list",
        created: unix_now(),
        model: state.served.model_name().to_owned(),
        data,
        usage: Usage::new(tokens, 0),
    })
    .into_response())
}

async fn rerank(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: RerankRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if state.client.task() == ServeTask::Classify {
        return Err(unsupported(&state, "Rerank"));
    }
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents", "At least one document must be given"));
    }
    let top_n = match req.top_n {
        None | Some(0) => req.documents.len(),
        Some(n) if n < 0 => return Err(ApiError::invalid("top_n", format!("top_n must be at least 0, got {n}"))),
        Some(n) => (n as usize).min(req.documents.len()),
    };
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let pairs = req.documents.iter().map(|d| (req.query.clone(), d.clone())).collect();
    let (scores, tokens) = state.score_pairs(pairs, truncate).await?;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Best first; equal scores keep document order.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let with_docs = req.return_documents.unwrap_or(true);
    let results = order
        .into_iter()
        .take(top_n)
        .map(|i| RerankResult {
            index: i,
            document: with_docs.then(|| RerankDocument { text: req.documents[i].clone() }),
            relevance_score: scores[i],
        })
        .collect();
    Ok(Json(RerankResponse {
        id: format!("rerank-{}", random_id()),
        model: state.served.model_name().to_owned(),
        usage: RerankUsage { total_tokens: tokens },
        results,
    })
    .into_response())
}

async fn classify(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ClassificationRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if state.is_embedding() {
        return Err(unsupported(&state, "Classification"));
    }
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let inputs = state.encode_input_off(req.input, truncate, req.add_special_tokens.unwrap_or(true)).await?;
    let tokens = prompt_tokens(&inputs);
    let labels = &state.client.info().labels;
    let data = state
        .run(inputs)
        .await?
        .into_iter()
        .enumerate()
        .map(|(index, logits)| {
            let probs = classifier_activation(&logits);
            let best = probs.iter().enumerate().fold(0, |b, (i, p)| if *p > probs[b] { i } else { b });
            ClassificationData { index, label: labels.get(best).cloned(), num_classes: probs.len(), probs }
        })
        .collect();
    Ok(Json(ListResponse {
        id: format!("classify-{}", random_id()),
        object: "list",
        created: unix_now(),
        model: state.served.model_name().to_owned(),
        data,
        usage: Usage::new(tokens, 0),
    })
    .into_response())
}

impl Served for PoolingState {
    const GENERATES: bool = false;

    fn served(&self) -> &ServedModel {
        &self.served
    }

    fn in_flight(&self) -> usize {
        self.client.in_flight()
    }
}

pub fn pooling_router(state: Arc<PoolingState>) -> Router {
    let routes = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/score", post(score))
        .route("/v1/score", post(score))
        .route("/rerank", post(rerank))
        .route("/v1/rerank", post(rerank))
        .route("/v2/rerank", post(rerank))
        .route("/classify", post(classify))
        .route("/v1/classify", post(classify))
        .route_layer(middleware::from_fn_with_state(state.clone(), record_request))
        .route("/metrics", get(metrics_text));
    finish_router(with_common_routes(routes), state)
}

/// A pooling request's latency and, when it succeeded, its success: a pooling request ends
/// once, so its reason is `stop`, as in vLLM.
async fn record_request(State(state): State<Arc<PoolingState>>, request: Request, next: Next) -> Response {
    let arrival = Instant::now();
    let response = next.run(request).await;
    if response.status().is_success() {
        let finished = FinishedChoice {
            finish: Finish::Stop,
            arrival,
            scheduled: None,
            first_token: None,
            last_token: None,
            prompt_tokens: 0,
            generation_tokens: 0,
        };
        state.metrics.record_finished(finished);
    }
    response
}

/// The generation server's exposition, from the pooling engine's counters: sequences running
/// and queued, prompt tokens, request successes and latencies (no KV cache, no generated tokens).
async fn metrics_text(State(state): State<Arc<PoolingState>>) -> Response {
    let body = state.metrics.render(state.served.model_name(), &state.client.stats());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// Serves a pooling model until `shutdown` resolves, then gives in-flight requests up to
/// `grace` to finish.
pub async fn serve_pooling(
    listener: TcpListener,
    state: Arc<PoolingState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    serve_router(listener, pooling_router(state.clone()), state, shutdown, grace).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_take_every_openai_shape() {
        let shape = |j: &str| serde_json::from_str::<EmbeddingRequest>(j).unwrap().input;
        assert!(matches!(shape(r#"{"input":"hi"}"#), Input::Text(_)));
        assert!(matches!(shape(r#"{"input":["a","b"]}"#), Input::Texts(v) if v.len() == 2));
        assert!(matches!(shape(r#"{"input":[1,2,3]}"#), Input::Ids(v) if v == [1, 2, 3]));
        assert!(matches!(shape(r#"{"input":[[1],[2,3]]}"#), Input::IdLists(v) if v.len() == 2));
    }

    #[test]
    fn score_pairs_broadcast_one_query() {
        let one = vec!["q".to_string()];
        let docs = vec!["a".to_string(), "b".to_string()];
        assert_eq!(pairs(&one, &docs).unwrap(), vec![("q", "a"), ("q", "b")]);
        assert_eq!(pairs(&docs, &docs).unwrap(), vec![("a", "a"), ("b", "b")]);
        let three = vec!["x".to_string(), "y".to_string(), "z".to_string()];
        assert!(pairs(&three, &docs).is_err());
        assert!(pairs(&one, &[]).is_err());
    }
}
