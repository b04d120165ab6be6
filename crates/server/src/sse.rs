//! Server-sent events as OpenAI streams them: one JSON object per `data:` line, then
//! `data: [DONE]`.

use axum::response::sse::Event;

pub fn json_event<T: serde::Serialize>(value: &T) -> Event {
    json_event_raw(serde_json::to_string(value).unwrap_or_default())
}

pub fn json_event_raw(json: String) -> Event {
    Event::default().data(json)
}

pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}
