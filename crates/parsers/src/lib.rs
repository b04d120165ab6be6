//! What a model's output text means beyond its text, as vLLM's OpenAI server reads it: tool
//! calls (`--tool-call-parser NAME`, [`tool`]) and a reasoning section (`--reasoning-parser
//! NAME`, [`reasoning`]), from a whole output or from a stream of deltas.
//!
//! Parsers work on text. The server decodes tool-call outputs with special tokens kept (as vLLM's
//! parsers' `adjust_request` asks), so markers that are special tokens (`<tool_call>`,
//! `<|python_tag|>`, `<think>`) appear in the text the parsers see.

mod harmony;
pub mod reasoning;
pub mod tool;
