//! How deeply a YAML document nests, measured before serde_norway loads it.
//!
//! serde_norway refuses a document nested deeper than 128 collections, but only after libyaml
//! has produced every event of it, and libyaml's scanner does work in proportion to the flow
//! depth for every token it reads: 300 KB of `[` took five minutes of CPU before the refusal.
//! Here the same parser (`unsafe-libyaml-norway`, the one serde_norway drives, so both see the
//! same structure) is driven event by event and stopped at the first collection past the
//! limit, a few hundred tokens in.
//!
//! The same pass counts the items of the top-level lists that become staged entries
//! (`write_files`, `users`, `groups`; `entries`), so data with too many is refused before
//! serde_norway loads its events and values, in memory that does not grow with the document.
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

/// What one pass over a document's events found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Scan {
    /// The first collection nested deeper than [`MAX_YAML_DEPTH`] (the scan stops there).
    pub too_deep: Option<TooDeep>,
    /// Items of the top-level lists named in `entries::CLOUD_CONFIG_LISTS`, up to where it stopped.
    pub entries: usize,
}

/// Where the scan is: in a mapping (waiting for a key, or for the value of `counted` key), or
/// in a sequence (whose items count when it is a counted list).
enum Frame {
    Map { want_key: bool, counted: bool },
    Seq { counted: bool },
}

/// The first collection of `text` nested deeper than [`MAX_YAML_DEPTH`], if any. A syntax
/// error ends the scan without a finding: serde_norway reports it, with its own message.
#[cfg(test)]
pub(crate) fn too_deep(text: &str) -> Option<TooDeep> {
    scan(text).too_deep
}

/// Scans `text`'s events: its depth and its entries. A syntax error ends the scan with what
/// was found so far: serde_norway reports the error, with its own message.
pub(crate) fn scan(text: &str) -> Scan {
    let mut boxed = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
    let p = boxed.as_mut_ptr();
    // SAFETY: `p` is a heap allocation that does not move while the parser lives; on success
    // `Parser` deletes it exactly once. `text` outlives the parser (it is dropped here).
    let mut parser = unsafe {
        if unsafe_sys::yaml_parser_initialize(p).fail {
            // Out of memory for the parser's buffers: serde_norway will fail the same way.
            return Scan::default();
        }
        unsafe_sys::yaml_parser_set_encoding(p, unsafe_sys::YAML_UTF8_ENCODING);
        unsafe_sys::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
        Parser(boxed)
    };
    let mut found = Scan::default();
    let mut frames: Vec<Frame> = Vec::new();
    loop {
        let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
        let e = event.as_mut_ptr();
        // SAFETY: the parser is initialized; `yaml_parser_parse` fills `event` when it succeeds
        // and the event is deleted once, after its type, mark and (for a top-level key) scalar
        // value are copied out; libyaml's scalar value is `length` valid bytes.
        let (kind, mark, top_key) = unsafe {
            if unsafe_sys::yaml_parser_parse(parser.0.as_mut_ptr(), e).fail {
                return found;
            }
            let kind = (*e).type_;
            let top_key = match frames.as_slice() {
                [Frame::Map { want_key: true, .. }] if kind == unsafe_sys::YAML_SCALAR_EVENT => {
                    let s = (*e).data.scalar;
                    let value = std::slice::from_raw_parts(s.value, s.length as usize);
                    Some(
                        super::entries::CLOUD_CONFIG_LISTS
                            .iter()
                            .any(|k| k.as_bytes() == value),
                    )
                }
                _ => None,
            };
            let seen = (kind, (*e).start_mark, top_key);
            unsafe_sys::yaml_event_delete(e);
            seen
        };
        let node = matches!(
            kind,
            unsafe_sys::YAML_SCALAR_EVENT
                | unsafe_sys::YAML_ALIAS_EVENT
                | unsafe_sys::YAML_SEQUENCE_START_EVENT
                | unsafe_sys::YAML_MAPPING_START_EVENT
        );
        // A node fills its parent's slot: a mapping's key or value, or a sequence's item.
        let mut counted_list = false;
        if node {
            match frames.last_mut() {
                Some(Frame::Map { want_key, counted }) => {
                    if *want_key {
                        *counted = top_key.unwrap_or(false);
                    } else {
                        counted_list = *counted && kind == unsafe_sys::YAML_SEQUENCE_START_EVENT;
                    }
                    *want_key = !*want_key;
                }
                Some(Frame::Seq { counted: true }) => found.entries += 1,
                _ => {}
            }
        }
        match kind {
            unsafe_sys::YAML_SEQUENCE_START_EVENT | unsafe_sys::YAML_MAPPING_START_EVENT => {
                if frames.len() >= MAX_YAML_DEPTH {
                    found.too_deep = Some(TooDeep {
                        line: mark.line as usize + 1,
                        column: mark.column as usize + 1,
                    });
                    return found;
                }
                frames.push(if kind == unsafe_sys::YAML_SEQUENCE_START_EVENT {
                    Frame::Seq {
                        counted: counted_list && frames.len() == 1,
                    }
                } else {
                    Frame::Map {
                        want_key: true,
                        counted: false,
                    }
                });
            }
            unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => {
                frames.pop();
            }
            unsafe_sys::YAML_STREAM_END_EVENT => return found,
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
    fn top_level_lists_are_counted() {
        let text = "write_files:\n- path: /etc/a\n  content: x\n- {path: /etc/b}\nusers: [a, {name: b, groups: [x, y]}]\nruncmd: [a, b, c]\nother:\n  write_files: [x, y]\ngroups:\n- g\n";
        assert_eq!(scan(text).entries, 2 + 2 + 1);
        assert_eq!(scan("write_files: []\n").entries, 0);
        assert_eq!(scan("[write_files, users]\n").entries, 0);
    }

    #[test]
    fn syntax_errors_are_left_to_serde_norway() {
        assert_eq!(too_deep("a: [\n"), None);
    }
}
