//! gpt-oss's harmony format, read from text. An output is a run of messages,
//! `<|start|>ROLE HEADER<|message|>TEXT<|end|>`, where the header names a channel
//! (`<|channel|>analysis`), maybe a recipient (`to=functions.get_weather`) and a content type
//! (`<|constrain|>json`). The prompt ends in `<|start|>assistant`, so the first header of an
//! output has no `<|start|>` and its role is implied. `<|return|>` and `<|call|>` end a message
//! and the generation.
//!
//! [`Reader`] cuts a growing output into headers and message text the way harmony's
//! `StreamableParser` cuts tokens; the reasoning parser (`openai_gptoss`) and the tool parser
//! (`openai`) each decide what a message means from its header.

use crate::reasoning::{MarkerLexer, Piece};

pub(crate) const START: &str = "<|start|>";
pub(crate) const CHANNEL: &str = "<|channel|>";
pub(crate) const MESSAGE: &str = "<|message|>";
pub(crate) const CONSTRAIN: &str = "<|constrain|>";
/// What ends a message: `<|return|>` and `<|call|>` also stop the generation.
pub(crate) const ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];
const MARKERS: &[&str] = &[START, CHANNEL, MESSAGE, ENDS[0], ENDS[1], ENDS[2]];
/// The roles harmony knows; a header that opens with another word is a tool's message.
const ROLES: [&str; 5] = ["user", "assistant", "system", "developer", "tool"];

/// The channel a header names: what follows `<|channel|>` up to a space or `<`.
pub(crate) fn channel(header: &str) -> Option<&str> {
    channel_at(header).map(|(_, name)| name)
}

/// Where a header's `<|channel|>` is, and the channel it names.
fn channel_at(header: &str) -> Option<(usize, &str)> {
    let at = header.find(CHANNEL)?;
    let after = &header[at + CHANNEL.len()..];
    Some((at, &after[..after.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(after.len())]))
}

/// A message header as harmony parses it.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Header {
    pub(crate) channel: Option<String>,
    pub(crate) recipient: Option<String>,
    pub(crate) content_type: Option<String>,
}

/// Harmony's `parse_header_from_tokens` on a header's text. `after_start`: the header follows a
/// `<|start|>` and so begins with its role; otherwise the role is the assistant, as vLLM tells
/// the parser. `None` where harmony refuses the header (vLLM then fails the request).
pub(crate) fn parse_header(text: &str, after_start: bool) -> Option<Header> {
    let mut rest = text.to_owned();
    let mut header = Header::default();
    if let Some((at, name)) = channel_at(text) {
        if name.is_empty() {
            return None;
        }
        header.channel = Some(name.to_owned());
        rest = format!("{}{}", &text[..at], &text[at + CHANNEL.len() + name.len()..]);
    }
    // `to=f<|constrain|>json` is two parts.
    let rest = rest.trim().replace(CONSTRAIN, &format!(" {CONSTRAIN}"));
    let mut parts: Vec<&str> = rest.split_ascii_whitespace().collect();
    let role = if after_start {
        let first = *parts.first()?;
        if ROLES.contains(&first) {
            first
        } else if parts.len() > 1 || first.starts_with("to=") {
            parts.remove(0);
            "tool"
        } else {
            return None;
        }
    } else {
        "assistant"
    };
    if parts.first() == Some(&role) {
        parts.remove(0);
    }
    // What remains is a recipient (`to=NAME`, or a lone word), or a recipient and a content type.
    match parts[..] {
        [] => {}
        [recipient] => header.recipient = Some(recipient.trim_start_matches("to=").to_owned()),
        [recipient, content_type] if !content_type.starts_with("to=") => {
            header.recipient = Some(recipient.strip_prefix("to=").unwrap_or(recipient).to_owned());
            header.content_type = Some(content_type.to_owned());
        }
        _ => return None,
    }
    Some(header)
}

/// What the messages say, in output order.
#[derive(Debug, PartialEq)]
pub(crate) enum Event {
    /// A message's header is complete: its text, and whether it followed `<|start|>`.
    Header { text: String, after_start: bool },
    /// More of the current message's text (markers other than the end markers are text here).
    Text(String),
    /// The message ended: at an end marker, or where the output did.
    End,
    /// The output ended inside a header: all text since the last message ended.
    CutHeader(String),
}

#[derive(Debug)]
enum Phase {
    /// Reading a header. `raw` is all text since the last message ended.
    Header {
        raw: String,
        header: String,
        after_start: bool,
    },
    Body,
}

impl Phase {
    fn between_messages() -> Phase {
        Phase::Header { raw: String::new(), header: String::new(), after_start: false }
    }
}

/// Reads an output as it grows, holding back a tail that may still become a marker.
#[derive(Debug)]
pub(crate) struct Reader {
    lexer: MarkerLexer,
    phase: Phase,
}

impl Default for Reader {
    fn default() -> Self {
        Reader { lexer: MarkerLexer::new(MARKERS), phase: Phase::between_messages() }
    }
}

impl Reader {
    pub(crate) fn feed(&mut self, delta: &str) -> Vec<Event> {
        let pieces = self.lexer.feed(delta);
        self.route(pieces)
    }

    /// The end of the output: the held tail, then the end of a message cut off in its body, or
    /// the text of a header cut off.
    pub(crate) fn finish(&mut self) -> Vec<Event> {
        let pieces = self.lexer.finish();
        let mut events = self.route(pieces);
        match std::mem::replace(&mut self.phase, Phase::between_messages()) {
            Phase::Body => events.push(Event::End),
            Phase::Header { raw, .. } if !raw.is_empty() => events.push(Event::CutHeader(raw)),
            Phase::Header { .. } => {}
        }
        events
    }

    fn route(&mut self, pieces: Vec<Piece>) -> Vec<Event> {
        let mut events = Vec::new();
        for piece in pieces {
            match (&mut self.phase, piece) {
                (Phase::Header { header, after_start, .. }, Piece::Marker(MESSAGE)) => {
                    events.push(Event::Header { text: std::mem::take(header), after_start: *after_start });
                    self.phase = Phase::Body;
                }
                // Harmony's parser expects `<|start|>` between messages; text before it is not
                // part of the next header.
                (Phase::Header { raw, header, after_start }, Piece::Marker(START)) => {
                    raw.push_str(START);
                    header.clear();
                    *after_start = true;
                }
                (Phase::Header { raw, header, .. }, Piece::Marker(text)) => {
                    raw.push_str(text);
                    header.push_str(text);
                }
                (Phase::Header { raw, header, .. }, Piece::Text(text)) => {
                    raw.push_str(&text);
                    header.push_str(&text);
                }
                (Phase::Body, Piece::Marker(end)) if ENDS.contains(&end) => {
                    events.push(Event::End);
                    self.phase = Phase::between_messages();
                }
                (Phase::Body, Piece::Marker(text)) => events.push(Event::Text(text.to_owned())),
                (Phase::Body, Piece::Text(text)) => events.push(Event::Text(text)),
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(channel: Option<&str>, recipient: Option<&str>, content_type: Option<&str>) -> Option<Header> {
        Some(Header {
            channel: channel.map(str::to_owned),
            recipient: recipient.map(str::to_owned),
            content_type: content_type.map(str::to_owned),
        })
    }

    #[test]
    fn headers_parse_as_harmony_parses_them() {
        let cases = [
            ("<|channel|>analysis", false, header(Some("analysis"), None, None)),
            ("assistant<|channel|>final", true, header(Some("final"), None, None)),
            (
                "<|channel|>commentary to=functions.get_weather <|constrain|>json",
                false,
                header(Some("commentary"), Some("functions.get_weather"), Some("<|constrain|>json")),
            ),
            (
                "assistant to=functions.x<|channel|>commentary json",
                true,
                header(Some("commentary"), Some("functions.x"), Some("json")),
            ),
            (
                "<|channel|>commentary to=functions.f<|constrain|>json",
                false,
                header(Some("commentary"), Some("functions.f"), Some("<|constrain|>json")),
            ),
            ("assistant<|channel|>commentary to=to=f", true, header(Some("commentary"), Some("f"), None)),
            // A lone word is a recipient, even without `to=`.
            ("<|channel|>commentary json", false, header(Some("commentary"), Some("json"), None)),
            ("<|channel|>commentary a json", false, header(Some("commentary"), Some("a"), Some("json"))),
            // A tool's message: the name stands where the role would.
            (
                "functions.get_weather to=assistant<|channel|>commentary",
                true,
                header(Some("commentary"), Some("assistant"), None),
            ),
            ("user", true, header(None, None, None)),
            ("", false, header(None, None, None)),
            // Refused: no channel name, an unknown role alone, too many parts, no role.
            ("<|channel|> final", false, None),
            ("robot<|channel|>final", true, None),
            ("<|channel|>commentary a b c", false, None),
            ("<|channel|>commentary a to=functions.f", false, None),
            ("", true, None),
        ];
        for (text, after_start, expected) in cases {
            assert_eq!(parse_header(text, after_start), expected, "{text:?}");
        }
    }

    #[test]
    fn reader_cuts_messages_split_anywhere() {
        let text = "<|channel|>analysis<|message|>a<|start|>b<|end|>junk<|start|>assistant<|channel|>final<|message|>c";
        let mut whole = Reader::default();
        let mut expected = whole.feed(text);
        expected.extend(whole.finish());
        assert_eq!(
            expected,
            [
                Event::Header { text: "<|channel|>analysis".into(), after_start: false },
                Event::Text("a".into()),
                Event::Text("<|start|>".into()),
                Event::Text("b".into()),
                Event::End,
                Event::Header { text: "assistant<|channel|>final".into(), after_start: true },
                Event::Text("c".into()),
                Event::End,
            ]
        );
        let mut pieces = Reader::default();
        let mut events = Vec::new();
        for c in text.chars() {
            events.extend(pieces.feed(&c.to_string()));
        }
        events.extend(pieces.finish());
        let joined = |events: &[Event]| {
            events
                .iter()
                .map(|e| match e {
                    Event::Text(t) => t.clone(),
                    other => format!("|{other:?}|"),
                })
                .collect::<String>()
        };
        assert_eq!(joined(&events), joined(&expected));
    }

    #[test]
    fn an_output_cut_in_a_header_comes_back_whole() {
        let mut reader = Reader::default();
        let mut events = reader.feed("<|channel|>final<|message|>x<|end|>ab<|start|>assistant<|chan");
        events.extend(reader.finish());
        assert_eq!(events.last(), Some(&Event::CutHeader("ab<|start|>assistant<|chan".into())));
    }
}
