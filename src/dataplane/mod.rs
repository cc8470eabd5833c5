//! Dataplane client: the only way haptic talks to an HAProxy pod, through the HAProxy
//! Dataplane API v3 sidecar (HTTP Basic auth, base path `/v3`).
//!
//! A thin adapter: it sends requests and turns answers into typed values; deciding what to
//! send belongs to the planner and the pod state machines. Parsing of answers is done by
//! pure functions in [`answers`] so it can be tested without a server.

pub mod answers;
pub mod body;
pub mod tls;

use std::fmt;
use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use thiserror::Error;

pub use answers::{ApiInfo, ConfigVersion, Health, Reload, ReloadId, ReloadStatus, RuntimeServer, StoredConfig};
pub use body::ConfigBody;
pub use tls::{TlsSettings, TlsSettingsError};

/// Where a pod's Dataplane API answers, e.g. `http://10.0.0.7:5555/v3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    base: Url,
}

impl Endpoint {
    /// Parses a base URL; a missing trailing slash is added so relative paths join below it.
    pub fn parse(base: &str) -> Result<Self, DataplaneError> {
        let with_slash = if base.ends_with('/') { base.to_owned() } else { format!("{base}/") };
        let base = Url::parse(&with_slash)
            .map_err(|source| DataplaneError::InvalidEndpoint { endpoint: base.to_owned(), source })?;
        Ok(Self { base })
    }

    /// The endpoint of a pod reached at `ip:port`, as the controller computes it from a Pod.
    pub fn for_pod(ip: std::net::IpAddr, port: u16) -> Self {
        let host = match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        };
        // A formatted IP and port always make a valid URL.
        let base = Url::parse(&format!("http://{host}:{port}/v3/")).expect("an IP and a port form a valid URL");
        Self { base }
    }

    fn join(&self, path: &str) -> Url {
        // Paths are constants of this module and never absolute, so joining cannot fail.
        self.base.join(path).expect("relative API path")
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.base.as_str().trim_end_matches('/'))
    }
}

/// HTTP Basic credentials; the password never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    password: String,
}

impl Credentials {
    /// Builds credentials from a user name and password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self { username: username.into(), password: password.into() }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

/// A client's credentials: those it sends, and the other ones of a rotation, if any.
#[derive(Debug)]
struct Rollover {
    current: Credentials,
    other: Option<Credentials>,
}

impl Rollover {
    fn shared(current: Credentials) -> std::sync::Arc<std::sync::Mutex<Self>> {
        std::sync::Arc::new(std::sync::Mutex::new(Self { current, other: None }))
    }

    /// Sends the other credentials from now on (the pod refused these); gives them, if any.
    fn switch(&mut self) -> Option<Credentials> {
        let other = self.other.take()?;
        self.other = Some(std::mem::replace(&mut self.current, other));
        Some(self.current.clone())
    }
}

/// The `Authorization` header of HTTP Basic `credentials`, marked sensitive.
fn basic_authorization(credentials: &Credentials) -> Option<reqwest::header::HeaderValue> {
    use base64::Engine as _;
    let pair = format!("{}:{}", credentials.username, credentials.password);
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// What every pod's Dataplane API is reached with: credentials and, optionally, TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// HTTP Basic credentials.
    pub credentials: Credentials,
    /// The credentials before a rotation, still accepted by the pods that started with them:
    /// a pod refusing `credentials` is asked with these (and then keeps being asked with them
    /// until it refuses them), so a rotation locks no pod out before it is rolled.
    pub previous_credentials: Option<Credentials>,
    /// TLS settings; clear text when absent.
    pub tls: Option<TlsSettings>,
    /// How long one request may take (30 s when absent): `spec.dataplane.deploymentTimeout`.
    pub request_timeout: Option<Duration>,
}

impl Access {
    /// Clear-text access with these credentials.
    pub fn plain(credentials: Credentials) -> Self {
        Self { credentials, previous_credentials: None, tls: None, request_timeout: None }
    }

    /// The URL scheme pods are reached with.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// A client for one pod's endpoint.
    pub fn client(&self, endpoint: Endpoint) -> Result<DataplaneClient, DataplaneError> {
        let client = match &self.tls {
            Some(tls) => DataplaneClient::with_tls(endpoint, self.credentials.clone(), tls)?,
            None => DataplaneClient::new(endpoint, self.credentials.clone()),
        };
        let client = client.with_previous_credentials(self.previous_credentials.clone());
        Ok(match self.request_timeout {
            Some(timeout) => client.with_timeout(timeout),
            None => client,
        })
    }
}

/// How an empty map is stored when it replaces one with entries (see `put_storage`).
const EMPTY_MAP_AS_STORED: &str = "\n";

/// How a reload awaited with `await_reload` ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadEnd {
    /// HAProxy runs the new configuration.
    Succeeded,
    /// HAProxy refused it (its output); the Dataplane API restored the last good file.
    Failed(String),
    /// Still queued or running when the wait ended.
    StillRunning,
}

/// The kinds of auxiliary file storage the Dataplane API keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StorageKind {
    /// Map files (`maps_dir`).
    Maps,
    /// General files such as error pages (`general_storage_dir`).
    General,
    /// TLS certificates with their keys (`ssl_certs_dir`); the API lists them but never gives
    /// their content back.
    Certificates,
}

impl StorageKind {
    fn path(self) -> &'static str {
        match self {
            Self::Maps => "services/haproxy/storage/maps",
            Self::General => "services/haproxy/storage/general",
            Self::Certificates => "services/haproxy/storage/ssl_certificates",
        }
    }
}

/// What a raw configuration push should do beyond writing the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushMode {
    /// Only run `haproxy -c` on the pod; nothing is written.
    ValidateOnly,
    /// Write the file and let the Dataplane API queue a reload.
    Reload,
    /// Write the file and reload at once (the answer waits for the reload).
    ForceReload,
}

/// The answer to a raw configuration push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    /// `only_validate`: HAProxy accepted the configuration; nothing changed on the pod.
    Valid,
    /// The file was written, as stored here, and no reload is pending (or a forced reload
    /// already ran).
    Applied(StoredConfig),
    /// The file was written, as stored here, and a reload was queued under this id.
    ReloadQueued(ReloadId, StoredConfig),
}

/// Errors talking to one Dataplane API, each naming the endpoint it concerns.
#[derive(Debug, Error)]
pub enum DataplaneError {
    /// The endpoint URL could not be parsed.
    #[error("invalid Dataplane API endpoint {endpoint:?}: {source}")]
    InvalidEndpoint {
        /// The text that failed to parse.
        endpoint: String,
        /// Why it failed.
        source: url::ParseError,
    },
    /// The request did not get an HTTP answer (connection refused, timeout, a TLS handshake
    /// refused, ...).
    #[error("Dataplane API {endpoint} unreachable ({method} {path}): {cause}")]
    Unreachable {
        /// The pod's endpoint.
        endpoint: String,
        /// The HTTP method.
        method: Method,
        /// The API path below `/v3`.
        path: String,
        /// The transport error with all its causes (a TLS failure's reason is the last one).
        cause: String,
    },
    /// The write was not sent: this replica may not write to pods now (see [`WriteGuard`]).
    #[error("Dataplane API {endpoint}: {method} {path} not sent: {reason}")]
    Fenced {
        /// The pod's endpoint.
        endpoint: String,
        /// The HTTP method.
        method: Method,
        /// The API path below `/v3`.
        path: String,
        /// Why.
        reason: String,
    },
    /// A client for this endpoint cannot be built with the TLS settings given.
    #[error("Dataplane API {endpoint}: cannot set up TLS: {detail}")]
    TlsSetup {
        /// The pod's endpoint.
        endpoint: String,
        /// What is wrong.
        detail: String,
    },
    /// The pod's HAProxy refused the configuration (`haproxy -c` failed); `message` holds its output.
    #[error("Dataplane API {endpoint} rejected the configuration: {message}")]
    InvalidConfiguration {
        /// The pod's endpoint.
        endpoint: String,
        /// HAProxy's own message, including the offending line.
        message: String,
    },
    /// The configuration version sent does not match the pod's (someone else wrote in between).
    #[error("Dataplane API {endpoint}: configuration version conflict (sent {sent})")]
    VersionConflict {
        /// The pod's endpoint.
        endpoint: String,
        /// The version the push was based on.
        sent: ConfigVersion,
    },
    /// The storage refused a file's content (a certificate it cannot parse: v3.2.7 answers 500
    /// with the parser's message): the render's fault, told as HAProxy's refusals are.
    #[error("Dataplane API {endpoint} refuses the file '{name}': {message}")]
    FileRefused {
        /// The pod's endpoint.
        endpoint: String,
        /// The file's name in the storage.
        name: String,
        /// The API's message.
        message: String,
    },
    /// Wrong credentials.
    #[error("Dataplane API {endpoint} refused the credentials of user {username:?}")]
    Unauthorized {
        /// The pod's endpoint.
        endpoint: String,
        /// The user that was refused.
        username: String,
    },
    /// Any other unexpected status.
    #[error("Dataplane API {endpoint} answered {status} to {method} {path}: {body}")]
    UnexpectedStatus {
        /// The pod's endpoint.
        endpoint: String,
        /// The HTTP method.
        method: Method,
        /// The API path below `/v3`.
        path: String,
        /// The status received.
        status: StatusCode,
        /// The start of the answer's body.
        body: String,
    },
    /// The answer could not be understood.
    #[error("Dataplane API {endpoint}: unreadable answer to {path}: {detail}")]
    UnreadableAnswer {
        /// The pod's endpoint.
        endpoint: String,
        /// The API path below `/v3`.
        path: String,
        /// What was wrong with it.
        detail: answers::AnswerError,
    },
}

/// Asked before every write (any request but a GET): whether it may go out, and how long it
/// may take at most (`None`: no limit beyond the usual timeout). Leader election implements it,
/// so a replica whose lease may lapse writes nothing, and no write outlives the lease.
pub trait WriteGuard: Send + Sync + fmt::Debug {
    /// `Ok(limit)` to send within `limit`; `Err(reason)` to send nothing.
    fn allow(&self) -> Result<Option<Duration>, String>;
}

/// A client for one pod's Dataplane API.
#[derive(Debug, Clone)]
pub struct DataplaneClient {
    /// The pod's address, as messages name it.
    endpoint: Endpoint,
    /// Where requests go: the endpoint, or with TLS to a server name, that name (resolved to
    /// the endpoint's address by the client itself).
    request_base: Url,
    /// The credentials sent, and the other ones of a rotation, shared by the client's clones.
    credentials: std::sync::Arc<std::sync::Mutex<Rollover>>,
    http: reqwest::Client,
    /// TLS without a client certificate: a connection closed during the exchange is most
    /// likely a Dataplane API that requires one (it closes without saying why).
    may_lack_client_certificate: bool,
    /// Asked before every write, when set.
    guard: Option<std::sync::Arc<dyn WriteGuard>>,
    /// How long one request may take.
    timeout: Duration,
}

/// The `User-Agent` of every request: `haptic/<version> (<replica>)`, so a pod's access log
/// says which replica wrote what.
static USER_AGENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Names this replica in the `User-Agent` of its Dataplane requests (once, at start).
pub fn set_replica_name(replica: &str) {
    let printable: String = replica.chars().filter(|c| c.is_ascii_graphic()).take(63).collect();
    let _ = USER_AGENT.set(format!("haptic/{} ({printable})", env!("CARGO_PKG_VERSION")));
    let _ = REPLICA.set(printable);
}

/// This replica's name, as `set_replica_name` was given it.
static REPLICA: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The field manager of this replica's status writes (`haptic@<replica>`): an object's
/// `managedFields` then say which replica wrote its status.
pub fn status_field_manager() -> String {
    match REPLICA.get() {
        Some(replica) if !replica.is_empty() => format!("haptic@{replica}"),
        _ => "haptic".to_owned(),
    }
}

/// Longest accepted wait for one Dataplane API call; a forced reload is the slowest.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of an unexpected body is kept in an error.
const ERROR_BODY_LIMIT: usize = 2048;

impl DataplaneClient {
    /// Builds a clear-text client (or one checking `https` endpoints against the system's
    /// roots); the HTTP connection pool is shared by all its calls.
    pub fn new(endpoint: Endpoint, credentials: Credentials) -> Self {
        let http = Self::builder().build().unwrap_or_else(|_| reqwest::Client::new());
        let request_base = endpoint.base.clone();
        Self {
            endpoint,
            request_base,
            credentials: Rollover::shared(credentials),
            http,
            may_lack_client_certificate: false,
            guard: None,
            timeout: REQUEST_TIMEOUT,
        }
    }

    /// Builds a client speaking TLS with these settings: `https` whatever the endpoint's scheme
    /// said, the pod's certificate checked against the settings' CA bundle only.
    pub fn with_tls(
        mut endpoint: Endpoint,
        credentials: Credentials,
        settings: &TlsSettings,
    ) -> Result<Self, DataplaneError> {
        let setup_error =
            |endpoint: &Endpoint, detail: String| DataplaneError::TlsSetup { endpoint: endpoint.to_string(), detail };
        // Only http and https URLs reach here, and both may change to https.
        let _ = endpoint.base.set_scheme("https");
        let mut request_base = endpoint.base.clone();
        let mut builder = Self::builder().tls_certs_only(settings.roots.iter().cloned());
        if let Some(identity) = &settings.identity {
            builder = builder.identity(identity.clone());
        }
        if let Some(name) = &settings.server_name {
            let ip = match endpoint.base.host() {
                Some(url::Host::Ipv4(v4)) => std::net::IpAddr::V4(v4),
                Some(url::Host::Ipv6(v6)) => std::net::IpAddr::V6(v6),
                _ => return Err(setup_error(&endpoint, format!("server name {name:?} needs an endpoint given by IP"))),
            };
            let port = endpoint.base.port_or_known_default().unwrap_or(443);
            request_base
                .set_host(Some(name))
                .map_err(|e| setup_error(&endpoint, format!("server name {name:?}: {e}")))?;
            builder = builder.resolve(name, std::net::SocketAddr::new(ip, port));
        }
        let http = builder.build().map_err(|e| setup_error(&endpoint, tls::error_chain(&e)))?;
        let may_lack_client_certificate = settings.identity.is_none();
        Ok(Self {
            endpoint,
            request_base,
            credentials: Rollover::shared(credentials),
            http,
            may_lack_client_certificate,
            guard: None,
            timeout: REQUEST_TIMEOUT,
        })
    }

    /// This client, asking with `previous` when the pod refuses its credentials (a rotation's
    /// old ones, which a pod not yet rolled still holds).
    pub fn with_previous_credentials(self, previous: Option<Credentials>) -> Self {
        if let Ok(mut rollover) = self.credentials.lock() {
            rollover.other = previous.filter(|previous| *previous != rollover.current);
        }
        self
    }

    /// The credentials sent now.
    fn sent_credentials(&self) -> Credentials {
        self.credentials
            .lock()
            .map(|r| r.current.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().current.clone())
    }

    /// This client, giving each request at most `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// This client, asking `guard` before every write.
    pub fn guarded(mut self, guard: std::sync::Arc<dyn WriteGuard>) -> Self {
        self.guard = Some(guard);
        self
    }

    fn builder() -> reqwest::ClientBuilder {
        let agent = USER_AGENT.get().cloned().unwrap_or_else(|| format!("haptic/{}", env!("CARGO_PKG_VERSION")));
        reqwest::Client::builder().timeout(REQUEST_TIMEOUT).connect_timeout(Duration::from_secs(5)).user_agent(agent)
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// `GET /info`: the Dataplane API's version and build.
    pub async fn info(&self) -> Result<ApiInfo, DataplaneError> {
        let (_, body) = self.send_expecting(Method::GET, "info", None, &[StatusCode::OK]).await?;
        answers::parse_info(&body).map_err(|detail| self.unreadable("info", detail))
    }

    /// `GET /health`: whether HAProxy is up, as the Dataplane API sees it.
    pub async fn health(&self) -> Result<Health, DataplaneError> {
        let (_, body) = self.send_expecting(Method::GET, "health", None, &[StatusCode::OK]).await?;
        answers::parse_health(&body).map_err(|detail| self.unreadable("health", detail))
    }

    /// `GET /services/haproxy/runtime/info`: HAProxy's own process information (version, uptime, reloads).
    pub async fn runtime_info(&self) -> Result<serde_json::Value, DataplaneError> {
        let path = "services/haproxy/runtime/info";
        let (_, body) = self.send_expecting(Method::GET, path, None, &[StatusCode::OK]).await?;
        serde_json::from_str(&body).map_err(|e| self.unreadable(path, answers::not_json(&e, &body)))
    }

    /// `GET /services/haproxy/configuration/version`.
    pub async fn configuration_version(&self) -> Result<ConfigVersion, DataplaneError> {
        let path = "services/haproxy/configuration/version";
        let (_, body) = self.send_expecting(Method::GET, path, None, &[StatusCode::OK]).await?;
        answers::parse_version(&body).map_err(|detail| self.unreadable(path, detail))
    }

    /// `GET /services/haproxy/configuration/raw`: the configuration file as the pod has it.
    pub async fn raw_configuration(&self) -> Result<StoredConfig, DataplaneError> {
        let path = "services/haproxy/configuration/raw";
        let (headers, body) = self.send_expecting(Method::GET, path, None, &[StatusCode::OK]).await?;
        let header = headers.get("Configuration-Version").and_then(|v| v.to_str().ok());
        StoredConfig::from_text(body, header).map_err(|detail| self.unreadable(path, detail))
    }

    /// `POST /services/haproxy/configuration/raw`: validates or replaces the whole configuration.
    ///
    /// `version` is the pod's current configuration version; a mismatch is
    /// [`DataplaneError::VersionConflict`] and nothing is written.
    pub async fn push_raw(
        &self,
        config: impl Into<ConfigBody>,
        version: ConfigVersion,
        mode: PushMode,
    ) -> Result<PushOutcome, DataplaneError> {
        let mut query = vec![("version", version.0.to_string())];
        match mode {
            PushMode::ValidateOnly => query.push(("only_validate", "true".into())),
            PushMode::Reload => {}
            PushMode::ForceReload => query.push(("force_reload", "true".into())),
        }
        self.send_raw(config.into(), version, mode, query, None).await
    }

    /// Writes the configuration without a reload and applies `actions` (the
    /// `X-Runtime-Actions` header) to the running HAProxy through its Runtime API.
    pub async fn push_raw_runtime(
        &self,
        config: impl Into<ConfigBody>,
        version: ConfigVersion,
        actions: &str,
    ) -> Result<PushOutcome, DataplaneError> {
        let query = vec![("version", version.0.to_string()), ("skip_reload", "true".into())];
        let header = (!actions.is_empty()).then(|| actions.to_owned());
        self.send_raw(config.into(), version, PushMode::Reload, query, header).await
    }

    async fn send_raw(
        &self,
        config: ConfigBody,
        version: ConfigVersion,
        mode: PushMode,
        query: Vec<(&str, String)>,
        runtime_actions: Option<String>,
    ) -> Result<PushOutcome, DataplaneError> {
        let path = "services/haproxy/configuration/raw";
        // A final newline is not needed: the API stores its own layout of the file either way.
        // The body shares the render's text (see `body`): at 10,000 Ingresses it is 1.5 MB,
        // for each pod being pushed to.
        let mut request = self
            .request(Method::POST, path)
            .query(&query)
            .header(reqwest::header::CONTENT_TYPE, "text/plain")
            .body(config.with_a_newline().into_request_body());
        if let Some(actions) = runtime_actions {
            request = request.header("X-Runtime-Actions", actions);
        }
        let response = self.execute(request, Method::POST, path).await?;
        let status = response.status();
        let reload_id = response.headers().get("Reload-ID").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let header = response.headers().get("Configuration-Version").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let text = response.text().await.unwrap_or_default();
        // A write answers with the file as now stored (see `PostRawConfigurationHandlerImpl`).
        let stored = |text: String| {
            StoredConfig::from_text(text, header.as_deref()).map_err(|detail| self.unreadable(path, detail))
        };
        match (status, mode) {
            (StatusCode::ACCEPTED, PushMode::ValidateOnly) => Ok(PushOutcome::Valid),
            (StatusCode::ACCEPTED, _) => match reload_id {
                Some(id) => Ok(PushOutcome::ReloadQueued(ReloadId(id), stored(text)?)),
                None => Ok(PushOutcome::Applied(stored(text)?)),
            },
            (StatusCode::CREATED | StatusCode::OK, _) => Ok(PushOutcome::Applied(stored(text)?)),
            (StatusCode::BAD_REQUEST, _) => Err(DataplaneError::InvalidConfiguration {
                endpoint: self.endpoint.to_string(),
                message: answers::error_message(&text),
            }),
            (StatusCode::CONFLICT, _) => {
                Err(DataplaneError::VersionConflict { endpoint: self.endpoint.to_string(), sent: version })
            }
            _ => Err(self.unexpected(Method::POST, path, status, &text)),
        }
    }

    /// `GET /services/haproxy/runtime/backends/{backend}/servers/{server}`: a server as the
    /// running HAProxy has it (address, port, administrative state).
    pub async fn runtime_server(&self, backend: &str, server: &str) -> Result<RuntimeServer, DataplaneError> {
        let path = format!("services/haproxy/runtime/backends/{}/servers/{}", segment(backend), segment(server));
        let (_, body) = self.send_expecting(Method::GET, &path, None, &[StatusCode::OK]).await?;
        answers::parse_runtime_server(&body).map_err(|detail| self.unreadable(&path, detail))
    }

    /// `add server`: a server the running backend does not have (it starts in maintenance).
    pub async fn add_runtime_server(
        &self,
        backend: &str,
        server: &str,
        address: &str,
        port: u16,
        weight: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let path = format!("services/haproxy/runtime/backends/{}/servers", segment(backend));
        let mut body = serde_json::json!({"name": server, "address": address, "port": port});
        if let Some(weight) = weight {
            body["weight"] = serde_json::json!(weight);
        }
        self.send_json(Method::POST, &path, body.to_string(), &[StatusCode::CREATED]).await
    }

    /// `del server`: removes a server out of traffic from the running backend.
    pub async fn delete_runtime_server(&self, backend: &str, server: &str) -> Result<(), DataplaneError> {
        let path = format!("services/haproxy/runtime/backends/{}/servers/{}", segment(backend), segment(server));
        self.send_expecting(Method::DELETE, &path, None, &[StatusCode::NO_CONTENT]).await.map(|_| ())
    }

    /// Puts a running server in traffic (`ready`) or out of it (`maint`).
    pub async fn set_runtime_server_state(
        &self,
        backend: &str,
        server: &str,
        state: &str,
    ) -> Result<(), DataplaneError> {
        let path = format!("services/haproxy/runtime/backends/{}/servers/{}", segment(backend), segment(server));
        let body = serde_json::json!({"admin_state": state}).to_string();
        self.send_json(Method::PUT, &path, body, &[StatusCode::OK]).await
    }

    /// `GET /services/haproxy/runtime/maps/{map}/entries`: a map as the running HAProxy has it.
    pub async fn runtime_map_entries(&self, map: &str) -> Result<Vec<(String, String)>, DataplaneError> {
        let path = format!("services/haproxy/runtime/maps/{}/entries", segment(map));
        let (_, body) = self.send_expecting(Method::GET, &path, None, &[StatusCode::OK]).await?;
        answers::parse_map_entries(&body).map_err(|detail| self.unreadable(&path, detail))
    }

    /// `add map`: an entry the running map does not have (the file is not touched).
    pub async fn add_runtime_map_entry(&self, map: &str, key: &str, value: &str) -> Result<(), DataplaneError> {
        let path = format!("services/haproxy/runtime/maps/{}/entries", segment(map));
        let body = serde_json::json!({"key": key, "value": value}).to_string();
        self.send_json(Method::POST, &path, body, &[StatusCode::CREATED]).await
    }

    /// `set map`: a new value for an entry the running map has (the file is not touched).
    pub async fn set_runtime_map_entry(&self, map: &str, key: &str, value: &str) -> Result<(), DataplaneError> {
        let path = format!("services/haproxy/runtime/maps/{}/entries/{}", segment(map), segment(key));
        let body = serde_json::json!({"key": key, "value": value}).to_string();
        self.send_json(Method::PUT, &path, body, &[StatusCode::OK]).await
    }

    /// `del map`: removes an entry from the running map (the file is not touched).
    pub async fn delete_runtime_map_entry(&self, map: &str, key: &str) -> Result<(), DataplaneError> {
        let path = format!("services/haproxy/runtime/maps/{}/entries/{}", segment(map), segment(key));
        self.send_expecting(Method::DELETE, &path, None, &[StatusCode::NO_CONTENT]).await.map(|_| ())
    }

    /// Replaces a stored certificate's file without reloading HAProxy; its path on the pod,
    /// the name the running HAProxy knows it by.
    pub async fn replace_stored_certificate(&self, name: &str, pem: &str) -> Result<String, DataplaneError> {
        let path = format!("{}/{}", StorageKind::Certificates.path(), segment(name));
        let request = self
            .request(Method::PUT, &path)
            .query(&[("skip_reload", "true")])
            .header(reqwest::header::CONTENT_TYPE, "text/plain")
            .body(pem.to_owned());
        let (_, text) = self.send(request, Method::PUT, &path, &[StatusCode::OK]).await?;
        answers::parse_stored_file(&text).map_err(|detail| self.unreadable(&path, detail))
    }

    /// `set ssl cert` + `commit ssl cert`: the running HAProxy serves `pem` for the certificate
    /// it loaded from `file` (the file is not touched).
    pub async fn renew_runtime_certificate(&self, file: &str, pem: &str) -> Result<(), DataplaneError> {
        let path = format!("services/haproxy/runtime/ssl_certs/{}", segment(file));
        let name = file.rsplit('/').next().unwrap_or(file);
        let request = self.request(Method::PUT, &path).multipart(upload_form(name, pem));
        self.send(request, Method::PUT, &path, &[StatusCode::OK]).await.map(|_| ())
    }

    /// The SHA-1 fingerprint of the certificate the running HAProxy serves for `file`.
    pub async fn runtime_certificate_sha1(&self, file: &str) -> Result<String, DataplaneError> {
        let path = format!("services/haproxy/runtime/ssl_certs/{}", segment(file));
        let (_, body) = self.send_expecting(Method::GET, &path, None, &[StatusCode::OK]).await?;
        answers::parse_certificate_sha1(&body).map_err(|detail| self.unreadable(&path, detail))
    }

    /// `GET /services/haproxy/reloads/{id}`: the state of one reload.
    pub async fn reload(&self, id: &ReloadId) -> Result<Reload, DataplaneError> {
        let path = format!("services/haproxy/reloads/{}", id.0);
        let (_, body) = self.send_expecting(Method::GET, &path, None, &[StatusCode::OK]).await?;
        answers::parse_reload(&body).map_err(|detail| self.unreadable(&path, detail))
    }

    /// Polls reload `id` (every 100 ms) until it is over or `limit` has passed. v3.2.7 answers a
    /// reload still waiting for its turn without an id, and forgets reloads older than its last
    /// success (answering "succeeded" for them).
    pub async fn await_reload(&self, id: &ReloadId, limit: Duration) -> Result<ReloadEnd, DataplaneError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let reload = self.reload(id).await?;
            match reload.status {
                ReloadStatus::Succeeded => return Ok(ReloadEnd::Succeeded),
                ReloadStatus::Failed => return Ok(ReloadEnd::Failed(reload.response.unwrap_or_default())),
                ReloadStatus::InProgress if tokio::time::Instant::now() > deadline => {
                    return Ok(ReloadEnd::StillRunning);
                }
                ReloadStatus::InProgress => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// `GET /services/haproxy/reloads`: the reloads the Dataplane API remembers.
    pub async fn reloads(&self) -> Result<Vec<Reload>, DataplaneError> {
        let path = "services/haproxy/reloads";
        let (_, body) = self.send_expecting(Method::GET, path, None, &[StatusCode::OK]).await?;
        answers::parse_reloads(&body).map_err(|detail| self.unreadable(path, detail))
    }

    /// The names of the stored files of one kind.
    pub async fn list_storage(&self, kind: StorageKind) -> Result<Vec<String>, DataplaneError> {
        let path = kind.path();
        let (_, body) = self.send_expecting(Method::GET, path, None, &[StatusCode::OK]).await?;
        answers::parse_storage_names(&body).map_err(|detail| self.unreadable(path, detail))
    }

    /// One stored file's content, or `None` if it does not exist.
    pub async fn get_storage(&self, kind: StorageKind, name: &str) -> Result<Option<String>, DataplaneError> {
        let path = format!("{}/{}", kind.path(), segment(name));
        let response = self.execute(self.request(Method::GET, &path), Method::GET, &path).await?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| self.unreadable(&path, answers::AnswerError::BodyUnread(e.to_string())))?;
        count_answer_bytes(&text);
        match status {
            StatusCode::OK if kind == StorageKind::Maps && text == EMPTY_MAP_AS_STORED => Ok(Some(String::new())),
            StatusCode::OK => Ok(Some(text)),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.unexpected(Method::GET, &path, status, &text)),
        }
    }

    /// Creates or replaces a stored file without reloading HAProxy (the push that follows
    /// reloads once for everything).
    pub async fn put_storage(
        &self,
        kind: StorageKind,
        name: &str,
        content: &str,
        exists: bool,
    ) -> Result<(), DataplaneError> {
        let skip_reload = [("skip_reload", "true")];
        // v3.2.7 refuses a PUT without a body ("data in body is required", 422), and will not
        // delete a map the configuration names (409): a map whose last entry went is stored as
        // one empty line, which HAProxy reads as no entry and `get_storage` gives back as empty.
        let content =
            if exists && kind == StorageKind::Maps && content.is_empty() { EMPTY_MAP_AS_STORED } else { content };
        let (method, path, request) = if exists {
            let path = format!("{}/{}", kind.path(), segment(name));
            let request = match kind {
                // Maps are replaced as plain text; general files as a multipart upload.
                // Certificates are replaced with the PEM as the body, as the API's specification says.
                StorageKind::Maps | StorageKind::Certificates => self
                    .request(Method::PUT, &path)
                    .query(&skip_reload)
                    .header(reqwest::header::CONTENT_TYPE, "text/plain")
                    .body(content.to_owned()),
                StorageKind::General => {
                    self.request(Method::PUT, &path).query(&skip_reload).multipart(upload_form(name, content))
                }
            };
            (Method::PUT, path, request)
        } else {
            let path = kind.path().to_owned();
            let request = self.request(Method::POST, &path).query(&skip_reload).multipart(upload_form(name, content));
            (Method::POST, path, request)
        };
        let response = self.execute(request, method.clone(), &path).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response.text().await.unwrap_or_default();
        let message = answers::error_message(&text);
        // What the storage says of content it cannot read (client-native's storage checks).
        let of_content = ["x509", "certificate", "PEM", "private key"].iter().any(|word| message.contains(word));
        if kind == StorageKind::Certificates && (status.is_client_error() || status.is_server_error()) && of_content {
            return Err(DataplaneError::FileRefused {
                endpoint: self.endpoint.to_string(),
                name: name.to_owned(),
                message,
            });
        }
        Err(self.unexpected(method, &path, status, &text))
    }

    /// Deletes a stored file without reloading HAProxy; a file already gone is not an error.
    pub async fn delete_storage(&self, kind: StorageKind, name: &str) -> Result<(), DataplaneError> {
        let path = format!("{}/{}", kind.path(), segment(name));
        let request = self.request(Method::DELETE, &path).query(&[("skip_reload", "true")]);
        let response = self.execute(request, Method::DELETE, &path).await?;
        let status = response.status();
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        let text = response.text().await.unwrap_or_default();
        Err(self.unexpected(Method::DELETE, &path, status, &text))
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let credentials = self.sent_credentials();
        self.http.request(method, self.url(path)).basic_auth(&credentials.username, Some(&credentials.password))
    }

    fn url(&self, path: &str) -> Url {
        // Paths are constants of this module and never absolute, so joining cannot fail.
        self.request_base.join(path).expect("relative API path")
    }

    async fn execute(
        &self,
        mut request: reqwest::RequestBuilder,
        method: Method,
        path: &str,
    ) -> Result<reqwest::Response, DataplaneError> {
        request = request.timeout(self.timeout);
        if method != Method::GET
            && let Some(guard) = &self.guard
        {
            match guard.allow() {
                Ok(Some(limit)) => request = request.timeout(limit.min(self.timeout)),
                Ok(None) => {}
                Err(reason) => {
                    return Err(DataplaneError::Fenced {
                        endpoint: self.endpoint.to_string(),
                        method,
                        path: path.to_owned(),
                        reason,
                    });
                }
            }
        }
        // One span per call: method, path and answer, never the credentials or the body.
        let span = tracing::info_span!(
            "dataplane request",
            http.request.method = %method,
            server.address = %self.endpoint,
            url.full = %self.endpoint.join(path),
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_message = tracing::field::Empty,
        );
        // A request with a body that cannot be sent twice (an upload) is not retried: the
        // switch still holds for the next request.
        let retry = request.try_clone();
        let sent = tracing::Instrument::instrument(request.send(), span.clone()).await;
        let mut response = self.answered(sent, &span, &method, path)?;
        if response.status() == StatusCode::UNAUTHORIZED {
            let switched = self.credentials.lock().ok().and_then(|mut rollover| rollover.switch());
            if let Some(credentials) = switched {
                tracing::info!(endpoint = %self.endpoint, username = %credentials.username,
                               "the pod refuses the credentials: asking with the other ones of the rotation");
                if let Some(mut again) = retry.and_then(|retry| retry.build().ok())
                    && let Some(header) = basic_authorization(&credentials)
                {
                    again.headers_mut().insert(reqwest::header::AUTHORIZATION, header);
                    let sent = tracing::Instrument::instrument(self.http.execute(again), span.clone()).await;
                    response = self.answered(sent, &span, &method, path)?;
                }
            }
        }
        if response.status() == StatusCode::UNAUTHORIZED {
            return Err(DataplaneError::Unauthorized {
                endpoint: self.endpoint.to_string(),
                username: self.sent_credentials().username,
            });
        }
        Ok(response)
    }

    /// The answer to one send, or why there was none (recorded on `span`).
    fn answered(
        &self,
        sent: Result<reqwest::Response, reqwest::Error>,
        span: &tracing::Span,
        method: &Method,
        path: &str,
    ) -> Result<reqwest::Response, DataplaneError> {
        count_request(method, sent.as_ref().ok());
        match sent {
            Ok(response) => {
                span.record("http.response.status_code", response.status().as_u16());
                if response.status().is_server_error() || response.status() == StatusCode::UNAUTHORIZED {
                    span.record("otel.status_code", "ERROR");
                }
                Ok(response)
            }
            Err(source) => {
                let mut cause = tls::error_chain(&source);
                if self.may_lack_client_certificate
                    && (cause.contains("connection closed") || cause.contains("CertificateRequired"))
                {
                    cause.push_str(
                        " (a Dataplane API that requires a client certificate closes the connection like this: \
                         give one as tls.crt and tls.key in the Secret of spec.dataplane.tls)",
                    );
                }
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_message", cause.as_str());
                Err(DataplaneError::Unreachable {
                    endpoint: self.endpoint.to_string(),
                    method: method.clone(),
                    path: path.to_owned(),
                    cause,
                })
            }
        }
    }

    async fn send_expecting(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        expected: &[StatusCode],
    ) -> Result<(reqwest::header::HeaderMap, String), DataplaneError> {
        let mut request = self.request(method.clone(), path);
        if let Some(body) = body {
            request = request.body(body);
        }
        self.send(request, method, path, expected).await
    }

    /// Sends a built request: its headers and text when its status is one of `expected`.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        method: Method,
        path: &str,
        expected: &[StatusCode],
    ) -> Result<(reqwest::header::HeaderMap, String), DataplaneError> {
        let response = self.execute(request, method.clone(), path).await?;
        let status = response.status();
        let headers = response.headers().clone();
        let text = response
            .text()
            .await
            .map_err(|e| self.unreadable(path, answers::AnswerError::BodyUnread(e.to_string())))?;
        count_answer_bytes(&text);
        if expected.contains(&status) { Ok((headers, text)) } else { Err(self.unexpected(method, path, status, &text)) }
    }

    async fn send_json(
        &self,
        method: Method,
        path: &str,
        body: String,
        expected: &[StatusCode],
    ) -> Result<(), DataplaneError> {
        let request =
            self.request(method.clone(), path).header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        self.send(request, method, path, expected).await.map(|_| ())
    }

    fn unreadable(&self, path: &str, detail: answers::AnswerError) -> DataplaneError {
        DataplaneError::UnreadableAnswer { endpoint: self.endpoint.to_string(), path: path.to_owned(), detail }
    }

    fn unexpected(&self, method: Method, path: &str, status: StatusCode, body: &str) -> DataplaneError {
        let mut body = body.to_owned();
        if body.len() > ERROR_BODY_LIMIT {
            let cut = (0..=ERROR_BODY_LIMIT).rev().find(|i| body.is_char_boundary(*i)).unwrap_or(0);
            body.truncate(cut);
        }
        DataplaneError::UnexpectedStatus {
            endpoint: self.endpoint.to_string(),
            method,
            path: path.to_owned(),
            status,
            body,
        }
    }
}

/// One path segment, percent-encoded: a map key (`shop.example/cart/`) or a certificate's path
/// is one segment of the URL (the API routes on the encoded path and decodes the parameter).
fn segment(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

fn upload_form(name: &str, content: &str) -> reqwest::multipart::Form {
    let part = reqwest::multipart::Part::text(content.to_owned()).file_name(name.to_owned());
    reqwest::multipart::Form::new().part("file_upload", part)
}

/// Counts one request in the metrics: its method and its answer's class.
fn count_request(method: &Method, answer: Option<&reqwest::Response>) {
    use crate::telemetry::metrics::{DataplaneRequestLabels, metrics};
    let method = match *method {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        _ => "other",
    };
    let answer_class = match answer.map(|response| response.status().as_u16() / 100) {
        None => "unreachable",
        Some(2) => "2xx",
        Some(3) => "3xx",
        Some(4) => "4xx",
        Some(_) => "5xx",
    };
    metrics().dataplane_requests.get_or_create(&DataplaneRequestLabels { method, answer: answer_class }).inc();
}

/// Counts the bytes of an answer read in the metrics.
fn count_answer_bytes(text: &str) {
    crate::telemetry::metrics::metrics().dataplane_answer_bytes.inc_by(text.len() as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_gets_no_more_than_the_configured_timeout() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        let info = r#"{"api": {"version": "v3.2.7", "build_date": "2026"}}"#;
        Mock::given(method("GET"))
            .and(path("/v3/info"))
            .respond_with(ResponseTemplate::new(200).set_body_string(info).set_delay(Duration::from_millis(1500)))
            .mount(&server)
            .await;
        let endpoint = Endpoint::parse(&format!("{}/v3", server.uri())).unwrap();
        let access = |timeout| Access { request_timeout: timeout, ..Access::plain(Credentials::new("u", "p")) };
        let started = std::time::Instant::now();
        let error =
            access(Some(Duration::from_millis(300))).client(endpoint.clone()).unwrap().info().await.unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(1400), "the timeout held: {:?}", started.elapsed());
        assert!(error.to_string().contains(&server.uri()), "the pod is named: {error}");
        assert!(access(None).client(endpoint).unwrap().info().await.is_ok(), "30 s by default");
    }

    #[test]
    fn endpoint_joins_paths_below_v3_with_or_without_trailing_slash() {
        for base in ["http://127.0.0.2:5555/v3", "http://127.0.0.2:5555/v3/"] {
            let endpoint = Endpoint::parse(base).unwrap();
            assert_eq!(endpoint.join("info").as_str(), "http://127.0.0.2:5555/v3/info");
            assert_eq!(endpoint.to_string(), "http://127.0.0.2:5555/v3");
        }
    }

    #[test]
    fn endpoint_for_pod_brackets_ipv6() {
        let endpoint = Endpoint::for_pod("fd00::7".parse().unwrap(), 5555);
        assert_eq!(endpoint.to_string(), "http://[fd00::7]:5555/v3");
    }

    #[test]
    fn invalid_endpoint_is_reported_with_its_text() {
        let err = Endpoint::parse("not a url").unwrap_err();
        assert!(err.to_string().contains("not a url"), "{err}");
    }

    #[test]
    fn a_map_key_or_a_path_is_one_segment() {
        assert_eq!(segment("shop.example/cart/"), "shop.example%2Fcart%2F");
        assert_eq!(segment("/var/run/haproxy/ssl/a_b.pem"), "%2Fvar%2Frun%2Fhaproxy%2Fssl%2Fa_b.pem");
        assert_eq!(segment("*.example/ü"), "%2A.example%2F%C3%BC");
    }

    /// Every name the client puts into a URL is one percent-encoded segment: a name with a `/`,
    /// `?` or `#` cannot reach another endpoint of the API.
    #[tokio::test]
    async fn names_in_urls_are_percent_encoded_segments() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        let encoded = "/v3/services/haproxy/runtime/backends/be%2F..%2Fx%3F/servers/s%23";
        Mock::given(method("GET"))
            .and(path(encoded))
            .respond_with(ResponseTemplate::new(404))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v3/services/haproxy/storage/maps/a%2F..%2Fb.map"))
            .respond_with(ResponseTemplate::new(404))
            .expect(1)
            .mount(&server)
            .await;
        let endpoint = Endpoint::parse(&format!("{}/v3", server.uri())).unwrap();
        let client = Access::plain(Credentials::new("u", "p")).client(endpoint).unwrap();
        let _ = client.runtime_server("be/../x?", "s#").await;
        assert_eq!(client.get_storage(StorageKind::Maps, "a/../b.map").await.unwrap(), None);
    }

    #[test]
    fn credentials_debug_hides_the_password() {
        let shown = format!("{:?}", Credentials::new("admin", "s3cret"));
        assert!(shown.contains("admin"));
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
