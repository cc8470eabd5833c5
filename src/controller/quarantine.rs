//! Objects HAProxy refuses, held out of every render until they change.
//!
//! When a pod refuses the current render, the validator is asked to find the objects behind it
//! (`admission::culprits`), on a task of its own: the controller loop goes on. Each culprit is
//! then left out of every render, as a value haptic refuses itself would be (an Event on the
//! object, naming the field, and its Ingress status), while its content stays as it was; once
//! its owner changes it, it is rendered again (and searched again, if HAProxy still refuses it).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::admission::Validator;
use crate::admission::culprits::{self, Outcome};
use crate::config::HAProxyTemplateConfigSpec;
use crate::files::{Checksum, FileSet};
use crate::render::{PodInfo, RenderError, Renderer};
use crate::store::{ObjectRef, Stores};

/// The longest HAProxy refusal kept in an Event, in characters.
const REFUSAL_LIMIT: usize = 400;

/// One object held out, as it was when HAProxy refused it.
#[derive(Clone, Debug)]
struct Held {
    /// Its content then: a change releases it.
    content: Checksum,
    /// The refusal, as the render reports objects it leaves out.
    error: RenderError,
}

/// What a finished search hands back to the loop.
pub(crate) struct Finished {
    /// The configuration version searched.
    generation: i64,
    /// The culprits, as they were when found.
    culprits: Vec<(ObjectRef, Checksum, RenderError)>,
}

/// The held objects, and the search that may be running.
pub(crate) struct Quarantine {
    held: HashMap<ObjectRef, Held>,
    /// The render last searched (every file's checksum): searched once.
    searched: Option<Vec<Checksum>>,
    running: Option<crate::tasks::OwnedTask>,
    results: mpsc::Sender<Finished>,
    tasks: crate::tasks::TaskTree,
}

impl Quarantine {
    /// An empty quarantine whose searches report on `results`.
    pub(crate) fn new(tasks: crate::tasks::TaskTree, results: mpsc::Sender<Finished>) -> Self {
        Self { held: HashMap::new(), searched: None, running: None, results, tasks }
    }

    /// `stores` without the held objects that are still as they were refused, and the refusal
    /// of each; an object changed or deleted since is released.
    pub(crate) fn apply(&mut self, stores: &Stores) -> (Stores, Vec<RenderError>) {
        self.held.retain(|object, held| {
            let same = crate::store::find(stores, object).is_some_and(|stored| stored.content == held.content);
            if !same {
                info!(%object, "an object HAProxy refused changed: it is rendered again");
            }
            same
        });
        if self.held.is_empty() {
            return (stores.clone(), Vec::new());
        }
        let objects: Vec<ObjectRef> = self.held.keys().cloned().collect();
        // In a stable order: the refusals become Events and status, compared render to render.
        let mut errors: Vec<RenderError> = self.held.values().map(|held| held.error.clone()).collect();
        errors.sort_by_key(ToString::to_string);
        (crate::store::without(stores, &objects), errors)
    }

    /// Whether a search for the culprits of `files` would start: none runs, and these files
    /// were not searched already.
    pub(crate) fn would_search(&self, files: &FileSet) -> bool {
        self.would_search_for(&fingerprint(files))
    }

    /// [`Self::would_search`] for files of this fingerprint.
    fn would_search_for(&self, fingerprint: &[Checksum]) -> bool {
        self.running.as_ref().is_none_or(|task| task.is_finished()) && self.searched.as_deref() != Some(fingerprint)
    }

    /// Starts a search for the culprits of `files`, unless `would_search` says otherwise.
    pub(crate) fn search(&mut self, job: SearchJob, files: &FileSet) {
        let fingerprint = fingerprint(files);
        if !self.would_search_for(&fingerprint) {
            return;
        }
        self.searched = Some(fingerprint);
        let results = self.results.clone();
        self.running = Some(self.tasks.spawn("culprit search", async move {
            let generation = job.generation;
            let culprits = job.run().await;
            if !culprits.is_empty() {
                let _ = results.send(Finished { generation, culprits }).await;
            }
        }));
    }

    /// Holds the culprits a search found for configuration version `generation`; whether any is
    /// new (a render is then owed).
    pub(crate) fn hold(&mut self, generation: i64, finished: Finished) -> bool {
        if finished.generation != generation {
            return false;
        }
        let mut new = false;
        for (object, content, error) in finished.culprits {
            warn!(%object, %error, "HAProxy refuses an object: it is left out until it changes");
            new |= self.held.insert(object, Held { content, error }).is_none();
        }
        new
    }
}

/// Every file's checksum, in order: a render told apart from another.
fn fingerprint(files: &FileSet) -> Vec<Checksum> {
    files.entries().map(|(_, file)| file.checksum).collect()
}

/// Everything a search needs, taken from the loop at its start.
pub(crate) struct SearchJob {
    /// The configuration version.
    pub(crate) generation: i64,
    /// Its spec.
    pub(crate) spec: HAProxyTemplateConfigSpec,
    /// Its templates.
    pub(crate) renderer: Arc<Renderer>,
    /// The stores as rendered (held objects already left out).
    pub(crate) stores: Stores,
    /// The HAProxy pods.
    pub(crate) pods: Vec<PodInfo>,
    /// Who checks candidate renders.
    pub(crate) validator: Arc<dyn Validator>,
    /// At most this many culprits.
    pub(crate) max_culprits: usize,
}

impl SearchJob {
    async fn run(self) -> Vec<(ObjectRef, Checksum, RenderError)> {
        let started = std::time::Instant::now();
        let outcome = culprits::find(
            &self.renderer,
            &self.spec,
            &self.stores,
            &self.pods,
            self.validator.as_ref(),
            self.max_culprits.max(1),
        )
        .await;
        let seconds = started.elapsed().as_secs_f64();
        let found = match outcome {
            Outcome::Found(found) => found,
            Outcome::Innocent => {
                info!(seconds, "the validator accepts the current render: no object to leave out");
                return Vec::new();
            }
            Outcome::NotAnObject(refusal) => {
                warn!(%refusal, seconds, "HAProxy refuses the render even without any object: the templates are at fault");
                return Vec::new();
            }
            Outcome::Stopped(why) => {
                warn!(%why, seconds, "the search for the objects HAProxy refuses stopped");
                return Vec::new();
            }
        };
        info!(culprits = found.len(), seconds, "found the objects HAProxy refuses");
        found
            .into_iter()
            .filter_map(|culprit| {
                let stored = crate::store::find(&self.stores, &culprit.suspect)?;
                let error = refusal_error(&culprit.suspect, &stored.value, &culprit.refusal);
                Some((culprit.suspect, stored.content, error))
            })
            .collect()
    }
}

/// The refusal of one culprit, as a render error blaming it: the file and line HAProxy names,
/// the field of the object that holds a value HAProxy quoted, and HAProxy's alerts.
fn refusal_error(object: &ObjectRef, value: &minijinja::Value, refusal: &str) -> RenderError {
    let alerts: Vec<&str> = refusal.lines().filter(|line| line.contains("[ALERT]")).collect();
    let mut detail: String = if alerts.is_empty() { refusal.to_owned() } else { alerts.join(" ") };
    detail = detail.split_whitespace().collect::<Vec<_>>().join(" ");
    if detail.chars().count() > REFUSAL_LIMIT {
        detail = detail.chars().take(REFUSAL_LIMIT).chain("…".chars()).collect();
    }
    let (template, line) = named_line(refusal).unwrap_or_else(|| (crate::render::HAPROXY_CFG.to_owned(), None));
    let needles = quoted(refusal);
    let field = crate::render::field_holding_any(value, &needles);
    RenderError::Render {
        template,
        line,
        object: Some(Box::new(object.clone())),
        field,
        refused_value: true,
        detail: format!("HAProxy refuses it, so it is left out until it changes: {detail}"),
    }
}

/// The file name and line of HAProxy's first `[path:line]` (`parsing [/etc/haproxy/haproxy.cfg:57]`).
fn named_line(refusal: &str) -> Option<(String, Option<usize>)> {
    refusal.split('[').skip(1).find_map(|piece| {
        let inner = &piece[..piece.find(']')?];
        let (path, line) = inner.rsplit_once(':')?;
        let line: usize = line.trim().parse().ok()?;
        let file = path.rsplit('/').next().filter(|f| !f.is_empty())?;
        Some((file.to_owned(), Some(line)))
    })
}

/// The values HAProxy quoted ('…'), longest first; file paths also by their file name's stem
/// parts, since a file is named after what it holds.
fn quoted(refusal: &str) -> Vec<String> {
    let mut needles: Vec<String> = Vec::new();
    for piece in quoted_pieces(refusal) {
        if piece.len() >= 3 {
            needles.push(piece.to_owned());
            if let Some(file) = piece.strip_suffix(".pem").map(|p| p.rsplit('/').next().unwrap_or(p)) {
                needles.extend(file.split('_').filter(|part| part.len() >= 3).map(str::to_owned));
            }
        }
    }
    needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
    needles.dedup();
    needles
}

/// The pieces between quotes: a quote opens after a non-alphanumeric character and closes
/// before one, so the apostrophe of "Couldn't" neither opens nor closes anything.
fn quoted_pieces(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let word = |at: Option<&u8>| at.is_some_and(u8::is_ascii_alphanumeric);
    let mut pieces = Vec::new();
    let mut open: Option<usize> = None;
    for (at, byte) in bytes.iter().enumerate() {
        if *byte != b'\'' {
            continue;
        }
        let (before, after) = (at.checked_sub(1).and_then(|b| bytes.get(b)), bytes.get(at + 1));
        match open {
            Some(start) if !word(after) => {
                pieces.push(&text[start..at]);
                open = None;
            }
            None if !word(before) => open = Some(at + 1),
            _ => {}
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn haproxys_file_and_line_are_read() {
        let refusal = "[ALERT]    (12) : config : parsing [/etc/haproxy/haproxy.cfg:57] : 'http-request' : bad";
        assert_eq!(named_line(refusal), Some(("haproxy.cfg".into(), Some(57))));
        assert_eq!(named_line("no line here [ALERT]"), None);
        assert_eq!(named_line("config Parsing [haproxy.cfg:10]: failed"), Some(("haproxy.cfg".into(), Some(10))));
    }

    #[test]
    fn quoted_values_and_the_parts_of_a_named_file_are_the_needles() {
        let refusal = "'server b/s1' Couldn't open the ca-file '/etc/haproxy/ssl/ca_team-a_hostile-ca.pem' : x 'ab'";
        let needles = quoted(refusal);
        assert_eq!(needles[0], "/etc/haproxy/ssl/ca_team-a_hostile-ca.pem");
        assert!(needles.contains(&"server b/s1".to_owned()), "{needles:?}");
        assert!(needles.contains(&"hostile-ca".to_owned()));
        assert!(!needles.contains(&"ab".to_owned()), "too short to blame a field");
    }
}
