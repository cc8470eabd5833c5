//! Where renders go for now: a log line each, and optionally a directory to inspect them.
//! (The fleet issue adds deployment; the operations issue adds the HTTP API.)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tracing::{info, warn};

use crate::files::FileSet;
use crate::render::BlockCounts;

/// One line of `renders.log`.
#[derive(Debug, Serialize)]
pub struct RenderRecord<'a> {
    /// Sequence number of the render since start.
    pub render: u64,
    /// The configuration generation rendered.
    pub generation: i64,
    /// What triggered it.
    pub triggers: &'a [String],
    /// Objects left out for refused values.
    pub left_out: usize,
    /// Render time in milliseconds.
    pub millis: u128,
    /// Each file's path and checksum.
    pub files: Vec<(String, String)>,
}

/// Receives every successful render.
#[derive(Debug)]
pub struct RenderSink {
    dir: Option<PathBuf>,
    count: Mutex<u64>,
}

impl RenderSink {
    /// A sink that logs, and writes to `dir` when given.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir, count: Mutex::new(0) }
    }

    /// Records one render, with how many of its blocks it reused and rendered.
    pub fn record(
        &self,
        generation: i64,
        files: &FileSet,
        triggers: &[String],
        left_out: usize,
        elapsed: Duration,
        blocks: BlockCounts,
    ) {
        let render = {
            let mut count = self.count.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            *count += 1;
            *count
        };
        let record = RenderRecord {
            render,
            generation,
            triggers,
            left_out,
            millis: elapsed.as_millis(),
            files: files.entries().map(|(path, file)| (path, file.checksum.to_string())).collect(),
        };
        info!(
            render,
            generation,
            triggers = triggers.len(),
            first_trigger = triggers.first().map(String::as_str).unwrap_or(""),
            millis = record.millis,
            blocks_reused = blocks.reused,
            blocks_rendered = blocks.rendered,
            "rendered"
        );
        if let Some(dir) = &self.dir
            && let Err(error) = write_render(dir, files, &record)
        {
            warn!(dir = %dir.display(), %error, "could not write the render");
        }
    }
}

fn write_render(dir: &Path, files: &FileSet, record: &RenderRecord<'_>) -> std::io::Result<()> {
    // Certificates carry private keys: renders.log lists their checksums, their content stays
    // with the pods. Basic-auth password hashes are written redacted.
    for (relative, file) in files.entries().filter(|(_, file)| !file.sensitive) {
        let path = dir.join(&relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Write then rename, so a reader never sees half a file.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, crate::files::redact_password_hashes(&file.content).as_bytes())?;
        std::fs::rename(&tmp, &path)?;
    }
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("renders.log"))?;
    writeln!(log, "{}", serde_json::to_string(record).unwrap_or_default())
}
