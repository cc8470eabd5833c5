//! Pure parsing of Dataplane API answers into typed values.

use std::fmt;

use serde::Deserialize;

/// The configuration version the Dataplane API keeps in the file (`# _version=N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigVersion(pub u64);

impl fmt::Display for ConfigVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The id the Dataplane API gives a queued reload, e.g. `2026-12-02-7`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReloadId(pub String);

impl fmt::Display for ReloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The Dataplane API's identity from `GET /info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiInfo {
    /// The API version string, e.g. `v3.2.7 3f1e3ef3`.
    pub version: String,
    /// When the API binary was built, as it reports it.
    pub build_date: Option<String>,
}

/// HAProxy's state as seen by the Dataplane API (`GET /health`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// HAProxy answers on its runtime socket.
    Up,
    /// HAProxy does not answer.
    Down,
    /// The Dataplane API cannot tell.
    Unknown,
}

/// Where a reload stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadStatus {
    /// Queued or running.
    InProgress,
    /// HAProxy reloaded with the new configuration.
    Succeeded,
    /// HAProxy refused to reload; the Dataplane API restored the last good file.
    Failed,
}

/// One reload known to the Dataplane API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reload {
    /// Its id; v3.2.7 answers a reload still waiting for its turn without one
    /// (`{"status":"in_progress"}`, see `GetReload` in its `haproxy/reload_agent.go`).
    pub id: Option<ReloadId>,
    /// Where it stands.
    pub status: ReloadStatus,
    /// HAProxy's output for a failed reload.
    pub response: Option<String>,
}

#[derive(Deserialize)]
struct InfoAnswer {
    api: InfoApi,
}

#[derive(Deserialize)]
struct InfoApi {
    version: String,
    build_date: Option<String>,
}

#[derive(Deserialize)]
struct HealthAnswer {
    haproxy: String,
}

#[derive(Deserialize)]
struct ReloadAnswer {
    #[serde(default)]
    id: String,
    status: String,
    response: Option<String>,
}

#[derive(Deserialize)]
struct StorageEntry {
    storage_name: String,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    message: String,
}

/// Why an answer of the Dataplane API could not be read; each quotes at most an excerpt of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The body is not the JSON expected.
    #[error("{detail} in {excerpt}")]
    NotJson {
        /// The parser's words.
        detail: String,
        /// The start of the body.
        excerpt: String,
    },
    /// A configuration version that is not a number.
    #[error("configuration version {excerpt}: {detail}")]
    NotAVersion {
        /// The text.
        excerpt: String,
        /// The parser's words.
        detail: String,
    },
    /// A reload whose status is none of the three the API has.
    #[error("reload {id} has unknown status {status}")]
    UnknownReloadStatus {
        /// The reload's id.
        id: String,
        /// The status it has.
        status: String,
    },
    /// A storage answer that names no file.
    #[error("no file in {excerpt}")]
    NoFile {
        /// The start of the body.
        excerpt: String,
    },
    /// The body did not arrive whole.
    #[error("the body could not be read: {0}")]
    BodyUnread(String),
    /// A configuration that says nothing of its version.
    #[error("the configuration has no `# _version=` line and no Configuration-Version")]
    NoVersion,
}

/// The body is not the JSON expected.
pub(crate) fn not_json(error: &serde_json::Error, body: &str) -> AnswerError {
    AnswerError::NotJson { detail: error.to_string(), excerpt: excerpt(body) }
}

/// Parses `GET /info`.
pub fn parse_info(body: &str) -> Result<ApiInfo, AnswerError> {
    let answer: InfoAnswer = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    Ok(ApiInfo { version: answer.api.version, build_date: answer.api.build_date })
}

/// Parses `GET /health`.
pub fn parse_health(body: &str) -> Result<Health, AnswerError> {
    let answer: HealthAnswer = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    Ok(match answer.haproxy.as_str() {
        "up" => Health::Up,
        "down" => Health::Down,
        _ => Health::Unknown,
    })
}

/// Parses a configuration version, from a body or a `Configuration-Version` header.
pub fn parse_version(text: &str) -> Result<ConfigVersion, AnswerError> {
    text.trim()
        .parse::<u64>()
        .map(ConfigVersion)
        .map_err(|e| AnswerError::NotAVersion { excerpt: excerpt(text), detail: e.to_string() })
}

/// Parses one reload (`GET /services/haproxy/reloads/{id}`).
pub fn parse_reload(body: &str) -> Result<Reload, AnswerError> {
    let answer: ReloadAnswer = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    reload_from(answer)
}

/// A server as the running HAProxy has it (the Runtime API's view).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeServer {
    /// Its address.
    pub address: String,
    /// Its port (none for a server without one).
    pub port: Option<u16>,
    /// `ready`, `maint` or `drain`.
    pub admin_state: String,
}

#[derive(Deserialize)]
struct RuntimeServerAnswer {
    #[serde(default)]
    address: String,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    admin_state: String,
}

/// Parses a runtime server (`GET /services/haproxy/runtime/backends/{b}/servers/{s}`).
pub fn parse_runtime_server(body: &str) -> Result<RuntimeServer, AnswerError> {
    let answer: RuntimeServerAnswer = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    Ok(RuntimeServer { address: answer.address, port: answer.port, admin_state: answer.admin_state })
}

/// Parses a running map's entries (`GET /services/haproxy/runtime/maps/{map}/entries`), as
/// key and value pairs in the order HAProxy lists them.
pub fn parse_map_entries(body: &str) -> Result<Vec<(String, String)>, AnswerError> {
    #[derive(Deserialize)]
    struct Entry {
        key: String,
        #[serde(default)]
        value: String,
    }
    let entries: Vec<Entry> = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    Ok(entries.into_iter().map(|entry| (entry.key, entry.value)).collect())
}

/// Parses the SHA-1 fingerprint of a certificate as the running HAProxy holds it
/// (`GET /services/haproxy/runtime/ssl_certs/{path}`).
pub fn parse_certificate_sha1(body: &str) -> Result<String, AnswerError> {
    #[derive(Deserialize)]
    struct Certificate {
        #[serde(default)]
        sha1_finger_print: String,
    }
    let answer: Certificate = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    Ok(answer.sha1_finger_print)
}

/// Parses the path a stored certificate has on the pod (`file` of a storage answer).
pub fn parse_stored_file(body: &str) -> Result<String, AnswerError> {
    #[derive(Deserialize)]
    struct Stored {
        #[serde(default)]
        file: String,
    }
    let answer: Stored = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    if answer.file.is_empty() { Err(AnswerError::NoFile { excerpt: excerpt(body) }) } else { Ok(answer.file) }
}

/// Parses the list of reloads (`GET /services/haproxy/reloads`).
pub fn parse_reloads(body: &str) -> Result<Vec<Reload>, AnswerError> {
    let answers: Vec<ReloadAnswer> = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    answers.into_iter().map(reload_from).collect()
}

fn reload_from(answer: ReloadAnswer) -> Result<Reload, AnswerError> {
    let status = match answer.status.as_str() {
        "in_progress" => ReloadStatus::InProgress,
        "succeeded" => ReloadStatus::Succeeded,
        "failed" => ReloadStatus::Failed,
        other => return Err(AnswerError::UnknownReloadStatus { id: excerpt(&answer.id), status: excerpt(other) }),
    };
    let id = (!answer.id.is_empty()).then_some(ReloadId(answer.id));
    Ok(Reload { id, status, response: answer.response.filter(|r| !r.is_empty()) })
}

/// Parses a storage listing (`GET /services/haproxy/storage/maps` or `.../general`).
pub fn parse_storage_names(body: &str) -> Result<Vec<String>, AnswerError> {
    let entries: Vec<StorageEntry> = serde_json::from_str(body).map_err(|e| not_json(&e, body))?;
    let mut names: Vec<String> = entries.into_iter().map(|e| e.storage_name).collect();
    names.sort();
    Ok(names)
}

/// The configuration file as the Dataplane API stores it after a write: not the text that was
/// sent, but its parser's own layout of it (sections reordered, two-space indents, unnamed
/// `defaults` named, a `# _md5hash=` and a `# _version=` line on top).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredConfig {
    /// The configuration version of the file.
    pub version: ConfigVersion,
    /// The file's text.
    pub text: String,
}

impl StoredConfig {
    /// Reads the version from the file's own `# _version=` line, or, for a file the API never
    /// wrote (a pod's bootstrap configuration has none), from the answer's
    /// `Configuration-Version` header.
    pub fn from_text(text: String, header: Option<&str>) -> Result<Self, AnswerError> {
        let version = text
            .lines()
            .find_map(|line| line.strip_prefix("# _version="))
            .or(header)
            .ok_or(AnswerError::NoVersion)
            .and_then(parse_version)?;
        Ok(Self { version, text })
    }

    /// The file without the lines the Dataplane API rewrites on every write (`# _version=`,
    /// `# _md5hash=`): equal for two files that differ in nothing else.
    pub fn content(&self) -> impl Iterator<Item = &str> {
        self.text.lines().filter(|line| !line.starts_with("# _version=") && !line.starts_with("# _md5hash="))
    }
}

/// The human message of an error answer: the `message` field when the body is the API's JSON
/// error, else the body itself; at most [`MESSAGE_LIMIT`] bytes of either (HAProxy's output
/// for a refused configuration fits; an answer is not ours to copy into logs whole).
pub fn error_message(body: &str) -> String {
    let message =
        serde_json::from_str::<ErrorAnswer>(body).map(|e| e.message).unwrap_or_else(|_| body.trim().to_owned());
    // HAProxy's output may quote a userlist line: its password hash stays out of logs and Events.
    cut(crate::files::redact_password_hashes(&message).into_owned(), MESSAGE_LIMIT)
}

/// Longest error message kept from an answer.
pub const MESSAGE_LIMIT: usize = 3072;
/// How much of an unreadable answer its parse error quotes.
const EXCERPT_LIMIT: usize = 256;

/// The start of an answer, quoted, for a parse error: enough to recognise it, never all of it.
fn excerpt(body: &str) -> String {
    let body = &*crate::files::redact_password_hashes(body);
    if body.len() <= EXCERPT_LIMIT {
        format!("{body:?}")
    } else {
        format!("{:?}… ({} bytes)", cut(body.to_owned(), EXCERPT_LIMIT), body.len())
    }
}

fn cut(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let end = (0..=limit).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        text.truncate(end);
        text.push_str(" […]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_servers_parse_with_their_state() {
        let server = parse_runtime_server(
            r#"{"name":"srv2","address":"10.0.0.7","port":8080,"admin_state":"ready","operational_state":"up"}"#,
        )
        .unwrap();
        assert_eq!(server, RuntimeServer { address: "10.0.0.7".into(), port: Some(8080), admin_state: "ready".into() });
        assert!(parse_runtime_server("not json").is_err());
    }
    #[test]
    fn info_reads_the_api_version() {
        let info =
            parse_info(r#"{"api":{"build_date":"2025-12-02T10:00:00Z","version":"v3.2.7 3f1e3ef3"},"system":{}}"#)
                .unwrap();
        assert_eq!(info.version, "v3.2.7 3f1e3ef3");
        assert_eq!(info.build_date.as_deref(), Some("2025-12-02T10:00:00Z"));
    }

    #[test]
    fn health_maps_every_state() {
        assert_eq!(parse_health(r#"{"haproxy":"up"}"#).unwrap(), Health::Up);
        assert_eq!(parse_health(r#"{"haproxy":"down"}"#).unwrap(), Health::Down);
        assert_eq!(parse_health(r#"{"haproxy":"unknown"}"#).unwrap(), Health::Unknown);
        assert!(parse_health("<html>").is_err());
    }

    #[test]
    fn version_accepts_surrounding_whitespace_and_refuses_text() {
        assert_eq!(parse_version("7\n").unwrap(), ConfigVersion(7));
        assert!(parse_version("seven").unwrap_err().to_string().contains("seven"));
    }

    #[test]
    fn reloads_parse_with_and_without_response() {
        let reloads = parse_reloads(
            r#"[{"id":"2026-12-02-1","status":"succeeded","reload_timestamp":1},
                {"id":"2026-12-02-2","status":"failed","response":"[ALERT] bad"},
                {"id":"2026-12-02-3","status":"in_progress","response":""}]"#,
        )
        .unwrap();
        assert_eq!(reloads[0].status, ReloadStatus::Succeeded);
        assert_eq!(reloads[1].response.as_deref(), Some("[ALERT] bad"));
        assert_eq!(
            reloads[2],
            Reload { id: Some(ReloadId("2026-12-02-3".into())), status: ReloadStatus::InProgress, response: None }
        );
    }

    #[test]
    fn a_reload_waiting_its_turn_has_no_id() {
        // What v3.2.7 answers for the reload it has queued but not started.
        let reload = parse_reload(r#"{"status":"in_progress"}"#).unwrap();
        assert_eq!(reload, Reload { id: None, status: ReloadStatus::InProgress, response: None });
    }

    #[test]
    fn a_stored_configuration_reads_its_version_from_the_file() {
        let text = "# _md5hash=ab12\n# _version=7\n# note\n\nglobal\n  maxconn 10\n";
        let stored = StoredConfig::from_text(text.into(), Some("3")).unwrap();
        assert_eq!(stored.version, ConfigVersion(7), "the file's line wins");
        assert_eq!(stored.content().collect::<Vec<_>>(), ["# note", "", "global", "  maxconn 10"]);
        // A bootstrap file the API never wrote: only the header says.
        assert_eq!(StoredConfig::from_text("global\n".into(), Some("1")).unwrap().version, ConfigVersion(1));
        assert!(StoredConfig::from_text("global\n".into(), None).unwrap_err().to_string().contains("_version"));
    }

    #[test]
    fn unknown_reload_status_is_an_error_naming_the_reload() {
        let err = parse_reload(r#"{"id":"r1","status":"exploded"}"#).unwrap_err().to_string();
        assert!(err.contains("r1") && err.contains("exploded"), "{err}");
    }

    #[test]
    fn storage_listings_give_sorted_names() {
        let body = r#"[{"storage_name":"path.map","file":"/etc/haproxy/maps/path.map","size":12},
                       {"storage_name":"host.map","file":"/etc/haproxy/maps/host.map","size":40}]"#;
        assert_eq!(parse_storage_names(body).unwrap(), ["host.map", "path.map"]);
        assert!(parse_storage_names("{}").is_err());
    }

    #[test]
    fn error_message_prefers_the_json_message() {
        assert_eq!(error_message(r#"{"code":400,"message":"line 3: unknown keyword"}"#), "line 3: unknown keyword");
        assert_eq!(error_message("plain failure\n"), "plain failure");
    }
}
