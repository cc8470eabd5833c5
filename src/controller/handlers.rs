//! The controller's state and one handler per event the loop receives: the configuration
//! watched, an activation finished, the status tick, culprits found, a watched change, new
//! Dataplane credentials, a leadership change, a debounced render. Each handler is a method
//! that does its work and returns; the loop in `mod.rs` only waits and dispatches.

use std::collections::HashSet;
use std::sync::Arc;

use futures::stream::BoxStream;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{mpsc, watch};
use tracing::{Instrument, error, info, warn};

use super::activation::{Activation, ActivationInputs, Active, Coalescer, debounce_settings};
use super::gateway_status::GatewayStatusWriter;
use super::ingress_status::IngressWrites;
use super::rendering::{Rendered, pod_facts, reconcile_span, render, search_job};
use super::status::{ConfigOffer, StatusWriter};
use super::writers::StatusTask;
use super::{ControllerOptions, RenderFact, RenderSink, StatusFacts, Trigger, ValidCondition};
use super::{credentials, deploy, quarantine};
use crate::config::HAProxyTemplateConfig;
use crate::election::{Fence, Leadership};
use crate::files::FileSet;
use crate::journal::Journal;
use crate::store::ObjectRef;
use crate::tasks::TaskTree;
use crate::telemetry::traces::TraceParent;
use crate::watch::Change;

/// What the loop waits on besides the controller's own state.
pub(super) struct Inbox {
    /// The configuration resource's watch.
    pub(super) config_watch: BoxStream<'static, Result<Event<HAProxyTemplateConfig>, watcher::Error>>,
    /// Watched changes, from the active version's watches.
    pub(super) changes: mpsc::Receiver<Change>,
    /// New Dataplane credentials.
    pub(super) access: mpsc::Receiver<credentials::AccessChanged>,
    /// Debounced triggers: a render is due.
    pub(super) renders: mpsc::Receiver<Vec<Trigger>>,
    /// Objects HAProxy refuses, found by a search.
    pub(super) culprits: mpsc::Receiver<quarantine::Finished>,
    /// The status tick.
    pub(super) status_tick: tokio::time::Interval,
}

/// Where the loop's own tasks send.
struct Senders {
    changes: mpsc::Sender<Change>,
    access: mpsc::Sender<credentials::AccessChanged>,
    renders: mpsc::Sender<Vec<Trigger>>,
    culprits: mpsc::Sender<quarantine::Finished>,
}

/// Whether this replica leads, and what the fleet's writes ask.
pub(super) struct Leading {
    /// The leadership as the election (or the lone replica) states it.
    pub(super) leadership: watch::Receiver<Leadership>,
    /// The fence every write to a pod asks.
    pub(super) fence: Arc<Fence>,
    /// Without election, the lone replica's leadership, kept so that it stays open.
    pub(super) _solo: Option<watch::Sender<Leadership>>,
}

/// Everything the controller keeps between events.
pub(super) struct Controller {
    client: kube::Client,
    options: ControllerOptions,
    tasks: TaskTree,
    senders: Senders,
    journal: Option<Arc<Journal>>,
    pub(super) leading: Leading,
    leadership_open: bool,
    /// The configuration's status writer and the facts it is given.
    status: StatusTask<StatusWriter>,
    facts: StatusFacts,
    ingress_writer: StatusTask<IngressWrites>,
    /// The Gateway API's writer, started for the version in force when it writes status.
    gateway_writer: Option<StatusTask<GatewayStatusWriter>>,
    pub(super) active: Option<Active>,
    coalescer: Option<Coalescer>,
    pub(super) activation: Option<Activation>,
    deployer: Option<deploy::Deployer>,
    /// The server slots as journaled.
    saved_slots: Arc<crate::plan::slots::Slots>,
    last_render: Option<(FileSet, Option<TraceParent>)>,
    /// What the last render of a version left out (unserved: their Ingress status is not ours
    /// to write), and the Ingresses whose ignored fields changed since the last status tick
    /// (their status may be wrong: another writer's, or the echo of ours).
    left_out_of_last_render: Option<(i64, Vec<ObjectRef>)>,
    ingress_status_dirty: HashSet<ObjectRef>,
    /// Objects HAProxy refuses, found by the validator when a pod refuses a render, and left
    /// out until they change. Without a validator, nothing is searched.
    quarantine: quarantine::Quarantine,
    culprit_checker: Option<Arc<dyn crate::admission::Validator>>,
    pub(super) api: crate::api::ApiState,
    /// The version in force, for the admission webhook.
    admission: watch::Sender<Option<Arc<crate::api::webhook::AdmissionSource>>>,
    sink: RenderSink,
}

/// Whether this replica writes status: the leader does, and a render-only replica (which never
/// leads) reports its own renders.
pub(super) fn writes_status(leadership: Leadership, journal: &Option<Arc<Journal>>) -> bool {
    leadership.is_leader() || journal.is_none()
}

/// Asked by each status writer before a pass: [`writes_status`] as the leadership is then.
fn status_permission(
    leading: &Leading,
    journal: &Option<Arc<Journal>>,
) -> impl Fn() -> bool + Clone + Send + Sync + 'static {
    let (leadership, journal) = (leading.leadership.clone(), journal.clone());
    move || writes_status(*leadership.borrow(), &journal)
}

impl Controller {
    /// The controller's state before any event, with the channels its loop waits on. Its
    /// writers and the tasks they start run under `tasks`.
    pub(super) fn new(
        client: kube::Client,
        options: ControllerOptions,
        config_watch: BoxStream<'static, Result<Event<HAProxyTemplateConfig>, watcher::Error>>,
        journal: Option<Arc<Journal>>,
        leading: Leading,
        tasks: TaskTree,
    ) -> (Self, Inbox) {
        let (changes_tx, changes) = mpsc::channel(1024);
        let (access_tx, access) = mpsc::channel(8);
        let (renders_tx, renders) = mpsc::channel(16);
        let (culprits_tx, culprits) = mpsc::channel(4);
        let mut status_tick = tokio::time::interval(std::time::Duration::from_secs(1));
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let may_write = status_permission(&leading, &journal);
        let instance = options.election.as_ref().map(|e| e.identity.clone()).unwrap_or_else(|| "haptic".into());
        let configs = kube::Api::namespaced(client.clone(), &options.namespace);
        let writer = StatusWriter::new(client.clone(), configs, options.name.clone(), instance);
        let status = StatusTask::start(&tasks, "configuration status", writer, may_write.clone());
        let ingress_writer = StatusTask::start(&tasks, "ingress status", IngressWrites::new(client.clone()), may_write);
        let auth = options
            .api_auth
            .as_ref()
            .map(|audience| Arc::new(crate::api::auth::KubeAuthorizer::new(client.clone(), audience)));
        let api = crate::api::ApiState { journal: journal.clone(), auth, ..crate::api::ApiState::default() };
        let controller = Self {
            quarantine: quarantine::Quarantine::new(tasks.clone(), culprits_tx.clone()),
            culprit_checker: options.validation_requests.as_ref().map(crate::api::webhook::validator_of),
            sink: RenderSink::new(options.render_dir.clone()),
            senders: Senders { changes: changes_tx, access: access_tx, renders: renders_tx, culprits: culprits_tx },
            admission: watch::channel(None).0,
            client,
            options,
            tasks,
            journal,
            leading,
            leadership_open: true,
            status,
            facts: StatusFacts::default(),
            ingress_writer,
            gateway_writer: None,
            active: None,
            coalescer: None,
            activation: None,
            deployer: None,
            saved_slots: Arc::default(),
            last_render: None,
            left_out_of_last_render: None,
            ingress_status_dirty: HashSet::new(),
            api,
        };
        (controller, Inbox { config_watch, changes, access, renders, culprits, status_tick })
    }

    /// The version in force, for the admission webhook to judge against.
    pub(super) fn admission_source(&self) -> watch::Receiver<Option<Arc<crate::api::webhook::AdmissionSource>>> {
        self.admission.subscribe()
    }

    fn writes_status(&self) -> bool {
        writes_status(*self.leading.leadership.borrow(), &self.journal)
    }

    /// The configuration resource changed: a new version starts activating (replacing one
    /// still being activated, which stops).
    pub(super) fn on_config(&mut self, event: Result<Event<HAProxyTemplateConfig>, watcher::Error>) {
        let config = match event {
            Ok(Event::Apply(config) | Event::InitApply(config)) => config,
            Ok(_) => return,
            Err(error) => {
                warn!(%error, "configuration watch interrupted, retrying");
                return;
            }
        };
        let generation = config.metadata.generation.unwrap_or_default();
        let spec = config.spec.clone();
        self.status.offer(ConfigOffer::Saw(Box::new(config)));
        let in_force = self.active.as_ref().is_some_and(|a| a.generation == generation && a.spec == spec);
        if in_force || self.activation.as_ref().is_some_and(|a| a.is_of(generation, &spec)) {
            return;
        }
        let inputs = ActivationInputs {
            client: self.client.clone(),
            namespace: self.options.namespace.clone(),
            changes: self.senders.changes.clone(),
            access_changes: self.senders.access.clone(),
            validation_requests: self.options.validation_requests.clone(),
            tasks: self.tasks.clone(),
        };
        self.activation = Some(Activation::start(generation, spec, inputs));
    }

    /// An activation finished: its version takes effect, or its refusal is reported while the
    /// version in force stays.
    pub(super) async fn on_activated(&mut self, outcome: Result<Active, ValidCondition>) {
        if self.activation.take().is_none() {
            return;
        }
        match outcome {
            Ok(next) => self.take_effect(next).await,
            Err(condition) => {
                error!(generation = condition.generation, reason = %condition.reason, message = %condition.message,
                       "configuration refused; the previous one stays in force");
                self.facts.valid = Some(condition);
            }
        }
        self.status.offer(ConfigOffer::Facts(self.facts.clone()));
    }

    /// Puts an activated version in force.
    async fn take_effect(&mut self, next: Active) {
        let generation = next.generation;
        info!(generation, "configuration activated");
        let previous_level = self.active.as_ref().and_then(|a| a.spec.log_level.clone());
        if next.spec.log_level != previous_level {
            apply_log_level(next.spec.log_level.as_deref());
        }
        self.carry_slots_over(&next).await;
        let settings = debounce_settings(&next.spec);
        if self.coalescer.as_ref().is_none_or(|c| c.settings != settings) {
            self.coalescer = Some(Coalescer::start(&self.tasks, settings, self.senders.renders.clone()));
        }
        self.admission.send_replace(Some(Arc::new(crate::api::webhook::AdmissionSource {
            generation,
            spec: next.spec.clone(),
            renderer: next.renderer.clone(),
            view: next.watches.view(),
        })));
        // The old watches stop when `active` is replaced; the Gateway API status writer starts
        // over with the version's controller name.
        self.active = Some(next);
        self.gateway_writer = None;
        // Another version's templates may take what this one's refused.
        self.quarantine = quarantine::Quarantine::new(self.tasks.clone(), self.senders.culprits.clone());
        self.api.ready.store(true, std::sync::atomic::Ordering::Release);
        self.facts.valid = Some(ValidCondition::accepted(generation));
        if let Some(coalescer) = &self.coalescer {
            coalescer.send(Trigger::Config { generation }).await;
        }
    }

    /// Server names carry over: from the version in force, else from the journal.
    async fn carry_slots_over(&mut self, next: &Active) {
        match (&self.active, &self.journal) {
            (Some(previous), _) => next.renderer.seed_slots(previous.renderer.slots()),
            (None, Some(journal)) => {
                let key = self.config_key();
                let slots = crate::journal::on_blocking_pool(journal, move |j| Ok(j.slots(&key))).await;
                // What the journal holds: the first render writes only what it changes.
                self.saved_slots = Arc::new(slots.unwrap_or_default());
                next.renderer.seed_slots(self.saved_slots.clone());
            }
            (None, None) => {}
        }
    }

    fn config_key(&self) -> String {
        format!("{}/{}", self.options.namespace, self.options.name)
    }

    /// Once a second: the pods' facts, the configuration's status, and the Ingress statuses
    /// whose ignored fields changed, at most once a tick however many arrived (at 10,000
    /// Ingresses the controller's own status writes come back as as many changes).
    pub(super) fn on_status_tick(&mut self) {
        if !self.writes_status() {
            return;
        }
        if let (Some(journal), Some(active), Some((files, _))) = (&self.journal, &self.active, &self.last_render) {
            let pods = pod_facts(journal, &active.watches.all_pods(), files);
            if let (true, Some(checker)) = (pods.iter().any(|pod| pod.rejected), &self.culprit_checker)
                && self.quarantine.would_search(files)
            {
                let job = search_job(active, &mut self.quarantine, checker, self.options.max_left_out);
                self.quarantine.search(job, files);
            }
            self.facts.pods = Some(pods);
        }
        self.status.offer(ConfigOffer::Facts(self.facts.clone()));
        if let (false, Some(active), Some((generation, offenders))) =
            (self.ingress_status_dirty.is_empty(), &self.active, &self.left_out_of_last_render)
            && *generation == active.generation
        {
            let changed = std::mem::take(&mut self.ingress_status_dirty);
            self.ingress_writer.offer(super::rendering::ingress_status_owed(active, offenders, &changed));
        }
    }

    /// A search found objects HAProxy refuses: held out, and a render owed if any is new.
    pub(super) async fn on_culprits(&mut self, finished: quarantine::Finished) {
        let (Some(active), Some(coalescer)) = (&self.active, &self.coalescer) else { return };
        if self.quarantine.hold(active.generation, finished) {
            coalescer.send(Trigger::Config { generation: active.generation }).await;
        }
    }

    /// A watched change: to the debouncer, or (ignored fields only) to the next status tick.
    pub(super) async fn on_change(&mut self, change: Change) {
        if let Change::IgnoredFields(object) = change {
            self.ingress_status_dirty.insert(object);
        } else if let Some(coalescer) = &self.coalescer {
            coalescer.send(Trigger::Watch(change)).await;
        }
    }

    /// The Dataplane credentials changed: deployed with from now on.
    pub(super) fn on_access(&mut self, changed: credentials::AccessChanged) {
        let Some(active) = self.active.as_mut().filter(|a| a.generation == changed.generation) else { return };
        match changed.access {
            Ok(access) => {
                info!("the Dataplane credentials changed: deploying with them from now on");
                active.access = Some(access);
                // Pods that failed with the old credentials are tried again at once, not at the
                // end of their backoff.
                self.deploy_last_render();
            }
            Err(why) => {
                warn!(%why, "the Dataplane credentials changed into something unusable; the previous ones stay in use");
            }
        }
    }

    /// The leadership changed (`open` false: the election ended and nothing changes again).
    pub(super) fn on_leadership(&mut self, open: bool) {
        if !open {
            self.leadership_open = false;
            return;
        }
        let now = *self.leading.leadership.borrow_and_update();
        // A render may have started this term's fleet already (it saw the leadership before
        // this event did): that fleet stays.
        if self.deployer.as_ref().is_some_and(|d| now == Leadership::Leader(d.term())) {
            return;
        }
        // Losing the lease, or a new term, stops every push at once: in-flight actions are
        // abandoned, and the journal (written before each action) says where each pod was
        // left; the next leader verifies before trusting it.
        if let Some(old) = self.deployer.take() {
            old.abort();
            info!("fleet stopped: all pushes halted");
        }
        if let Leadership::Leader(term) = now {
            self.start_fleet(term);
            self.deploy_last_render();
        }
    }

    /// Whether the leadership may still change (the loop stops asking when it cannot).
    pub(super) fn leadership_open(&self) -> bool {
        self.leadership_open
    }

    /// A render is due: the files, their side outputs, and the fleet.
    pub(super) async fn on_render(&mut self, triggers: Vec<Trigger>) {
        let Some(active) = &self.active else { return };
        let span = reconcile_span(&triggers, active.generation);
        let max_left_out = self.options.max_left_out;
        let rendered =
            render(active, &mut self.quarantine, triggers, &self.sink, max_left_out).instrument(span.clone()).await;
        match rendered {
            Ok(rendered) => self.rendered(rendered, TraceParent::of(&span)).await,
            Err(failure) => {
                self.facts.render = Some(RenderFact::Failed { message: failure.to_string() });
                // Pods that came meanwhile get the last good render: while renders fail, a new
                // or scaled-up pod is not left unconfigured.
                self.deploy_last_render();
            }
        }
    }

    /// A render succeeded: its statuses offered, its slots journaled, its files deployed.
    async fn rendered(&mut self, rendered: Rendered, trace: Option<TraceParent>) {
        let Some(generation) = self.active.as_ref().map(|active| active.generation) else { return };
        let Rendered { files, refused, ingresses, offenders, gateway_status, slots } = rendered;
        self.status.offer(ConfigOffer::Refusals(refused));
        self.ingress_writer.offer(ingresses);
        self.left_out_of_last_render = Some((generation, offenders));
        self.offer_gateway_status(gateway_status);
        self.facts.render = Some(RenderFact::Rendered {
            files: files.entries().count(),
            checksum: files.haproxy_cfg.checksum.to_string().chars().take(12).collect(),
        });
        self.api.set_render(generation, Arc::new(files.clone()));
        self.journal_slots(slots).await;
        let leadership = *self.leading.leadership.borrow();
        if let (None, Leadership::Leader(term)) = (&self.deployer, leadership) {
            self.start_fleet(term);
        }
        self.last_render = Some((files, trace));
        self.deploy_last_render();
    }

    /// Starts this term's fleet, when there is a journal to deploy with.
    fn start_fleet(&mut self, term: crate::pod::LeaderTerm) {
        if let Some(journal) = &self.journal {
            let fence = self.leading.fence.clone();
            self.deployer = Some(deploy::Deployer::new(journal.clone(), term, fence, self.tasks.clone()));
        }
    }

    /// Offers the Gateway API status a render owes, starting the writer when needed.
    fn offer_gateway_status(&mut self, owed: Option<crate::gateway::Owed>) {
        let Some(active) = &self.active else { return };
        let (Some(settings), true) = (&active.spec.gateway_api, self.writes_status()) else { return };
        let writer = self.gateway_writer.get_or_insert_with(|| {
            let may_write = status_permission(&self.leading, &self.journal);
            let writes = GatewayStatusWriter::new(self.client.clone(), settings.controller_name.clone());
            StatusTask::start(&self.tasks, "gateway status", writes, may_write)
        });
        if let Some(owed) = owed {
            let mut services = settings.gateway_services.clone();
            if let Some(services) = services.as_mut().filter(|s| s.selector.is_empty()) {
                services.selector = active.spec.pod_selector.match_labels.clone();
            }
            writer.offer(super::gateway_status::Batch { owed, services });
        }
    }

    /// Journals the server slots a render changed (an fsync: on the blocking pool).
    async fn journal_slots(&mut self, slots: std::sync::Arc<crate::plan::slots::Slots>) {
        let Some(journal) = &self.journal else { return };
        let changes = crate::plan::slots::changes(&self.saved_slots, &slots);
        if changes.is_empty() {
            return;
        }
        let key = self.config_key();
        match crate::journal::on_blocking_pool(journal, move |j| j.put_slot_changes(&key, &changes)).await {
            Ok(()) => self.saved_slots = slots,
            Err(error) => warn!(%error, "could not journal the server slots"),
        }
    }

    /// Hands the last good render to the fleet, when leading with credentials to deploy with.
    fn deploy_last_render(&mut self) {
        let (Some(deployer), Some(active), Some((files, trace))) =
            (self.deployer.as_mut(), &self.active, &self.last_render)
        else {
            return;
        };
        match &active.access {
            Some(access) => {
                deployer.deploy(&active.spec, access, files.clone(), &active.watches.all_pods(), trace.clone())
            }
            None => warn!("rendered, but there are no Dataplane credentials (or TLS settings) to deploy with"),
        }
    }

    /// Stops the fleet, letting in-flight actions finish their step.
    pub(super) async fn stop_fleet(&mut self) {
        if let Some(deployer) = self.deployer.take() {
            deployer.stop().await;
        }
    }
}

/// Sets the log filter a configuration states, said under the filter that shows it: the old
/// one, or else the new.
fn apply_log_level(level: Option<&str>) {
    let said = tracing::enabled!(tracing::Level::INFO);
    if said {
        info!(log_level = ?level, "log filter from the configuration");
    }
    if let Err(why) = crate::telemetry::set_log_filter(level) {
        warn!(%why, "the log filter stays as it was");
    } else if !said {
        info!(log_level = ?level, "log filter from the configuration");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;
    use crate::pod::LeaderTerm;
    use crate::store::ObjectKey;
    use crate::watch::debounce::DebounceSettings;

    /// A client of an API server that is not there: the handlers never need one to decide.
    fn nowhere() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        kube::Client::try_from(config).expect("a client")
    }

    fn options() -> ControllerOptions {
        ControllerOptions {
            namespace: "ns".into(),
            name: "haptic".into(),
            render_dir: None,
            max_left_out: 0,
            journal_dir: None,
            journal_retention: 10,
            api_address: None,
            api_tls: super::super::ApiTls::Plaintext,
            health_address: None,
            api_auth: None,
            election: None,
            validation_requests: None,
            webhook: None,
        }
    }

    struct Harness {
        controller: Controller,
        inbox: Inbox,
        leadership: watch::Sender<Leadership>,
        tasks: TaskTree,
    }

    fn harness(journal: Option<Arc<Journal>>) -> Harness {
        let (leadership, watched) = watch::channel(Leadership::Follower);
        let tasks = TaskTree::default();
        let leading = Leading { leadership: watched, fence: Arc::new(Fence::unbounded(LeaderTerm(1))), _solo: None };
        let (controller, inbox) =
            Controller::new(nowhere(), options(), futures::stream::pending().boxed(), journal, leading, tasks.clone());
        Harness { controller, inbox, leadership, tasks }
    }

    fn config(generation: i64, window: &str) -> HAProxyTemplateConfig {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "haptic.io/v1alpha1", "kind": "HAProxyTemplateConfig",
            "metadata": {"namespace": "ns", "name": "haptic", "generation": generation},
            "spec": {
                "watchedResources": {},
                "podSelector": {"matchLabels": {"app": "haproxy"}},
                "dataplane": {"debounce": {"window": window, "maxDelay": "1s"}},
                "templates": {"haproxyConfig": "global\n"}
            }
        }))
        .expect("a configuration")
    }

    #[tokio::test]
    async fn a_refused_version_is_reported_and_nothing_takes_effect() {
        let Harness { mut controller, .. } = harness(None);
        // A debounce window longer than its maximum delay: refused before anything is watched.
        controller.on_config(Ok(Event::Apply(config(3, "10s"))));
        assert_eq!(controller.activation.as_ref().map(|a| a.generation), Some(3));
        let outcome = super::super::activation::outcome_of(&mut controller.activation).await;
        controller.on_activated(outcome).await;
        assert!(controller.activation.is_none() && controller.active.is_none());
        let valid = controller.facts.valid.as_ref().expect("the Valid condition");
        assert_eq!((valid.generation, valid.valid, valid.reason.as_str()), (3, false, "InvalidSpec"));
        assert!(!controller.api.ready.load(std::sync::atomic::Ordering::Acquire), "not ready on a refusal");
    }

    #[tokio::test]
    async fn ignored_fields_wait_for_the_status_tick_and_other_changes_go_to_the_debouncer() {
        let Harness { mut controller, mut inbox, tasks, .. } = harness(None);
        let ingress = ObjectRef { kind: "Ingress".into(), key: ObjectKey { namespace: "ns".into(), name: "a".into() } };
        controller.on_change(Change::IgnoredFields(ingress.clone())).await;
        assert!(controller.ingress_status_dirty.contains(&ingress));
        // Without a version in force nothing is debounced; with one, a change reaches a render.
        controller.on_change(Change::Pods).await;
        assert!(inbox.renders.try_recv().is_err());
        let settings = DebounceSettings { window: Duration::from_millis(1), max_delay: Duration::from_millis(10) };
        controller.coalescer = Some(Coalescer::start(&tasks, settings, controller.senders.renders.clone()));
        controller.on_change(Change::Pods).await;
        let triggers = tokio::time::timeout(Duration::from_secs(5), inbox.renders.recv()).await;
        let triggers = triggers.expect("a render within 5 s").expect("the debouncer runs");
        assert!(matches!(triggers.as_slice(), [Trigger::Watch(Change::Pods)]), "{triggers:?}");
    }

    #[tokio::test]
    async fn a_new_term_starts_a_fleet_and_losing_the_lease_stops_it() {
        let dir = tempfile::tempdir().expect("a directory");
        let (journal, _) = Journal::open(dir.path(), 10).expect("a journal");
        let Harness { mut controller, leadership, .. } = harness(Some(Arc::new(journal)));
        assert!(!controller.writes_status(), "a follower with a journal writes no status");
        leadership.send_replace(Leadership::Leader(LeaderTerm(2)));
        controller.on_leadership(true);
        assert_eq!(controller.deployer.as_ref().map(deploy::Deployer::term), Some(LeaderTerm(2)));
        assert!(controller.writes_status());
        // The same term seen again keeps its fleet; a lost lease stops it.
        controller.on_leadership(true);
        assert_eq!(controller.deployer.as_ref().map(deploy::Deployer::term), Some(LeaderTerm(2)));
        leadership.send_replace(Leadership::Follower);
        controller.on_leadership(true);
        assert!(controller.deployer.is_none());
        controller.on_leadership(false);
        assert!(!controller.leadership_open());
    }

    #[tokio::test]
    async fn a_render_without_a_version_in_force_changes_nothing() {
        let Harness { mut controller, .. } = harness(None);
        assert!(controller.writes_status(), "a render-only replica reports its own renders");
        controller.on_render(vec![Trigger::Watch(Change::Pods)]).await;
        controller.on_status_tick();
        assert!(controller.facts.render.is_none() && controller.last_render.is_none());
    }

    #[tokio::test]
    async fn stopping_the_tree_stops_the_writers_it_started() {
        let Harness { controller, tasks, .. } = harness(None);
        assert_eq!(tasks.running(), vec!["configuration status", "ingress status"]);
        tasks.close(Duration::from_secs(1)).await;
        assert!(tasks.running().is_empty());
        drop(controller);
    }
}
