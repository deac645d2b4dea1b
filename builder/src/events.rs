//! `ingot build --json`'s progress for CI: one JSON object a line on stderr (JSON Lines), each
//! with `event` and `t` (seconds since the build started), while the result stays one object on
//! stdout. Events: `note` (a line the text output prints), `phase` and `phaseDone` (a layer's
//! phase: the Debian tree's downloads and mmdebstrap, then ext4, verity and zstd), `tree` (a
//! Debian-made layer reused or built, and why), `lockChange` (a package or input moved in
//! stack.lock), `error`. tracing's warnings are JSON lines too under `--json` (with `level`).

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Map, Value};

/// Where events go: nowhere, or stderr as JSON Lines. Cheap to clone; clones share the clock.
#[derive(Debug, Clone, Default)]
pub struct Events {
    started: Option<Arc<Instant>>,
    /// The lines written, instead of stderr (the unit tests read them).
    #[cfg(test)]
    sink: Option<Arc<Mutex<Vec<String>>>>,
}

impl Events {
    /// Events on stderr, timed from now.
    pub fn json() -> Self {
        Self {
            started: Some(Arc::new(Instant::now())),
            #[cfg(test)]
            sink: None,
        }
    }

    /// No events (the text output).
    pub fn off() -> Self {
        Self::default()
    }

    /// Whether events are written.
    pub fn on(&self) -> bool {
        self.started.is_some()
    }

    /// The line of `event` with `fields` (an object; anything else is left out), or `None` when
    /// off.
    pub fn line(&self, event: &str, fields: Value) -> Option<String> {
        let started = self.started.as_ref()?;
        let mut obj = Map::new();
        obj.insert("event".into(), event.into());
        let t = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        obj.insert("t".into(), t.into());
        if let Value::Object(more) = fields {
            obj.extend(more);
        }
        Some(Value::Object(obj).to_string())
    }

    /// Writes `event` with `fields` as one line on stderr, when on. A line is written whole
    /// (stderr locked), so events of layers built in parallel do not interleave.
    pub fn emit(&self, event: &str, fields: Value) {
        if let Some(mut line) = self.line(event, fields) {
            #[cfg(test)]
            if let Some(sink) = &self.sink {
                sink.lock().unwrap().push(line);
                return;
            }
            line.push('\n');
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }

    /// A `note` event with `text`, or the text on stderr when off.
    pub fn note(&self, text: &str) {
        if self.on() {
            self.emit("note", serde_json::json!({ "text": text }));
        } else {
            eprintln!("{text}");
        }
    }
}

/// One layer's phases as events: each [`PhaseLog::start`] ends the phase before it with a
/// `phaseDone` that says how long it took.
#[derive(Debug)]
pub struct PhaseLog {
    events: Events,
    layer: String,
    current: Mutex<Option<(String, Instant)>>,
}

impl PhaseLog {
    /// The phases of `layer`.
    pub fn new(events: &Events, layer: &str) -> Self {
        Self {
            events: events.clone(),
            layer: layer.to_owned(),
            current: Mutex::new(None),
        }
    }

    /// `what` starts (and the phase before it is done).
    pub fn start(&self, what: &str) {
        if !self.events.on() {
            return;
        }
        self.done();
        self.events.emit(
            "phase",
            serde_json::json!({ "layer": self.layer, "phase": what }),
        );
        *self.lock() = Some((what.to_owned(), Instant::now()));
    }

    /// The current phase is done.
    pub fn done(&self) {
        if let Some((what, since)) = self.lock().take() {
            let seconds = (since.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
            self.events.emit(
                "phaseDone",
                serde_json::json!({ "layer": self.layer, "phase": what, "seconds": seconds }),
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(String, Instant)>> {
        // A panic elsewhere leaves the slot usable: it holds only a name and a time.
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_event_and_time() {
        let e = Events::json();
        let line = e
            .line(
                "phase",
                serde_json::json!({"layer": "base", "phase": "ext4"}),
            )
            .unwrap();
        assert!(!line.contains('\n'));
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], "phase");
        assert_eq!(v["layer"], "base");
        assert_eq!(v["phase"], "ext4");
        assert!(v["t"].as_f64().unwrap() >= 0.0);
        assert!(Events::off().line("phase", Value::Null).is_none());
        assert!(!Events::off().on());
    }

    #[test]
    fn each_phase_ends_the_one_before_with_its_time() {
        let sink = Arc::new(Mutex::new(Vec::new()));
        let e = Events {
            sink: Some(sink.clone()),
            ..Events::json()
        };
        let log = PhaseLog::new(&e, "base");
        log.start("ext4");
        log.start("zstd");
        log.done();
        log.done();
        let lines: Vec<Value> = sink
            .lock()
            .unwrap()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let seen: Vec<(String, String)> = lines
            .iter()
            .map(|v| {
                assert_eq!(v["layer"], "base");
                (
                    v["event"].as_str().unwrap().to_owned(),
                    v["phase"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let want = [
            ("phase", "ext4"),
            ("phaseDone", "ext4"),
            ("phase", "zstd"),
            ("phaseDone", "zstd"),
        ];
        assert_eq!(
            seen,
            want.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec()
        );
        assert!(lines[1]["seconds"].as_f64().unwrap() >= 0.0);
        let quiet = PhaseLog::new(&Events::off(), "base");
        quiet.start("ext4");
        quiet.done();
    }
}
