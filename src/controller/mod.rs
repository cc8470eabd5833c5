//! Controller: the async shell that wires the pipeline together for one `HAProxyTemplateConfig`.
//!
//! It follows the configuration resource (a new valid version takes effect at once, an invalid
//! one is reported in its status while the previous one keeps working), keeps the watches of the
//! active version running, renders when watched changes, coalesced by the debouncer, call for
//! it, and (as the leader) deploys each render to the pods through the fleet. The loop here only
//! waits and dispatches; `handlers.rs` holds the state and one handler per event, and every
//! task the controller starts runs under one `TaskTree`, stopped and awaited on the way out.

mod activation;
pub mod credentials;
mod deploy;
mod gateway_services;
mod gateway_status;
mod handlers;
mod ingress_status;
mod output;
mod quarantine;
mod rendering;
mod status;
mod writers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use thiserror::Error;
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use crate::config::HAProxyTemplateConfig;
use crate::election::{Fence, Leadership};
use crate::journal::Journal;
use crate::pod::LeaderTerm;
use crate::tasks::{OwnedTask, TaskTree};
use crate::watch::Change;
use handlers::{Controller, Inbox, Leading};

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
    JournalOpenPanicked(#[source] tokio::task::JoinError),
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
    tasks: &TaskTree,
) -> Result<OwnedTask, ControllerError> {
    let address = listener.local_addr()?;
    let config = match tls {
        ApiTls::Plaintext => {
            info!(%address, scheme = "http", "HTTP API listening");
            return Ok(tasks.spawn("HTTP API", async move {
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
    Ok(tasks.spawn("HTTP API", crate::api::serve_tls(listener, config, api)))
}

/// Follows one configuration, renders and (as the leader) deploys until `shutdown` completes;
/// then it lets in-flight actions finish their step and hands the Lease back, so another
/// replica takes over at once rather than after the lease duration.
pub async fn run(
    client: kube::Client,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ControllerError> {
    let tasks = TaskTree::default();
    let outcome = run_under(client, options, shutdown, &tasks).await;
    tasks.close(Duration::from_secs(5)).await;
    outcome
}

/// [`run`], with every task it starts under `tasks`.
async fn run_under(
    client: kube::Client,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()>,
    tasks: &TaskTree,
) -> Result<(), ControllerError> {
    let journal = open_journal(&options).await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &options.namespace);
    let (leading, election) = start_leading(&client, &configs, &options, &journal, tasks).await;
    let selector = format!("metadata.name={}", options.name);
    let config_watch = watcher::watcher(configs, watcher::Config::default().fields(&selector))
        .backoff(crate::watch::reconnect_backoff())
        .boxed();
    let (mut controller, mut inbox) =
        Controller::new(client, options.clone(), config_watch, journal, leading, tasks.clone());
    let _listeners = serve_listeners(&options, &controller, tasks).await?;
    let stopping = serve(&mut controller, &mut inbox, shutdown).await;
    controller.stop_fleet().await;
    if let Some(election) = election {
        election.hand_back().await;
    }
    if stopping {
        return Ok(());
    }
    Err(ControllerError::ConfigWatchEnded { namespace: options.namespace, name: options.name })
}

/// The loop: waits for the next event and hands it to its handler, until `shutdown` completes
/// (true) or the configuration watch ends (false).
async fn serve(
    controller: &mut Controller,
    inbox: &mut Inbox,
    shutdown: impl std::future::Future<Output = ()>,
) -> bool {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Liveness: the loop turns at least once a status tick; a wedged one fails /healthz.
        controller.api.heartbeat.beat();
        let leadership_open = controller.leadership_open();
        tokio::select! {
            () = &mut shutdown => return true,
            event = inbox.config_watch.next() => match event {
                Some(event) => controller.on_config(event),
                None => return false,
            },
            outcome = activation::outcome_of(&mut controller.activation), if controller.activation.is_some() => {
                controller.on_activated(outcome).await;
            }
            _ = inbox.status_tick.tick() => controller.on_status_tick(),
            Some(finished) = inbox.culprits.recv() => controller.on_culprits(finished).await,
            Some(change) = inbox.changes.recv() => controller.on_change(change).await,
            Some(changed) = inbox.access.recv() => controller.on_access(changed),
            changed = controller.leading.leadership.changed(), if leadership_open => controller.on_leadership(changed.is_ok()),
            Some(triggers) = inbox.renders.recv() => controller.on_render(triggers).await,
        }
    }
}

/// Opens the journal, when there is one. Opening waits for the previous owner's lock (sleeping
/// between tries) and reads the whole store: the blocking pool's work, not an async worker's.
async fn open_journal(options: &ControllerOptions) -> Result<Option<Arc<Journal>>, ControllerError> {
    let Some(dir) = &options.journal_dir else { return Ok(None) };
    let (dir, retention) = (dir.clone(), options.journal_retention);
    let opened = tokio::task::spawn_blocking(move || Journal::open(&dir, retention))
        .await
        .map_err(ControllerError::JournalOpenPanicked)?;
    let (journal, report) = opened?;
    if let Some((aside, why)) = &report.moved_aside {
        warn!(moved_to = %aside.display(), %why, "the journal was unreadable; every pod will be verified");
    }
    Ok(Some(Arc::new(journal)))
}

/// The leader election's task, asked to hand the Lease back on the way out.
struct Election {
    _task: OwnedTask,
    ended: oneshot::Receiver<()>,
    stop: oneshot::Sender<()>,
}

impl Election {
    /// Hands the Lease back, waiting up to 5 s.
    async fn hand_back(self) {
        let _ = self.stop.send(());
        if tokio::time::timeout(Duration::from_secs(5), self.ended).await.is_err() {
            warn!("the Lease was not handed back within 5s; another replica takes over when it expires");
        }
    }
}

/// Who deploys. Only the leader does; without election a replica with a journal leads alone,
/// term 0, and one without a journal never does. Every write to a pod asks the fence, which
/// the election grants only until the lease could lapse.
async fn start_leading(
    client: &kube::Client,
    configs: &Api<HAProxyTemplateConfig>,
    options: &ControllerOptions,
    journal: &Option<Arc<Journal>>,
    tasks: &TaskTree,
) -> (Leading, Option<Election>) {
    let (leadership_tx, leadership) = watch::channel(Leadership::Follower);
    let settings = match (&options.election, journal) {
        (Some(settings), Some(_)) => settings.clone(),
        (None, Some(_)) => {
            crate::telemetry::metrics::metrics().leader.set(1);
            leadership_tx.send_replace(Leadership::Leader(LeaderTerm::default()));
            let fence = Fence::unbounded(LeaderTerm::default());
            let solo = Some(leadership_tx);
            return (Leading { leadership, fence: Arc::new(fence), _solo: solo }, None);
        }
        (_, None) => {
            let solo = Some(leadership_tx);
            return (Leading { leadership, fence: Arc::new(Fence::default()), _solo: solo }, None);
        }
    };
    let settings = election_timings(configs, &options.name, settings).await;
    info!(lease = %settings.lease_name, identity = %settings.identity, "leader election on");
    let (stop, stopped) = oneshot::channel();
    let fence = Arc::new(Fence::default());
    let election = crate::election::run(client.clone(), settings, leadership_tx, fence.clone(), stopped);
    let (task, ended) = tasks.spawn_returning("leader election", election);
    (Leading { leadership, fence, _solo: None }, Some(Election { _task: task, ended, stop }))
}

/// Starts the HTTP API, the admission webhook and health, as the options ask.
async fn serve_listeners(
    options: &ControllerOptions,
    controller: &Controller,
    tasks: &TaskTree,
) -> Result<Vec<OwnedTask>, ControllerError> {
    let mut listeners = Vec::new();
    let api = controller.api.clone();
    if let Some(address) = options.api_address {
        let listener = crate::api::bind(address, "the HTTP API").await?;
        listeners.push(serve_api(listener, &options.api_tls, api.clone(), tasks)?);
    }
    // The admission webhook judges against the version in force, published at each activation.
    if let Some(settings) = &options.webhook {
        let config = (options.namespace.clone(), options.name.clone());
        let (address, serving) = crate::api::webhook::serve(settings, config, controller.admission_source()).await?;
        info!(%address, validator = ?settings.validator, "admission webhook listening");
        listeners.push(tasks.spawn("admission webhook", serving));
    }
    if let Some(address) = options.health_address {
        let listener = crate::api::bind(address, "health").await?;
        info!(address = %listener.local_addr()?, "health listening");
        listeners.push(tasks.spawn("health", async move {
            if let Err(error) = crate::api::serve_health(listener, api).await {
                tracing::error!(%error, "health stopped");
            }
        }));
    }
    Ok(listeners)
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
