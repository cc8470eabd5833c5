//! Offline inputs: a configuration and resources read from files instead of a cluster, for
//! `haptic render` and for tests and benchmarks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;
use thiserror::Error;

use crate::config::{HAProxyTemplateConfig, HAProxyTemplateConfigSpec};
use crate::render::PodInfo;
use crate::store::selector::{FieldSelector, LabelSelector};
use crate::store::{ResourceStore, Stores};

/// Errors reading offline inputs; each names the file or the configuration field.
#[derive(Debug, Error)]
pub enum OfflineError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not valid YAML or JSON of the expected shape.
    #[error("{path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with its location.
        detail: String,
    },
    /// The configuration's watched resources cannot be applied.
    #[error("spec.watchedResources.{alias}: {detail}")]
    Watched {
        /// The alias.
        alias: String,
        /// What is wrong.
        detail: String,
    },
    /// An object could not be stored.
    #[error("{path}: {detail}")]
    Object {
        /// The file it came from.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// A render directory as `haptic render --out` (or `--render-dir`) writes it: `haproxy.cfg`,
/// `maps/*` and `files/*` (certificates are never written there, so none are read).
pub fn load_render_dir(dir: &Path) -> Result<crate::files::FileSet, OfflineError> {
    use crate::files::RenderedFile;
    let read = |path: PathBuf| -> Result<String, OfflineError> {
        std::fs::read_to_string(&path).map_err(|source| OfflineError::Read { path, source })
    };
    let mut set = crate::files::FileSet {
        haproxy_cfg: RenderedFile::new(read(dir.join("haproxy.cfg"))?),
        maps: Default::default(),
        files: Default::default(),
        certs: Default::default(),
    };
    for (sub, into) in [("maps", &mut set.maps), ("files", &mut set.files)] {
        let path = dir.join(sub);
        let Ok(entries) = std::fs::read_dir(&path) else { continue };
        for entry in entries {
            let entry = entry.map_err(|source| OfflineError::Read { path: path.clone(), source })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") || !entry.path().is_file() {
                continue;
            }
            into.insert(name, RenderedFile::new(read(entry.path())?));
        }
    }
    Ok(set)
}

/// Reads a full `HAProxyTemplateConfig` from a YAML or JSON file.
pub fn load_config(path: &Path) -> Result<HAProxyTemplateConfig, OfflineError> {
    let text = std::fs::read_to_string(path).map_err(|source| OfflineError::Read { path: path.into(), source })?;
    serde_saphyr::from_str(&text).map_err(|e| OfflineError::Parse { path: path.into(), detail: e.to_string() })
}

/// Every Kubernetes object in the `.yaml`, `.yml` and `.json` files of a directory (several
/// documents per file allowed), with the file each came from, in file-name order.
pub fn load_objects(dir: &Path) -> Result<Vec<(PathBuf, Json)>, OfflineError> {
    let read_dir = std::fs::read_dir(dir).map_err(|source| OfflineError::Read { path: dir.into(), source })?;
    let mut paths: Vec<PathBuf> = read_dir
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json"))
        .collect();
    paths.sort();
    let mut objects = Vec::new();
    for path in paths {
        let text =
            std::fs::read_to_string(&path).map_err(|source| OfflineError::Read { path: path.clone(), source })?;
        let documents: Vec<Json> = serde_saphyr::from_multiple(&text)
            .map_err(|e| OfflineError::Parse { path: path.clone(), detail: e.to_string() })?;
        for document in documents.into_iter().filter(|d| !d.is_null()) {
            if document.get("kind").and_then(Json::as_str) == Some("List") {
                let items = document.get("items").and_then(Json::as_array).cloned().unwrap_or_default();
                objects.extend(items.into_iter().map(|item| (path.clone(), item)));
            } else {
                objects.push((path.clone(), document));
            }
        }
    }
    Ok(objects)
}

/// Fills one store per watched alias with the objects it would watch.
pub fn build_stores(spec: &HAProxyTemplateConfigSpec, objects: &[(PathBuf, Json)]) -> Result<Stores, OfflineError> {
    fill_stores(spec, objects, true)
}

/// Fills one store per watched alias with `objects`, whatever namespace each is in: a
/// validation test's fixtures check the templates, not which namespaces an installation watches.
pub fn build_fixture_stores(
    spec: &HAProxyTemplateConfigSpec,
    objects: &[(PathBuf, Json)],
) -> Result<Stores, OfflineError> {
    fill_stores(spec, objects, false)
}

fn fill_stores(
    spec: &HAProxyTemplateConfigSpec,
    objects: &[(PathBuf, Json)],
    in_watched_namespaces: bool,
) -> Result<Stores, OfflineError> {
    let mut stores = Stores::new();
    for (alias, watched) in &spec.watched_resources {
        let error =
            |detail: &dyn std::fmt::Display| OfflineError::Watched { alias: alias.clone(), detail: detail.to_string() };
        let labels =
            LabelSelector::parse(watched.label_selector.as_deref().unwrap_or_default()).map_err(|e| error(&e))?;
        let fields =
            FieldSelector::parse(watched.field_selector.as_deref().unwrap_or_default()).map_err(|e| error(&e))?;
        let mut store =
            ResourceStore::shaped(&watched.kind, &watched.index_by, &watched.ignore_fields, &watched.fields)
                .map_err(|e| error(&e))?;
        for (path, object) in objects {
            let same_type = object.get("apiVersion").and_then(Json::as_str) == Some(watched.api_version.as_str())
                && object.get("kind").and_then(Json::as_str) == Some(watched.kind.as_str());
            let namespace = object.pointer("/metadata/namespace").and_then(Json::as_str).unwrap_or_default();
            let in_namespaces =
                !in_watched_namespaces || watched.namespaces.as_ref().is_none_or(|n| n.iter().any(|n| n == namespace));
            if same_type && in_namespaces && labels.matches(object) && fields.matches(object) {
                store
                    .apply(object.clone())
                    .map_err(|e| OfflineError::Object { path: path.clone(), detail: e.to_string() })?;
            }
        }
        stores.insert(alias.clone(), Arc::new(store));
    }
    Ok(stores)
}

/// The Pods among `objects` that the configuration's `podSelector` selects and that have an IP.
pub fn pods(spec: &HAProxyTemplateConfigSpec, objects: &[(PathBuf, Json)]) -> Vec<PodInfo> {
    let text =
        |object: &Json, pointer: &str| object.pointer(pointer).and_then(Json::as_str).unwrap_or_default().to_owned();
    let mut pods: Vec<PodInfo> = objects
        .iter()
        .map(|(_, object)| object)
        .filter(|object| object.get("kind").and_then(Json::as_str) == Some("Pod"))
        .filter(|object| {
            spec.pod_selector.match_labels.iter().all(|(key, value)| {
                object.pointer("/metadata/labels").and_then(|l| l.get(key)).and_then(Json::as_str)
                    == Some(value.as_str())
            })
        })
        .map(|object| PodInfo {
            namespace: text(object, "/metadata/namespace"),
            name: text(object, "/metadata/name"),
            uid: text(object, "/metadata/uid"),
            ip: text(object, "/status/podIP"),
        })
        .filter(|pod| !pod.ip.is_empty())
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    pods
}
