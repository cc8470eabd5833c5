//! Controller: the async shell that wires the pipeline together for one `HAProxyTemplateConfig`.
//!
//! It follows the configuration resource (a new valid version takes effect at once, an invalid
//! one is reported in its status while the previous one keeps working), keeps the watches of the
//! active version running, and renders when watched changes, coalesced by the debouncer, call
//! for it. Deploying the render to pods joins in the fleet issue (#4).

pub mod credentials;
mod deploy;
mod gateway_status;
mod ingress_status;
mod output;
mod quarantine;
mod status;

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tracing::field::Empty;
use tracing::{Instrument, error, info, info_span, warn};

use crate::config::validate::problems;
use crate::config::{HAProxyTemplateConfig, HAProxyTemplateConfigSpec};
use crate::election::Leadership;
use crate::pod::LeaderTerm;
use crate::render::Renderer;
use crate::telemetry::traces::TraceParent;
use crate::watch::debounce::{self, DebounceSettings};
use crate::watch::{Change, Watches};

pub use output::{RenderRecord, RenderSink};
pub use status::{PodFact, RenderFact, StatusFacts, ValidCondition};

/// Which configuration to follow, and where renders go.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Namespace of the `HAProxyTemplateConfig`.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Write every render here (files plus a line in `renders.log`), for inspection.
    pub render_dir: Option<PathBuf>,
    /// How many objects with refused values a render may leave out before failing.
    pub max_left_out: usize,
    /// Where the journal lives; without it, nothing is deployed (render only).
    pub journal_dir: Option<PathBuf>,
    /// Transitions kept per pod in the journal's log.
    pub journal_retention: u64,
    /// Where the read-only HTTP API listens, if anywhere.
    pub api_address: Option<std::net::SocketAddr>,
    /// How the HTTP API speaks TLS.
    pub api_tls: ApiTls,
    /// Where `/healthz` and `/readyz` are served, if anywhere.
    pub health_address: Option<std::net::SocketAddr>,
    /// Whether `/api/v1/*` and `/metrics` ask for a Kubernetes token allowed to read them, and
    /// the audience it must be issued for.
    pub api_auth: Option<String>,
    /// Leader election among replicas; without it, this replica deploys alone.
    pub election: Option<crate::election::ElectionSettings>,
    /// Where the validation tests' requests run (a local HAProxy, or the validator's); without
    /// it, only their file assertions are checked here (`haptic validate` runs the rest).
    pub validation_requests: Option<crate::checks::Requests>,
    /// The validating admission webhook, when served.
    pub webhook: Option<crate::api::webhook::WebhookSettings>,
}

/// Errors that stop the controller.
#[derive(Debug, Error)]
pub enum ControllerError {
    /// Opening the journal panicked on the blocking pool.
    #[error("opening the journal failed unexpectedly: {0}")]
    JournalOpenPanicked(String),
    /// The HTTP API could not listen.
    #[error(transparent)]
    Api(#[from] std::io::Error),
    /// The journal could not be opened, even fresh.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// The admission webhook could not be served.
    #[error(transparent)]
    Webhook(#[from] crate::api::webhook::WebhookError),
    /// The HTTP API's certificate.
    #[error("the HTTP API's certificate: {0}")]
    ApiTls(#[from] crate::api::tls::ListenerTlsError),
    /// The configuration watch ended, which only happens when the client is gone.
    #[error("the watch of HAProxyTemplateConfig {namespace}/{name} ended")]
    ConfigWatchEnded {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// What triggered a render.
#[derive(Clone, Debug)]
pub enum Trigger {
    /// A watched object changed.
    Watch(Change),
    /// A configuration version became active.
    Config {
        /// Its `metadata.generation`.
        generation: i64,
    },
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Watch(change) => change.fmt(f),
            Self::Config { generation } => write!(f, "configuration generation {generation} activated"),
        }
    }
}

/// How long a new configuration's watches may take to list everything before it is refused.
const SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The configuration version in force: its templates and its watches.
struct Active {
    generation: i64,
    spec: HAProxyTemplateConfigSpec,
    renderer: Arc<Renderer>,
    watches: Watches,
    /// Dataplane credentials and TLS settings, when the configuration names them and they
    /// could be read.
    access: Option<crate::dataplane::Access>,
    /// The watch of the Secrets behind `access` (a rotation is deployed with at once).
    _secrets_watch: Option<AbortOnDrop<()>>,
}

/// How the HTTP API speaks TLS.
#[derive(Clone, Debug, Default)]
pub enum ApiTls {
    /// With a certificate made at start (its fingerprint logged).
    #[default]
    SelfSigned,
    /// With `tls.crt` and `tls.key` from this directory.
    Directory(std::path::PathBuf),
    /// Plain http (`--api-plaintext`).
    Plaintext,
}

/// Starts serving the HTTP API on `listener` as `tls` says, and logs where and how.
fn serve_api(
    listener: tokio::net::TcpListener,
    tls: &ApiTls,
    api: crate::api::ApiState,
) -> Result<tokio::task::JoinHandle<()>, ControllerError> {
    let address = listener.local_addr()?;
    let config = match tls {
        ApiTls::Plaintext => {
            info!(%address, scheme = "http", "HTTP API listening");
            return Ok(tokio::spawn(async move {
                if let Err(error) = crate::api::serve(listener, api).await {
                    tracing::error!(%error, "the HTTP API stopped");
                }
            }));
        }
        ApiTls::Directory(dir) => crate::api::tls::from_directory(dir)?,
        ApiTls::SelfSigned => {
            let host = std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")).unwrap_or_default();
            let names: Vec<String> =
                ["haptic".to_owned(), host, address.ip().to_string()].into_iter().filter(|n| !n.is_empty()).collect();
            let (config, fingerprint) = crate::api::tls::self_signed(&names)?;
            info!(sha256 = %fingerprint, "the HTTP API's self-signed certificate (--api-tls-dir gives one)");
            config
        }
    };
    info!(%address, scheme = "https", "HTTP API listening");
    Ok(tokio::spawn(crate::api::serve_tls(listener, config, api)))
}

/// Follows one configuration, renders and (as the leader) deploys until `shutdown` completes;
/// then it lets in-flight actions finish their step and hands the Lease back, so another
/// replica takes over at once rather than after the lease duration.
pub async fn run(
    client: kube::Client,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ControllerError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut stopping = false;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &options.namespace);
    let selector = format!("metadata.name={}", options.name);
    let mut config_watch = watcher::watcher(configs.clone(), watcher::Config::default().fields(&selector))
        .backoff(crate::watch::reconnect_backoff())
        .boxed();
    let (watch_tx, mut watch_rx) = mpsc::channel::<Change>(1024);
    let (access_tx, mut access_rx) = mpsc::channel::<credentials::AccessChanged>(8);
    let (render_tx, mut render_rx) = mpsc::channel::<Vec<Trigger>>(16);
    let sink = RenderSink::new(options.render_dir.clone());
    let instance = options.election.as_ref().map(|e| e.identity.clone()).unwrap_or_else(|| "haptic".into());
    let status_configs = configs.clone();
    let status =
        status::StatusTask::start(status::StatusWriter::new(client.clone(), configs, options.name.clone(), instance));
    let mut facts = StatusFacts::default();
    let mut gateway_writer: Option<gateway_status::GatewayStatusTask> = None;
    let mut status_tick = tokio::time::interval(std::time::Duration::from_secs(1));
    status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut active: Option<Active> = None;
    let mut coalescer: Option<Coalescer> = None;
    // A configuration version being activated (its watches listing everything, up to a minute)
    // runs beside the loop, so leadership changes and renders are not held up by it.
    let mut activation: Option<Activation> = None;
    let journal = match &options.journal_dir {
        Some(dir) => {
            // Opening waits for the previous owner's lock (sleeping between tries) and reads the
            // whole store: the blocking pool's work, not an async worker's.
            let (dir, retention) = (dir.clone(), options.journal_retention);
            let opened = tokio::task::spawn_blocking(move || crate::journal::Journal::open(&dir, retention))
                .await
                .map_err(|failure| ControllerError::JournalOpenPanicked(failure.to_string()))?;
            let (journal, report) = opened?;
            if let Some((aside, why)) = &report.moved_aside {
                warn!(moved_to = %aside.display(), %why, "the journal was unreadable; every pod will be verified");
            }
            Some(Arc::new(journal))
        }
        None => None,
    };
    // Only the leader deploys. Without election a replica with a journal leads alone, term 0.
    // Every write to a pod asks the fence, which the election grants only until the lease
    // could lapse.
    let (leadership_tx, mut leadership) = watch::channel(Leadership::Follower);
    let mut leadership_open = true;
    let election_settings = match &options.election {
        Some(settings) => Some(election_timings(&status_configs, &options.name, settings.clone()).await),
        None => None,
    };
    let (election, _solo_leadership, fence) = match (&election_settings, &journal) {
        (Some(settings), Some(_)) => {
            info!(lease = %settings.lease_name, identity = %settings.identity, "leader election on");
            let (stop, stopped) = tokio::sync::oneshot::channel();
            let fence = Arc::new(crate::election::Fence::default());
            let task = tokio::spawn(crate::election::run(
                client.clone(),
                settings.clone(),
                leadership_tx,
                fence.clone(),
                stopped,
            ));
            (Some((AbortOnDrop(task), stop)), None, fence)
        }
        (None, Some(_)) => {
            crate::telemetry::metrics::metrics().leader.set(1);
            leadership_tx.send_replace(Leadership::Leader(LeaderTerm::default()));
            (None, Some(leadership_tx), Arc::new(crate::election::Fence::unbounded(LeaderTerm::default())))
        }
        (_, None) => (None, Some(leadership_tx), Arc::new(crate::election::Fence::default())),
    };
    let mut deployer: Option<deploy::Deployer> = None;
    let config_key = format!("{}/{}", options.namespace, options.name);
    let mut saved_slots = Arc::new(crate::plan::slots::Slots::default());
    let mut last_render: Option<(crate::files::FileSet, Option<TraceParent>)> = None;
    // What the last render of a configuration version left out (unserved: their Ingress status
    // is not ours to write), and the Ingresses whose ignored fields changed since the last
    // status tick (their status may be wrong: another writer's, or the echo of ours).
    let mut left_out_of_last_render: Option<(i64, Vec<crate::store::ObjectRef>)> = None;
    let mut ingress_status_dirty: std::collections::HashSet<crate::store::ObjectRef> = Default::default();
    // Objects HAProxy refuses, found by the validator when a pod refuses a render, and left
    // out until they change. Without a validator, nothing is searched.
    let (culprits_tx, mut culprits_rx) = mpsc::channel(4);
    let mut quarantine = quarantine::Quarantine::new(culprits_tx.clone());
    let culprit_checker: Option<Arc<dyn crate::admission::Validator>> =
        options.validation_requests.as_ref().map(crate::api::webhook::validator_of);
    let ingress_writer = {
        let (leading, journal) = (leadership.clone(), journal.clone());
        ingress_status::StatusWriter::start(client.clone(), move || writes_status(*leading.borrow(), &journal))
    };
    let auth = options
        .api_auth
        .as_ref()
        .map(|audience| Arc::new(crate::api::auth::KubeAuthorizer::new(client.clone(), audience)));
    let api = crate::api::ApiState { journal: journal.clone(), auth, ..crate::api::ApiState::default() };
    let _api_task = match options.api_address {
        Some(address) => {
            let listener = crate::api::bind(address, "the HTTP API").await?;
            Some(AbortOnDrop(serve_api(listener, &options.api_tls, api.clone())?))
        }
        None => None,
    };
    // The admission webhook judges against the version in force, published at each activation.
    let (admission_tx, admission_rx) = watch::channel::<Option<Arc<crate::api::webhook::AdmissionSource>>>(None);
    let _webhook_task = match &options.webhook {
        Some(settings) => {
            let config = (options.namespace.clone(), options.name.clone());
            let (address, task) = crate::api::webhook::serve(settings, config, admission_rx).await?;
            info!(%address, validator = ?settings.validator, "admission webhook listening");
            Some(AbortOnDrop(task))
        }
        None => None,
    };
    let _health_task = match options.health_address {
        Some(address) => {
            let listener = crate::api::bind(address, "health").await?;
            info!(address = %listener.local_addr()?, "health listening");
            Some(AbortOnDrop(tokio::spawn(crate::api::serve_health(listener, api.clone()))))
        }
        None => None,
    };

    loop {
        // Liveness: the loop turns at least once a status tick; a wedged one fails /healthz.
        api.heartbeat.beat();
        tokio::select! {
            () = &mut shutdown => {
                stopping = true;
                break;
            }
            event = config_watch.next() => {
                let Some(event) = event else { break };
                let config = match event {
                    Ok(Event::Apply(config) | Event::InitApply(config)) => config,
                    Ok(_) => continue,
                    Err(error) => {
                        warn!(%error, "configuration watch interrupted, retrying");
                        continue;
                    }
                };
                let generation = config.metadata.generation.unwrap_or_default();
                status.saw(&config);
                if active.as_ref().is_some_and(|a| a.generation == generation && a.spec == config.spec)
                    || activation.as_ref().is_some_and(|a| a.generation == generation && a.spec == config.spec)
                {
                    continue;
                }
                // A newer version replaces one still being activated (dropping it stops it).
                let (client, spec, namespace, changes, haproxy, access_changes) = (
                    client.clone(),
                    config.spec.clone(),
                    options.namespace.clone(),
                    watch_tx.clone(),
                    options.validation_requests.clone(),
                    access_tx.clone(),
                );
                let task = tokio::spawn(async move {
                    let outcome = activate(&client, &spec, &namespace, generation, changes, haproxy.as_ref()).await;
                    outcome.map(|mut active| {
                        // Started after the access was read: a change from here on is seen.
                        let watch = credentials::watch(client, spec, namespace, generation, access_changes);
                        active._secrets_watch = Some(AbortOnDrop(tokio::spawn(watch)));
                        active
                    })
                });
                activation = Some(Activation { generation, spec: config.spec.clone(), task: AbortOnDrop(task) });
            }
            activated = async { (&mut activation.as_mut().expect("guarded by the condition").task.0).await },
                if activation.is_some() => {
                let Some(Activation { generation, .. }) = activation.take() else { continue };
                let outcome = activated.unwrap_or_else(|failure| {
                    Err(ValidCondition::refused(generation, "ActivationFailed", format!("activation stopped: {failure}")))
                });
                match outcome {
                    Ok(next) => {
                        info!(generation, "configuration activated");
                        if next.spec.log_level != active.as_ref().and_then(|a| a.spec.log_level.clone()) {
                            // Said under the filter that shows it: the old one, or else the new.
                            let level = next.spec.log_level.as_deref();
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
                        // Server names carry over: from the version in force, else from the journal.
                        match (&active, &journal) {
                            (Some(previous), _) => next.renderer.seed_slots(previous.renderer.slots()),
                            (None, Some(journal)) => {
                                let key = config_key.clone();
                                let slots = crate::journal::on_blocking_pool(journal, move |j| Ok(j.slots(&key))).await;
                                // What the journal holds: the first render writes only what it changes.
                                saved_slots = Arc::new(slots.unwrap_or_default());
                                next.renderer.seed_slots(saved_slots.clone());
                            }
                            (None, None) => {}
                        }
                        let settings = debounce_settings(&next.spec);
                        if coalescer.as_ref().is_none_or(|c| c.settings != settings) {
                            coalescer = Some(Coalescer::start(settings, render_tx.clone()));
                        }
                        // The old watches stop when `active` is replaced; the Gateway API status
                        // writer starts over with the version's controller name.
                        admission_tx.send_replace(Some(Arc::new(crate::api::webhook::AdmissionSource {
                            generation,
                            spec: next.spec.clone(),
                            renderer: next.renderer.clone(),
                            view: next.watches.view(),
                        })));
                        active = Some(next);
                        gateway_writer = None;
                        // Another version's templates may take what this one's refused.
                        quarantine = quarantine::Quarantine::new(culprits_tx.clone());
                        api.ready.store(true, std::sync::atomic::Ordering::Release);
                        facts.valid = Some(ValidCondition::accepted(generation));
                        if let Some(coalescer) = &coalescer {
                            coalescer.send(Trigger::Config { generation }).await;
                        }
                    }
                    Err(condition) => {
                        error!(generation, reason = %condition.reason, message = %condition.message,
                               "configuration refused; the previous one stays in force");
                        facts.valid = Some(condition);
                    }
                }
                if writes_status(*leadership.borrow(), &journal) {
                    status.publish(&facts);
                }
            }
            _ = status_tick.tick() => {
                if writes_status(*leadership.borrow(), &journal) {
                    if let (Some(journal), Some(active), Some((files, _))) = (&journal, &active, &last_render) {
                        let pods = pod_facts(journal, &active.watches.all_pods(), files);
                        if let (true, Some(checker)) = (pods.iter().any(|pod| pod.rejected), &culprit_checker)
                            && quarantine.would_search(files)
                        {
                            let job = search_job(active, &mut quarantine, checker, options.max_left_out);
                            quarantine.search(job, files);
                        }
                        facts.pods = Some(pods);
                    }
                    status.publish(&facts);
                    // At most once a tick however many arrived: at 10,000 Ingresses the
                    // controller's own status writes come back as as many changes.
                    if let (false, Some(active), Some((generation, offenders))) =
                        (ingress_status_dirty.is_empty(), &active, &left_out_of_last_render)
                        && *generation == active.generation
                    {
                        let changed = std::mem::take(&mut ingress_status_dirty);
                        ingress_writer.offer(ingress_status_owed(active, offenders, &changed));
                    }
                }
            }
            Some(finished) = culprits_rx.recv() => {
                let (Some(active), Some(coalescer)) = (&active, &coalescer) else { continue };
                if quarantine.hold(active.generation, finished) {
                    coalescer.send(Trigger::Config { generation: active.generation }).await;
                }
            }
            Some(change) = watch_rx.recv() => {
                if let Change::IgnoredFields(object) = change {
                    ingress_status_dirty.insert(object);
                } else if let Some(coalescer) = &coalescer {
                    coalescer.send(Trigger::Watch(change)).await;
                }
            }
            Some(changed) = access_rx.recv() => {
                let Some(active) = active.as_mut().filter(|a| a.generation == changed.generation) else { continue };
                match changed.access {
                    Ok(access) => {
                        info!("the Dataplane credentials changed: deploying with them from now on");
                        active.access = Some(access);
                        // Pods that failed with the old credentials are tried again at once,
                        // not at the end of their backoff.
                        if let (Some(deployer), Some((files, trace))) = (deployer.as_mut(), &last_render) {
                            deploy_render(deployer, active, files.clone(), trace.clone());
                        }
                    }
                    Err(why) => {
                        warn!(%why, "the Dataplane credentials changed into something unusable; the previous ones stay in use");
                    }
                }
            }
            changed = leadership.changed(), if leadership_open => {
                if changed.is_err() {
                    leadership_open = false;
                    continue;
                }
                let now = *leadership.borrow_and_update();
                // A render may have started this term's fleet already (it saw the leadership
                // before this arm did): that fleet stays.
                if deployer.as_ref().is_some_and(|d| now == Leadership::Leader(d.term())) {
                    continue;
                }
                // Losing the lease, or a new term, stops every push at once: in-flight actions
                // are abandoned, and the journal (written before each action) says where each
                // pod was left; the next leader verifies before trusting it.
                if let Some(old) = deployer.take() {
                    old.abort();
                    info!("fleet stopped: all pushes halted");
                }
                if let (Leadership::Leader(term), Some(journal)) = (now, &journal) {
                    let mut fresh = deploy::Deployer::new(journal.clone(), term, fence.clone());
                    if let (Some(active), Some((files, trace))) = (&active, &last_render) {
                        deploy_render(&mut fresh, active, files.clone(), trace.clone());
                    }
                    deployer = Some(fresh);
                }
            }
            Some(triggers) = render_rx.recv() => {
                let Some(active) = &active else { continue };
                let span = reconcile_span(&triggers, active.generation);
                let rendered = render(active, &mut quarantine, triggers, &sink, options.max_left_out).instrument(span.clone()).await;
                let files = match rendered {
                    Ok(Rendered { files, refused, ingresses, offenders }) => {
                        if writes_status(*leadership.borrow(), &journal) {
                            status.announce_refusals(refused);
                            ingress_writer.offer(ingresses);
                        }
                        left_out_of_last_render = Some((active.generation, offenders));
                        files
                    }
                    Err(message) => {
                        facts.render = Some(RenderFact::Failed { message });
                        // Pods that came meanwhile get the last good render: while renders
                        // fail, a new or scaled-up pod is not left unconfigured.
                        if let (Some(deployer), Some((files, trace))) = (deployer.as_mut(), &last_render) {
                            deploy_render(deployer, active, files.clone(), trace.clone());
                        }
                        continue;
                    }
                };
                if let (Some(settings), true) = (&active.spec.gateway_api, writes_status(*leadership.borrow(), &journal)) {
                    let writer = gateway_writer.get_or_insert_with(|| {
                        let (leading, journal) = (leadership.clone(), journal.clone());
                        let may_write = move || writes_status(*leading.borrow(), &journal);
                        gateway_status::GatewayStatusTask::start(client.clone(), settings.controller_name.clone(), may_write)
                    });
                    if let Some(statuses) = active.renderer.gateway_status() {
                        writer.offer(statuses);
                    }
                }
                facts.render = Some(RenderFact::Rendered {
                    files: files.entries().count(),
                    checksum: files.haproxy_cfg.checksum.to_string().chars().take(12).collect(),
                });
                api.set_render(active.generation, Arc::new(files.clone()));
                if let Some(journal) = &journal {
                    let slots = active.renderer.slots();
                    let changes = crate::plan::slots::changes(&saved_slots, &slots);
                    if !changes.is_empty() {
                        // An fsync: on the blocking pool, not this loop's thread.
                        let key = config_key.clone();
                        match crate::journal::on_blocking_pool(journal, move |j| j.put_slot_changes(&key, &changes)).await {
                            Ok(()) => saved_slots = slots,
                            Err(error) => warn!(%error, "could not journal the server slots"),
                        }
                    }
                }
                let trace = TraceParent::of(&span);
                if deployer.is_none()
                    && let (Leadership::Leader(term), Some(journal)) = (*leadership.borrow(), &journal)
                {
                    deployer = Some(deploy::Deployer::new(journal.clone(), term, fence.clone()));
                }
                if let Some(deployer) = deployer.as_mut() {
                    deploy_render(deployer, active, files.clone(), trace.clone());
                }
                last_render = Some((files, trace));
            }
        }
    }
    if let Some(deployer) = deployer {
        deployer.stop().await;
    }
    if let Some((mut task, stop)) = election {
        let _ = stop.send(());
        if tokio::time::timeout(std::time::Duration::from_secs(5), &mut task.0).await.is_err() {
            warn!("the Lease was not handed back within 5s; another replica takes over when it expires");
        }
    }
    if stopping {
        return Ok(());
    }
    Err(ControllerError::ConfigWatchEnded { namespace: options.namespace, name: options.name })
}

/// Whether this replica writes the configuration's status: the leader does, and a
/// render-only replica (which never leads) reports its own renders.
fn writes_status(leadership: Leadership, journal: &Option<Arc<crate::journal::Journal>>) -> bool {
    leadership.is_leader() || journal.is_none()
}

/// The HAProxy pods being deployed to, as their journal records show them against the last render.
fn pod_facts(
    journal: &crate::journal::Journal,
    pods: &[crate::watch::HaproxyPod],
    files: &crate::files::FileSet,
) -> Vec<PodFact> {
    // Called every second: the checksums only, not a copy of the whole render.
    let desired = crate::fleet::deployed_checksums(files);
    pods.iter()
        .filter(|pod| pod.deployable)
        .map(|pod| &pod.info)
        .map(|pod| {
            let record = journal.pod(&crate::pod::PodUid(pod.uid.clone())).ok().flatten();
            let state = record.as_ref().map_or(crate::pod::State::Unknown, |r| r.state);
            let error = record.as_ref().and_then(|r| r.last_transition.error.clone());
            let rejected = error.is_some()
                && state == crate::pod::State::Validating
                && record
                    .as_ref()
                    .is_some_and(|r| r.last_transition.reason == Some(crate::pod::EventKind::ValidationRejected));
            PodFact {
                name: pod.name.clone(),
                state,
                runs_desired: record.as_ref().and_then(|r| r.pushed.as_ref()) == Some(&desired),
                error,
                rejected,
            }
        })
        .collect()
}

/// A search for the objects behind the current render that a pod refused.
fn search_job(
    active: &Active,
    quarantine: &mut quarantine::Quarantine,
    checker: &Arc<dyn crate::admission::Validator>,
    max_culprits: usize,
) -> quarantine::SearchJob {
    let (stores, _) = quarantine.apply(&active.watches.snapshot());
    quarantine::SearchJob {
        generation: active.generation,
        spec: active.spec.clone(),
        renderer: active.renderer.clone(),
        stores,
        pods: active.watches.pods(),
        validator: checker.clone(),
        max_culprits,
    }
}

/// Hands a render to the fleet, when there are credentials to deploy with.
fn deploy_render(
    deployer: &mut deploy::Deployer,
    active: &Active,
    files: crate::files::FileSet,
    trace: Option<TraceParent>,
) {
    match &active.access {
        Some(access) => deployer.deploy(&active.spec, access, files, &active.watches.all_pods(), trace),
        None => warn!("rendered, but there are no Dataplane credentials (or TLS settings) to deploy with"),
    }
}

/// A task stopped when its owner goes.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The debouncer task and its input; replaced when the debounce settings change.
struct Coalescer {
    settings: DebounceSettings,
    input: mpsc::Sender<Trigger>,
    task: tokio::task::JoinHandle<()>,
}

impl Coalescer {
    fn start(settings: DebounceSettings, renders: mpsc::Sender<Vec<Trigger>>) -> Self {
        let (input, changes) = mpsc::channel(1024);
        let task = tokio::spawn(debounce::run(settings, changes, renders));
        Self { settings, input, task }
    }

    async fn send(&self, trigger: Trigger) {
        let _ = self.input.send(trigger).await;
    }
}

impl Drop for Coalescer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn debounce_settings(spec: &HAProxyTemplateConfigSpec) -> DebounceSettings {
    let debounce = &spec.dataplane.debounce;
    DebounceSettings { window: debounce.window.get(), max_delay: debounce.max_delay.get() }
}

/// The replica's election settings with the timings the configuration states, read once at
/// start (every replica of a Lease should renew by the same timings, and a replica only learns
/// them here); the flags' when it states none, cannot be read, or states ones that cannot work.
async fn election_timings(
    configs: &Api<HAProxyTemplateConfig>,
    name: &str,
    flags: crate::election::ElectionSettings,
) -> crate::election::ElectionSettings {
    let stated = match configs.get_opt(name).await {
        Ok(config) => config.and_then(|c| c.spec.leader_election),
        Err(error) => {
            warn!(%error, "the configuration could not be read for its leader election timings; the flags' apply");
            None
        }
    };
    let Some(stated) = stated else { return flags };
    let candidate = crate::election::ElectionSettings {
        duration: stated.lease_duration.get(),
        grace: stated.lease_grace.get(),
        ..flags.clone()
    };
    match candidate.check() {
        Ok(()) => {
            info!(duration = ?candidate.duration, grace = ?candidate.grace, "leader election timings from the configuration");
            candidate
        }
        Err(error) => {
            warn!(%error, "the configuration's leader election timings cannot work; the flags' apply");
            flags
        }
    }
}

/// A configuration version being activated beside the loop.
struct Activation {
    generation: i64,
    spec: HAProxyTemplateConfigSpec,
    task: AbortOnDrop<Result<Active, ValidCondition>>,
}

/// Checks a configuration version and starts its watches; on failure, the condition to report.
async fn activate(
    client: &kube::Client,
    spec: &HAProxyTemplateConfigSpec,
    namespace: &str,
    generation: i64,
    changes: mpsc::Sender<Change>,
    validation_requests: Option<&crate::checks::Requests>,
) -> Result<Active, ValidCondition> {
    let found = problems(spec);
    if !found.is_empty() {
        let message = found.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        return Err(ValidCondition::refused(generation, "InvalidSpec", message));
    }
    let renderer = Renderer::compile(spec)
        .map_err(|error| ValidCondition::refused(generation, "TemplateError", error.to_string()))?;
    // The configuration's own tests, before anything of it is watched or served.
    if !spec.validation_tests.is_empty() {
        let report = crate::checks::run(spec, &renderer, &[], validation_requests).await;
        if !report.passed() {
            return Err(ValidCondition::refused(generation, "ValidationTestFailed", report.summary()));
        }
        let skipped: usize = report.tests.iter().map(|t| t.skipped).sum();
        info!(tests = report.tests.len(), skipped_requests = skipped, "validation tests passed");
    }
    let watches = Watches::start(client.clone(), spec, namespace, changes)
        .await
        .map_err(|error| ValidCondition::refused(generation, "UnknownResource", error.to_string()))?;
    if tokio::time::timeout(SYNC_TIMEOUT, watches.wait_synced()).await.is_err() {
        return Err(ValidCondition::refused(
            generation,
            "WatchNotSynced",
            format!(
                "the watched resources were not all listed within {}s (check RBAC and the API server)",
                SYNC_TIMEOUT.as_secs()
            ),
        ));
    }
    let access = match deploy::access(client, spec, namespace).await {
        Ok(access) => Some(access),
        Err(why) => {
            warn!(%why, "cannot reach the pods' Dataplane APIs; rendering only");
            None
        }
    };
    Ok(Active { generation, spec: spec.clone(), renderer: Arc::new(renderer), watches, access, _secrets_watch: None })
}

/// The root span of one reconciliation: what triggered it (the first change names the
/// object; the count says how many changes the debouncer coalesced).
fn reconcile_span(triggers: &[Trigger], generation: i64) -> tracing::Span {
    let span = info_span!(
        "reconcile",
        haptic.trigger = Empty,
        haptic.trigger.count = triggers.len(),
        haptic.config.generation = generation,
        k8s.resource.kind = Empty,
        k8s.namespace.name = Empty,
        k8s.resource.name = Empty,
    );
    match triggers.first() {
        Some(Trigger::Watch(Change::Applied(object) | Change::Deleted(object))) => {
            span.record("haptic.trigger", tracing::field::display(&triggers[0]));
            span.record("k8s.resource.kind", object.kind.as_ref() as &str);
            span.record("k8s.namespace.name", object.key.namespace.as_ref() as &str);
            span.record("k8s.resource.name", object.key.name.as_ref() as &str);
        }
        Some(trigger) => {
            span.record("haptic.trigger", tracing::field::display(trigger));
        }
        None => {}
    }
    span
}

/// What a render gives the loop besides its files.
struct Rendered {
    /// The files to deploy.
    files: crate::files::FileSet,
    /// Objects the render left out, for their Events.
    refused: Vec<status::Refusal>,
    /// Ingress statuses to write.
    ingresses: Vec<ingress_status::IngressStatusChange>,
    /// The objects the render left out, which are not served (their status says nothing).
    offenders: Vec<crate::store::ObjectRef>,
}

/// Ingress statuses that differ from what the last render decided, from the stores as they are
/// now: a change in ignored fields only (`ignoreFields`, a status another writer changed) asks
/// for no render, so the status writer reads it here.
fn ingress_status_owed(
    active: &Active,
    offenders: &[crate::store::ObjectRef],
    changed: &std::collections::HashSet<crate::store::ObjectRef>,
) -> Vec<ingress_status::IngressStatusChange> {
    let Some(settings) = &active.spec.ingress_status else { return Vec::new() };
    let stores = active.watches.snapshot();
    let pod_ips: Vec<String> =
        active.watches.pods().iter().map(|pod| pod.ip.clone()).filter(|ip| !ip.is_empty()).collect();
    ingress_status::changes_among(&stores, settings, &pod_ips, offenders, Some(changed))
}

/// Renders the active configuration from the current stores, off the async threads.
async fn render(
    active: &Active,
    quarantine: &mut quarantine::Quarantine,
    triggers: Vec<Trigger>,
    sink: &RenderSink,
    max_left_out: usize,
) -> Result<Rendered, String> {
    let renderer = active.renderer.clone();
    let stores_before = active.watches.snapshot();
    let (stores, held_out) = quarantine.apply(&stores_before);
    let started = std::time::Instant::now();
    let pods = active.watches.pods();
    let pod_ips: Vec<String> = pods.iter().map(|pod| pod.ip.clone()).filter(|ip| !ip.is_empty()).collect();
    let span = info_span!(
        "render",
        haptic.files = Empty,
        haptic.left_out = Empty,
        otel.status_code = Empty,
        otel.status_message = Empty
    );
    let result = tokio::task::spawn_blocking(move || renderer.render_leaving_out(&stores, &pods, max_left_out))
        .instrument(span.clone())
        .await;
    match &result {
        Ok(Ok((files, left_out))) => {
            span.record("haptic.files", files.entries().count());
            span.record("haptic.left_out", left_out.len());
        }
        Ok(Err(error)) => {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_message", tracing::field::display(error));
        }
        Err(_) => {
            span.record("otel.status_code", "ERROR");
        }
    }
    drop(span);
    let elapsed = started.elapsed();
    let metrics = crate::telemetry::metrics::metrics();
    metrics.render_seconds.observe(elapsed.as_secs_f64());
    let trigger = match triggers.first() {
        Some(Trigger::Watch(Change::Pods)) => "pods",
        Some(Trigger::Watch(_)) => "watch",
        _ => "config",
    };
    metrics.reconciliations.get_or_create(&crate::telemetry::metrics::TriggerLabels { trigger }).inc();
    let outcome = |outcome| crate::telemetry::metrics::OutcomeLabels { outcome };
    metrics.renders.get_or_create(&outcome(if matches!(result, Ok(Ok(_))) { "ok" } else { "error" })).inc();
    // Renders of the active configuration run one at a time, and only kept ones set this.
    let blocks = active.renderer.last_block_counts();
    if let Ok(Ok(_)) = &result {
        metrics.render_blocks.get_or_create(&outcome("reused")).inc_by(blocks.reused);
        metrics.render_blocks.get_or_create(&outcome("rendered")).inc_by(blocks.rendered);
    }
    let triggers: Vec<String> = triggers.iter().map(ToString::to_string).collect();
    match result {
        Ok(Ok((files, mut left_out))) => {
            left_out.extend(held_out);
            for error in &left_out {
                warn!(%error, "left an object out of the render");
            }
            sink.record(active.generation, &files, &triggers, left_out.len(), elapsed, blocks);
            let refused = left_out.iter().filter_map(|error| status::Refusal::of(&stores_before, error)).collect();
            let offenders: Vec<_> = left_out.iter().filter_map(|e| e.offending_object().cloned()).collect();
            let ingresses = match &active.spec.ingress_status {
                Some(settings) => ingress_status::changes(&stores_before, settings, &pod_ips, &offenders),
                None => Vec::new(),
            };
            Ok(Rendered { files, refused, ingresses, offenders })
        }
        Ok(Err(error)) => {
            error!(%error, "render failed; the last good files stay in force");
            Err(error.to_string())
        }
        Err(panic) => {
            error!(%panic, "render task failed");
            Err(format!("the render task failed: {panic}"))
        }
    }
}
