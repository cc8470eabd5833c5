//! The configuration resource's status: conditions `Valid`, `Rendered`, `Validated` and
//! `Synced` (`n/m` pods) with the observed generation, and Kubernetes Events for failures and
//! recoveries. The conditions and events are computed by plain functions over plain facts
//! ([`conditions`], [`events`]); the writer only sends what changed.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use tracing::warn;

use crate::config::{Condition, HAProxyTemplateConfig, HAProxyTemplateConfigStatus};
use crate::pod::State;

/// The `Valid` condition for one generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidCondition {
    /// The generation it judges.
    pub generation: i64,
    /// Whether that generation is in force.
    pub valid: bool,
    /// A CamelCase reason.
    pub reason: String,
    /// What is wrong, or that it was accepted.
    pub message: String,
}

impl ValidCondition {
    /// The generation is in force.
    pub fn accepted(generation: i64) -> Self {
        Self { generation, valid: true, reason: "Accepted".into(), message: "the configuration is in force".into() }
    }

    /// The generation was refused; the previous valid one stays in force.
    pub fn refused(generation: i64, reason: &str, message: String) -> Self {
        Self {
            generation,
            valid: false,
            reason: reason.into(),
            message: format!("{message} (the previous valid configuration stays in force)"),
        }
    }
}

/// How the last render went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenderFact {
    /// It produced files; the main configuration's checksum, shortened.
    Rendered {
        /// How many files.
        files: usize,
        /// The first 12 hex digits of haproxy.cfg's SHA-256.
        checksum: String,
    },
    /// It failed; the last good files stay in force.
    Failed {
        /// The renderer's error (template, line, object).
        message: String,
    },
}

/// One current HAProxy pod as its journal record shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFact {
    /// The pod's name.
    pub name: String,
    /// Its state (Unknown when the journal does not know it yet).
    pub state: State,
    /// Whether it runs exactly the last render.
    pub runs_desired: bool,
    /// Its current failure, if any.
    pub error: Option<String>,
    /// Whether that failure is HAProxy refusing the configuration.
    pub rejected: bool,
}

/// Everything the status reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusFacts {
    /// The latest generation's `Valid` judgement.
    pub valid: Option<ValidCondition>,
    /// The last render.
    pub render: Option<RenderFact>,
    /// The current HAProxy pods; `None` when this replica does not deploy (render only).
    pub pods: Option<Vec<PodFact>>,
}

fn condition(type_: &str, status: &str, reason: &str, message: String) -> Condition {
    Condition { type_: type_.into(), status: status.into(), reason: reason.into(), message, last_transition_time: None }
}

/// Pods named in a message: a few, then how many more.
fn some_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    let shown = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 5 { format!("{shown} and {} more", names.len() - 5) } else { shown }
}

/// The conditions the facts call for, without transition times.
pub fn conditions(facts: &StatusFacts) -> Vec<Condition> {
    let mut out = Vec::new();
    if let Some(valid) = &facts.valid {
        let status = if valid.valid { "True" } else { "False" };
        out.push(condition("Valid", status, &valid.reason, valid.message.clone()));
    }
    out.push(match &facts.render {
        None => condition("Rendered", "Unknown", "NotRenderedYet", "no render yet".into()),
        Some(RenderFact::Rendered { files, checksum }) => {
            condition("Rendered", "True", "Rendered", format!("{files} files rendered; haproxy.cfg sha256:{checksum}"))
        }
        Some(RenderFact::Failed { message }) => condition(
            "Rendered",
            "False",
            "RenderFailed",
            format!("{message} (the last good configuration stays in force)"),
        ),
    });
    let Some(pods) = &facts.pods else { return out };
    let rejected: Vec<&PodFact> = pods.iter().filter(|p| p.rejected).collect();
    out.push(match (rejected.first(), pods.iter().any(|p| p.runs_desired)) {
        (Some(first), _) => condition(
            "Validated",
            "False",
            "ValidationRejected",
            format!(
                "HAProxy refused the configuration on {}: {}",
                some_names(rejected.iter().map(|p| p.name.as_str())),
                first.error.as_deref().unwrap_or("no message")
            ),
        ),
        (None, true) => condition("Validated", "True", "Accepted", "HAProxy accepted the configuration".into()),
        (None, false) => condition("Validated", "Unknown", "NotValidatedYet", "no pod has validated it yet".into()),
    });
    let total = pods.len();
    let in_sync = pods.iter().filter(|p| p.runs_desired && p.state == State::InSync).count();
    let failing: Vec<&PodFact> = pods.iter().filter(|p| p.error.is_some() && !p.rejected).collect();
    let counted = format!("{in_sync}/{total} pods in sync");
    out.push(if total == 0 {
        condition("Synced", "Unknown", "NoPods", "0/0 pods: no HAProxy pod matches the podSelector".into())
    } else if in_sync == total {
        condition("Synced", "True", "AllPodsInSync", counted)
    } else if let Some(first) = failing.first() {
        condition(
            "Synced",
            "False",
            "PodsFailing",
            format!(
                "{counted}; failing: {} ({})",
                some_names(failing.iter().map(|p| p.name.as_str())),
                first.error.as_deref().unwrap_or_default()
            ),
        )
    } else {
        let behind = pods.iter().filter(|p| !(p.runs_desired && p.state == State::InSync));
        condition(
            "Synced",
            "Unknown",
            "PodsSyncing",
            format!("{counted}; syncing: {}", some_names(behind.map(|p| p.name.as_str()))),
        )
    });
    out
}

/// Gives each condition its transition time: kept from `before` while its status stays,
/// `now` when it changes (the Kubernetes convention).
pub fn with_transition_times(before: &[Condition], mut after: Vec<Condition>, now: &str) -> Vec<Condition> {
    for condition in &mut after {
        let previous = before.iter().find(|c| c.type_ == condition.type_);
        condition.last_transition_time = match previous {
            Some(previous) if previous.status == condition.status => previous.last_transition_time.clone(),
            _ => Some(now.to_owned()),
        };
    }
    after
}

/// An Event to publish on the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusEvent {
    /// Warning for failures, Normal for recoveries.
    pub warning: bool,
    /// The condition's reason.
    pub reason: String,
    /// The condition's message.
    pub note: String,
}

/// The Events a change of conditions calls for: a condition turning False (or changing its
/// failure reason) is a Warning; one turning True from False is a recovery.
pub fn events(before: &[Condition], after: &[Condition]) -> Vec<StatusEvent> {
    let mut out = Vec::new();
    for condition in after {
        let previous = before.iter().find(|c| c.type_ == condition.type_);
        let was_false = previous.is_some_and(|p| p.status == "False");
        let failed =
            condition.status == "False" && previous.is_none_or(|p| p.status != "False" || p.reason != condition.reason);
        let recovered = condition.status == "True" && was_false;
        if failed || recovered {
            out.push(StatusEvent {
                warning: failed,
                reason: condition.reason.clone(),
                note: condition.message.clone(),
            });
        }
    }
    out
}

fn same_ignoring_times(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.type_ == y.type_ && x.status == y.status && x.reason == y.reason && x.message == y.message)
}

/// An object left out of the render because a value of it was refused, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The object, for an Event regarding it.
    pub object: ObjectReference,
    /// The renderer's error: template, line, value.
    pub message: String,
    /// Whether the object is left out (`Refused`), or served without what the message names
    /// (`UnsupportedAnnotations`).
    pub left_out: bool,
}

impl Refusal {
    /// The refusal an error of `render_leaving_out` stands for, with the offending object as
    /// the stores hold it (its apiVersion and UID, so the Event lands on that very object).
    pub fn of(stores: &crate::store::Stores, error: &crate::render::RenderError) -> Option<Self> {
        let offender = error.offending_object()?;
        Self::about(stores, offender, error.to_string(), true)
    }

    /// The Warning a render's notice stands for: the object is served, without what it names.
    pub fn notice(stores: &crate::store::Stores, notice: &crate::render::Notice) -> Option<Self> {
        Self::about(stores, &notice.object, notice.message.clone(), false)
    }

    fn about(
        stores: &crate::store::Stores,
        offender: &crate::store::ObjectRef,
        message: String,
        left_out: bool,
    ) -> Option<Self> {
        let stored = crate::store::find(stores, offender)?;
        let field = |path: &[&str]| {
            let mut value = stored.value.clone();
            for key in path {
                value = value.get_attr(key).ok()?;
            }
            (!value.is_undefined() && !value.is_none()).then(|| value.to_string())
        };
        Some(Self {
            object: ObjectReference {
                api_version: field(&["apiVersion"]),
                kind: Some(offender.kind.to_string()),
                namespace: (!offender.key.namespace.is_empty()).then(|| offender.key.namespace.to_string()),
                name: Some(offender.key.name.to_string()),
                uid: field(&["metadata", "uid"]),
                ..ObjectReference::default()
            },
            message,
            left_out,
        })
    }

    fn key(&self) -> String {
        let object = &self.object;
        format!("{:?}/{:?}/{:?}/{:?}/{}", object.kind, object.namespace, object.name, object.uid, self.left_out)
    }
}

/// Writes the status subresource and publishes Events, skipping writes that change nothing.
pub(crate) struct StatusWriter {
    api: Api<HAProxyTemplateConfig>,
    name: String,
    recorder: Recorder,
    /// The configuration object, for Events; known once it has been seen.
    reference: Option<ObjectReference>,
    /// The generation last seen.
    generation: i64,
    /// What was last written.
    written: Option<(i64, Vec<Condition>)>,
    /// Refusals already announced, by object, with their message.
    announced: std::collections::BTreeMap<String, String>,
}

impl StatusWriter {
    pub(crate) fn new(client: kube::Client, api: Api<HAProxyTemplateConfig>, name: String, instance: String) -> Self {
        let reporter = Reporter { controller: "haptic".into(), instance: Some(instance) };
        Self {
            api,
            name,
            recorder: Recorder::new(client, reporter),
            reference: None,
            generation: 0,
            written: None,
            announced: Default::default(),
        }
    }

    /// Notes the configuration object (its generation and identity, for Events).
    pub(crate) fn saw(&mut self, config: &HAProxyTemplateConfig) {
        use kube::Resource;
        self.generation = config.metadata.generation.unwrap_or_default();
        self.reference = Some(config.object_ref(&()));
    }

    /// Publishes a Warning Event on each object newly left out of the render (once per object
    /// and message: every render refuses it again, and must not repeat the Event).
    pub(crate) async fn announce_refusals(&mut self, refusals: Vec<Refusal>) {
        let mut current = std::collections::BTreeMap::new();
        for refusal in refusals {
            let key = refusal.key();
            if self.announced.get(&key) != Some(&refusal.message) {
                let (reason, note) = if refusal.left_out {
                    ("Refused", format!("left out of the HAProxy configuration: {}", refusal.message))
                } else {
                    warn!(object = ?refusal.object.name, namespace = ?refusal.object.namespace, message = %refusal.message, "an object is served without part of what it asks");
                    ("UnsupportedAnnotations", refusal.message.clone())
                };
                let event = KubeEvent {
                    type_: EventType::Warning,
                    reason: reason.into(),
                    note: Some(note.chars().take(1024).collect()),
                    action: "Render".into(),
                    secondary: self.reference.clone(),
                };
                if let Err(error) = bounded(self.recorder.publish(&event, &refusal.object)).await {
                    warn!(%error, object = ?refusal.object.name, "could not publish an Event on a refused object");
                    continue;
                }
            }
            current.insert(key, refusal.message);
        }
        // Objects no longer refused are forgotten, so a new offence is announced again.
        self.announced = current;
    }

    /// Writes the conditions the facts call for, if they differ from what was last written.
    pub(crate) async fn publish(&mut self, facts: &StatusFacts) {
        let wanted = conditions(facts);
        if let Some((generation, written)) = &self.written
            && *generation == self.generation
            && same_ignoring_times(written, &wanted)
        {
            return;
        }
        let before = self.written.as_ref().map(|(_, c)| c.clone()).unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let timed = with_transition_times(&before, wanted, &now);
        let status =
            HAProxyTemplateConfigStatus { observed_generation: Some(self.generation), conditions: timed.clone() };
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        if let Err(error) = bounded(self.api.patch_status(&self.name, &PatchParams::default(), &patch)).await {
            warn!(%error, "could not write the configuration's status");
            return;
        }
        if let Some(reference) = &self.reference {
            for event in events(&before, &timed) {
                let event = KubeEvent {
                    type_: if event.warning { EventType::Warning } else { EventType::Normal },
                    reason: event.reason,
                    note: Some(event.note.chars().take(1024).collect()),
                    action: "Reconcile".into(),
                    secondary: None,
                };
                if let Err(error) = bounded(self.recorder.publish(&event, reference)).await {
                    warn!(%error, reason = %event.reason, "could not publish an Event on the configuration");
                }
            }
        }
        self.written = Some((self.generation, timed));
    }
}

/// What the configuration's status writer owes: the latest configuration object, refusals and
/// facts (each replacing an unwritten one).
#[derive(Default)]
pub(crate) struct ConfigOwed {
    config: Option<HAProxyTemplateConfig>,
    refusals: Option<Vec<Refusal>>,
    facts: Option<StatusFacts>,
}

/// An offer to the configuration's status writer.
pub(crate) enum ConfigOffer {
    /// The configuration object as watched (its generation and identity, for Events).
    Saw(Box<HAProxyTemplateConfig>),
    /// The objects the last render left out: an Event on each newly refused one.
    Refusals(Vec<Refusal>),
    /// The conditions these facts call for (written when they differ from the last).
    Facts(StatusFacts),
}

impl super::writers::Owed for ConfigOwed {
    type Offer = ConfigOffer;

    fn merge(&mut self, offer: ConfigOffer) -> bool {
        match offer {
            ConfigOffer::Saw(config) => self.config = Some(*config),
            ConfigOffer::Refusals(refusals) => self.refusals = Some(refusals),
            ConfigOffer::Facts(facts) => self.facts = Some(facts),
        }
        true
    }
}

impl super::writers::StatusWrites for StatusWriter {
    type Owed = ConfigOwed;

    async fn pass(&mut self, owed: &super::writers::SharedOwed<ConfigOwed>, may_write: bool) -> bool {
        let ConfigOwed { config, refusals, facts } = std::mem::take(&mut *owed.lock());
        // The object first: the generation and the Events' subject come from it.
        if let Some(config) = &config {
            self.saw(config);
        }
        if !may_write {
            return false;
        }
        if let Some(refusals) = refusals {
            self.announce_refusals(refusals).await;
        }
        if let Some(facts) = &facts {
            self.publish(facts).await;
        }
        // A failed write is logged; the next status tick offers the facts again.
        false
    }
}

/// How long one status or Event write may take: an API server that stopped answering must
/// not hold up the controller's loop (the kube client waits minutes for a silent peer).
const API_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A write to the API server, given up after [`API_CALL_TIMEOUT`].
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, super::writers::WriteFailed> {
    super::writers::bounded(API_CALL_TIMEOUT, call).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, state: State, runs_desired: bool, error: Option<&str>, rejected: bool) -> PodFact {
        PodFact { name: name.into(), state, runs_desired, error: error.map(Into::into), rejected }
    }

    fn find<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
        conditions.iter().find(|c| c.type_ == type_).expect(type_)
    }

    fn facts(pods: Vec<PodFact>) -> StatusFacts {
        StatusFacts {
            valid: Some(ValidCondition::accepted(3)),
            render: Some(RenderFact::Rendered { files: 2, checksum: "0123456789ab".into() }),
            pods: Some(pods),
        }
    }

    #[test]
    fn synced_counts_pods_running_the_render_and_names_the_failing_ones() {
        let all = conditions(&facts(vec![
            pod("a", State::InSync, true, None, false),
            pod("b", State::InSync, true, None, false),
        ]));
        let synced = find(&all, "Synced");
        assert_eq!(
            (synced.status.as_str(), synced.reason.as_str(), synced.message.as_str()),
            ("True", "AllPodsInSync", "2/2 pods in sync")
        );
        assert_eq!(find(&all, "Validated").status, "True");

        let some = conditions(&facts(vec![
            pod("a", State::InSync, true, None, false),
            pod("b", State::Unknown, false, Some("GET http://10.0.0.8:5555/v3/...: connection refused"), false),
        ]));
        let synced = find(&some, "Synced");
        assert_eq!((synced.status.as_str(), synced.reason.as_str()), ("False", "PodsFailing"));
        assert!(synced.message.starts_with("1/2 pods in sync; failing: b (GET"), "{}", synced.message);

        let syncing = conditions(&facts(vec![pod("a", State::Syncing, false, None, false)]));
        assert_eq!(find(&syncing, "Synced").reason, "PodsSyncing");
        assert_eq!(find(&syncing, "Validated").status, "Unknown");
        assert_eq!(
            find(&conditions(&facts(vec![])), "Synced").message,
            "0/0 pods: no HAProxy pod matches the podSelector"
        );
    }

    #[test]
    fn a_rejection_is_validated_false_with_haproxys_words() {
        let all = conditions(&facts(vec![pod(
            "a",
            State::Validating,
            false,
            Some("[ALERT] parsing [haproxy.cfg:12]: unknown keyword 'bogus'"),
            true,
        )]));
        let validated = find(&all, "Validated");
        assert_eq!((validated.status.as_str(), validated.reason.as_str()), ("False", "ValidationRejected"));
        assert!(validated.message.contains("on a: [ALERT] parsing [haproxy.cfg:12]"), "{}", validated.message);
        assert_eq!(find(&all, "Synced").reason, "PodsSyncing", "a refusal is not a transport failure");
    }

    #[test]
    fn render_failures_say_the_last_good_files_stay_and_render_only_replicas_report_no_pods() {
        let all = conditions(&StatusFacts {
            valid: None,
            render: Some(RenderFact::Failed { message: "template haproxy.cfg line 3: unknown filter".into() }),
            pods: None,
        });
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].status, "False");
        assert!(all[0].message.ends_with("(the last good configuration stays in force)"));
    }

    #[test]
    fn transition_times_move_only_when_a_status_changes() {
        let before =
            with_transition_times(&[], conditions(&facts(vec![pod("a", State::Syncing, false, None, false)])), "t1");
        let after = conditions(&facts(vec![pod("a", State::Unknown, false, Some("refused"), false)]));
        let timed = with_transition_times(&before, after, "t2");
        assert_eq!(find(&timed, "Rendered").last_transition_time.as_deref(), Some("t1"));
        assert_eq!(find(&timed, "Synced").last_transition_time.as_deref(), Some("t2"), "Unknown → False");
    }

    #[test]
    fn failures_and_recoveries_become_events_and_nothing_else_does() {
        let syncing = conditions(&facts(vec![pod("a", State::Syncing, false, None, false)]));
        let failing = conditions(&facts(vec![pod("a", State::Unknown, false, Some("refused"), false)]));
        let synced = conditions(&facts(vec![pod("a", State::InSync, true, None, false)]));
        assert_eq!(events(&[], &syncing), vec![], "a first status with nothing failing says nothing");
        let failed = events(&syncing, &failing);
        assert_eq!(failed.len(), 1);
        assert!(failed[0].warning && failed[0].reason == "PodsFailing", "{failed:?}");
        assert_eq!(events(&failing, &failing), vec![], "no repeat while it stays failed");
        let recovered = events(&failing, &synced);
        assert!(recovered.iter().any(|e| !e.warning && e.reason == "AllPodsInSync"), "{recovered:?}");
        assert_eq!(events(&syncing, &synced), vec![], "an ordinary sync is not news");
    }
}
