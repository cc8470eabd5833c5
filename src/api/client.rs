//! A client of haptic's own HTTP API: what a running controller renders and what each of its
//! pods runs, for `haptic diff --controller`.

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

use crate::files::{Checksum, FileSet, RenderedFile};

/// Why the controller's API could not be read.
#[derive(Debug, Error)]
pub enum ApiClientError {
    /// The request failed or was refused.
    #[error("{url}: {detail}")]
    Request {
        /// What was asked.
        url: String,
        /// Why it failed.
        detail: String,
    },
}

/// What the controller renders now, with each certificate known by its checksum only (the API
/// never serves a private key).
#[derive(Clone, Debug)]
pub struct ControllerRender {
    /// The configuration generation it is from.
    pub generation: i64,
    /// Its files; certificates have no content, only their checksum.
    pub files: FileSet,
}

/// A pod as the controller's API shows it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ControllerPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its state.
    pub state: String,
    /// The HAProxy version it reported.
    #[serde(default)]
    pub haproxy_version: Option<String>,
    /// Whether it runs the controller's current render (its pushed checksums are the desired ones).
    #[serde(skip)]
    pub runs_current: bool,
}

#[derive(Deserialize)]
struct ConfigListing {
    generation: i64,
    files: Vec<FileListing>,
}

#[derive(Deserialize)]
struct FileListing {
    name: String,
    checksum: String,
    secret: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodListing {
    #[serde(flatten)]
    pod: ControllerPod,
    desired_checksums: Option<Vec<NamedChecksum>>,
    pushed_checksums: Option<Vec<NamedChecksum>>,
}

#[derive(Deserialize, PartialEq, Eq)]
struct NamedChecksum {
    name: String,
    checksum: String,
}

/// Which certificates of the controller's API the client takes.
#[derive(Clone, Debug)]
pub enum ApiTrust {
    /// Those the system's roots sign (or plain http).
    SystemRoots,
    /// Those this CA (PEM) signs.
    Ca(Vec<u8>),
    /// Any: the controller's own self-signed certificate (compare the fingerprint it logged).
    Anything,
}

/// Reads the API at `base` (`https://haptic:8080`) with an optional bearer token.
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl ApiClient {
    /// A client of the API at `base`.
    pub fn new(base: &str, token: Option<String>, trust: ApiTrust) -> Result<Self, ApiClientError> {
        let failed = |detail: String| ApiClientError::Request { url: base.into(), detail };
        let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30));
        match trust {
            ApiTrust::SystemRoots => {}
            ApiTrust::Ca(pem) => {
                let ca = reqwest::Certificate::from_pem(&pem).map_err(|e| failed(format!("the CA: {e}")))?;
                builder = builder.tls_certs_only([ca]);
            }
            ApiTrust::Anything => builder = builder.danger_accept_invalid_certs(true),
        }
        let http = builder.build().map_err(|e| failed(e.to_string()))?;
        Ok(Self { http, base: base.trim_end_matches('/').to_owned(), token })
    }

    async fn send(&self, path: &str) -> Result<reqwest::Response, ApiClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.get(&url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request.send().await.map_err(|e| ApiClientError::Request { url, detail: e.to_string() })
    }

    async fn get(&self, path: &str) -> Result<reqwest::Response, ApiClientError> {
        let response = self.send(path).await?;
        self.successful(path, response).await
    }

    /// `response` when it is a success; its status and the start of its body otherwise.
    async fn successful(&self, path: &str, response: reqwest::Response) -> Result<reqwest::Response, ApiClientError> {
        let failed = |detail: String| ApiClientError::Request { url: format!("{}{path}", self.base), detail };
        if !response.status().is_success() {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(failed(format!("{status}: {}", body.chars().take(300).collect::<String>())));
        }
        Ok(response)
    }

    /// The controller's current render.
    pub async fn render(&self) -> Result<ControllerRender, ApiClientError> {
        let listing: ConfigListing = self
            .get("/api/v1/config")
            .await?
            .json()
            .await
            .map_err(|e| ApiClientError::Request { url: "/api/v1/config".into(), detail: e.to_string() })?;
        let mut files = FileSet {
            haproxy_cfg: RenderedFile::new(String::new()),
            maps: BTreeMap::new(),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        };
        for file in listing.files {
            let rendered = if file.secret {
                let checksum = Checksum::from_hex(&file.checksum).ok_or_else(|| ApiClientError::Request {
                    url: "/api/v1/config".into(),
                    detail: format!("{} has no checksum", file.name),
                })?;
                RenderedFile { content: "".into(), checksum, sensitive: true }
            } else {
                let text = self
                    .get(&format!("/api/v1/config/files/{}", file.name))
                    .await?
                    .text()
                    .await
                    .map_err(|e| ApiClientError::Request { url: file.name.clone(), detail: e.to_string() })?;
                RenderedFile::new(text)
            };
            match file.name.split_once('/') {
                None if file.name == "haproxy.cfg" => files.haproxy_cfg = rendered,
                Some(("maps", name)) => drop(files.maps.insert(name.to_owned(), rendered)),
                Some(("files", name)) => drop(files.files.insert(name.to_owned(), rendered)),
                Some(("certs", name)) => drop(files.certs.insert(name.to_owned(), rendered)),
                _ => {}
            }
        }
        Ok(ControllerRender { generation: listing.generation, files })
    }

    /// The controller's pods (none for a controller that renders only).
    pub async fn pods(&self) -> Result<Vec<ControllerPod>, ApiClientError> {
        #[derive(Deserialize)]
        struct Pods {
            pods: Vec<PodListing>,
        }
        let response = self.send("/api/v1/pods").await?;
        // A controller that renders only has no pods, and says so with a 503.
        if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return Ok(Vec::new());
        }
        let listing: Pods = self
            .successful("/api/v1/pods", response)
            .await?
            .json()
            .await
            .map_err(|e| ApiClientError::Request { url: "/api/v1/pods".into(), detail: e.to_string() })?;
        Ok(listing
            .pods
            .into_iter()
            .map(|listed| {
                let runs_current =
                    listed.desired_checksums.is_some() && listed.desired_checksums == listed.pushed_checksums;
                ControllerPod { runs_current, ..listed.pod }
            })
            .collect())
    }
}
