//! A model that fails (an error, or a panic) fails the requests of that step with
//! `FinishReason::Error` and a message; the engine then serves on with a clean cache.

mod common;

use std::sync::Arc;

use common::*;
use ferrite_engine::{Engine, EngineError, FinishReason, PromptInput, LLM};
use ferrite_models::{load_model, CausalLM, ForwardInput, LoadOptions, ModelError, ModelInfo};
use ferrite_tensor::{DType, PagedKvLayer, Tensor, TensorError};
use ferrite_tokenizer::Tokenizer;

/// This bigram in a batch makes the model fail (a generated sequence will not contain it).
const POISON: [u32; 2] = [999, 999];

#[derive(Clone, Copy)]
enum Fault {
    Error,
    Panic,
}

struct Faulty {
    inner: Box<dyn CausalLM>,
    fault: Fault,
}

impl CausalLM for Faulty {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> ferrite_models::Result<Tensor> {
        if input.tokens.windows(2).any(|w| w == POISON) {
            match self.fault {
                Fault::Error => return Err(ModelError::Tensor(TensorError::Device("injected failure".into()))),
                Fault::Panic => panic!("injected panic"),
            }
        }
        self.inner.forward(input, kv)
    }
}

fn faulty_llm(fault: Fault) -> LLM {
    let dir = fixture("llama");
    let inner =
        load_model(&dir, &LoadOptions { dtype: DType::F32, progress: false, ..Default::default() }).unwrap().model;
    let tokenizer = Arc::new(Tokenizer::from_dir(&dir).unwrap());
    LLM::from_engine(Engine::new(Box::new(Faulty { inner, fault }), tokenizer, config()).unwrap())
}

fn fails_then_recovers(fault: Fault) {
    let llm = faulty_llm(fault);
    let client = llm.client();
    let good = battery("llama")[6].clone();
    let params = greedy(12);
    let reference = token_ids(&llm.generate(vec![good.clone()], &params).unwrap());

    let mut poisoned = POISON.to_vec();
    poisoned.extend(1..40);
    let mut stream =
        client.add_request("poisoned".into(), PromptInput::Tokens(poisoned.clone()), params.clone()).unwrap();
    let last = std::iter::from_fn(|| stream.blocking_next()).last().expect("a final output");
    assert!(last.finished);
    assert_eq!(last.outputs[0].finish_reason, Some(FinishReason::Error));
    assert!(last.error.as_deref().is_some_and(|e| e.contains("injected")), "{:?}", last.error);
    wait_idle(&client);

    let err = llm.generate(vec![PromptInput::Tokens(poisoned)], &params).unwrap_err();
    assert!(matches!(err, EngineError::Internal(_)), "{err}");
    // Served again, from a cache the failure did not leave stale entries in.
    assert_eq!(token_ids(&llm.generate(vec![good], &params).unwrap()), reference);
    wait_idle(&client);
}

#[test]
fn a_model_error_fails_the_step_and_the_engine_serves_on() {
    fails_then_recovers(Fault::Error);
}

#[test]
fn a_model_panic_fails_the_step_and_the_engine_serves_on() {
    fails_then_recovers(Fault::Panic);
}
