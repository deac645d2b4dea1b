//! How deeply a YAML document nests, measured before serde_norway loads it.
//!
//! serde_norway refuses a document nested deeper than 128 collections, but only after libyaml
//! has produced every event of it, and libyaml's scanner does work in proportion to the flow
//! depth for every token it reads: 300 KB of `[` took five minutes of CPU before the refusal.
//! Here the same parser (`unsafe-libyaml-norway`, the one serde_norway drives, so both see the
//! same structure) is driven event by event and stopped at the first collection past the
//! limit, a few hundred tokens in.
//!
//! serde_norway has no event API, so this module calls libyaml's C-style functions itself: the
//! only unsafe code in the crate.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use unsafe_libyaml_norway as unsafe_sys;

/// The deepest nesting of collections (sequences and mappings) accepted: serde_norway's own
/// recursion limit, so a document this check passes is never refused for its depth later.
pub const MAX_YAML_DEPTH: usize = 128;

/// Where a collection nests deeper than [`MAX_YAML_DEPTH`]: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep {
    pub line: usize,
    pub column: usize,
}

/// Owns an initialized libyaml parser on the heap (it points at itself, so it must not move).
struct Parser(Box<MaybeUninit<unsafe_sys::yaml_parser_t>>);

impl Drop for Parser {
    fn drop(&mut self) {
        // SAFETY: only built by `too_deep` after `yaml_parser_initialize` succeeded.
        unsafe { unsafe_sys::yaml_parser_delete(self.0.as_mut_ptr()) }
    }
}

/// The first collection of `text` nested deeper than [`MAX_YAML_DEPTH`], if any. A syntax
/// error ends the scan without a finding: serde_norway reports it, with its own message.
pub(crate) fn too_deep(text: &str) -> Option<TooDeep> {
    let mut boxed = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
    let p = boxed.as_mut_ptr();
    // SAFETY: `p` is a heap allocation that does not move while the parser lives; on success
    // `Parser` deletes it exactly once. `text` outlives the parser (it is dropped here).
    let mut parser = unsafe {
        if unsafe_sys::yaml_parser_initialize(p).fail {
            // Out of memory for the parser's buffers: serde_norway will fail the same way.
            return None;
        }
        unsafe_sys::yaml_parser_set_encoding(p, unsafe_sys::YAML_UTF8_ENCODING);
        unsafe_sys::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
        Parser(boxed)
    };
    let mut depth = 0usize;
    loop {
        let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
        let e = event.as_mut_ptr();
        // SAFETY: the parser is initialized; `yaml_parser_parse` fills `event` when it succeeds
        // and the event is deleted once, after its type and mark are copied out.
        let (kind, mark) = unsafe {
            if unsafe_sys::yaml_parser_parse(parser.0.as_mut_ptr(), e).fail {
                return None;
            }
            let seen = ((*e).type_, (*e).start_mark);
            unsafe_sys::yaml_event_delete(e);
            seen
        };
        match kind {
            unsafe_sys::YAML_SEQUENCE_START_EVENT | unsafe_sys::YAML_MAPPING_START_EVENT => {
                depth += 1;
                if depth > MAX_YAML_DEPTH {
                    return Some(TooDeep {
                        line: mark.line as usize + 1,
                        column: mark.column as usize + 1,
                    });
                }
            }
            unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => {
                depth = depth.saturating_sub(1);
            }
            unsafe_sys::YAML_STREAM_END_EVENT => return None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("a: {}{}\n", "[".repeat(depth - 1), "]".repeat(depth - 1))
    }

    #[test]
    fn the_limit_is_serde_norways() {
        // The top-level mapping counts: `a: [[...]]` with 127 brackets nests 128 deep.
        assert_eq!(too_deep(&nested(MAX_YAML_DEPTH)), None);
        serde_norway::from_str::<serde_norway::Value>(&nested(MAX_YAML_DEPTH)).unwrap();
        assert_eq!(
            too_deep(&nested(MAX_YAML_DEPTH + 1)),
            Some(TooDeep {
                line: 1,
                column: MAX_YAML_DEPTH + 3
            })
        );
        let e = serde_norway::from_str::<serde_norway::Value>(&nested(MAX_YAML_DEPTH + 1));
        assert!(e.unwrap_err().to_string().contains("recursion limit"));
    }

    #[test]
    fn block_nesting_counts_too() {
        let mut text = String::new();
        for i in 0..MAX_YAML_DEPTH + 1 {
            text.push_str(&format!("{}k:\n", " ".repeat(i)));
        }
        text.push_str(&format!("{}x\n", " ".repeat(MAX_YAML_DEPTH + 1)));
        assert!(too_deep(&text).is_some());
        assert_eq!(too_deep("a:\n  b:\n    c: [1, {d: 2}]\n"), None);
    }

    #[test]
    fn syntax_errors_are_left_to_serde_norway() {
        assert_eq!(too_deep("a: [\n"), None);
    }
}
