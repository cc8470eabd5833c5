//! Reads what the environment's OpenTelemetry Collector received: its file exporter writes
//! every batch as one line of OTLP JSON (`ExportTraceServiceRequest`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// One received span, flattened.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// The `service.name` of the process that sent it.
    pub service: String,
    /// Trace id, 32 hex digits.
    pub trace_id: String,
    /// Span id.
    pub span_id: String,
    /// Parent span id, empty for a root.
    pub parent_span_id: String,
    /// Its name.
    pub name: String,
    /// Attributes, values as strings.
    pub attributes: BTreeMap<String, String>,
    /// The status code: 0 unset, 1 ok, 2 error.
    pub status_code: u64,
}

impl ReceivedSpan {
    /// An attribute's value, or "".
    pub fn attribute(&self, key: &str) -> &str {
        self.attributes.get(key).map(String::as_str).unwrap_or_default()
    }
}

fn scalar(value: &Value) -> String {
    for key in ["stringValue", "intValue", "boolValue", "doubleValue"] {
        if let Some(inner) = value.get(key) {
            return inner.as_str().map(str::to_owned).unwrap_or_else(|| inner.to_string());
        }
    }
    value.to_string()
}

fn attributes(list: &Value) -> BTreeMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| Some((kv["key"].as_str()?.to_owned(), scalar(&kv["value"]))))
        .collect()
}

/// Every span in the collector's file so far.
pub fn received_spans(file: &Path) -> Vec<ReceivedSpan> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut spans = Vec::new();
    for line in text.lines() {
        let Ok(batch) = serde_json::from_str::<Value>(line) else { continue };
        for resource in batch["resourceSpans"].as_array().into_iter().flatten() {
            let resource_attributes = attributes(&resource["resource"]["attributes"]);
            let service = resource_attributes.get("service.name").cloned().unwrap_or_default();
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    spans.push(ReceivedSpan {
                        service: service.clone(),
                        trace_id: span["traceId"].as_str().unwrap_or_default().to_owned(),
                        span_id: span["spanId"].as_str().unwrap_or_default().to_owned(),
                        parent_span_id: span["parentSpanId"].as_str().unwrap_or_default().to_owned(),
                        name: span["name"].as_str().unwrap_or_default().to_owned(),
                        attributes: attributes(&span["attributes"]),
                        status_code: span["status"]["code"].as_u64().unwrap_or_default(),
                    });
                }
            }
        }
    }
    spans
}
