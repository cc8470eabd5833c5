//! Render: turns the watched stores and the configuration's templates into the desired file
//! set (`haproxy.cfg`, maps, general files), each with its checksum.
//!
//! Pure over its inputs: no network, no disk. Templates are compiled once per configuration
//! ([`Renderer::compile`]) and rendered many times ([`Renderer::render`]). Output is
//! byte-for-byte deterministic: stores hand objects out in (namespace, name) order whatever the
//! order their events arrived in.

mod annotations;

pub use annotations::nginx::PREFIX as NGINX_PREFIX;
pub use annotations::{Judgement, Outcome, judge as judge_annotation};

/// Every annotation name of one of the default library's settings (`ssl-redirect`, say), in
/// precedence order: haptic's, haproxy-ingress's, haproxytech's (docs/annotations.md).
pub fn annotation_names(setting: &str) -> Vec<String> {
    annotations::names_of(setting).to_vec()
}
mod context;

/// The path of the field of an object's `spec` or annotations holding one of `needles` (values
/// HAProxy quoted when it refused a render), tried in order.
pub fn field_holding_any(object: &minijinja::Value, needles: &[String]) -> Option<String> {
    context::field_holding_any(object, needles)
}
pub(crate) mod filters;
mod library;

/// When a stored object was created, in seconds since the epoch (`u32::MAX`, the newest, when
/// it does not say): the order in which contested things and blame are handed out.
pub fn created_seconds(object: &minijinja::Value) -> u32 {
    library::created_seconds(object)
}
mod memo;

pub use memo::BlockCounts;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::Serialize;
use thiserror::Error;

use crate::config::HAProxyTemplateConfigSpec;
use crate::files::{FileSet, RenderedFile};
use crate::store::{ObjectRef, Stores};

/// Name of the main configuration's template.
pub const HAPROXY_CFG: &str = "haproxy.cfg";

/// An HAProxy pod as templates see it (`pods`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, the pod's identity.
    pub uid: String,
    /// `status.podIP`.
    pub ip: String,
}

/// Errors of compiling or rendering templates; each names the template and, where it applies,
/// the line and the object being rendered.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// A template does not parse, or a name is unusable as a file name.
    #[error("template {template}{}: {detail}", line_suffix(*line))]
    Syntax {
        /// The template's name (`haproxy.cfg`, `maps/host.map`, `snippets/x`).
        template: String,
        /// The line of the problem.
        line: Option<usize>,
        /// What is wrong.
        detail: String,
    },
    /// A template uses `resources.<alias>` for an alias nothing watches.
    #[error("template {template} uses resources.{alias}, but no watched resource has that alias (watched: {known})")]
    UnknownAlias {
        /// The template's name.
        template: String,
        /// The unknown alias.
        alias: String,
        /// The aliases that exist.
        known: String,
    },
    /// Rendering failed; a value refused for HAProxy's syntax blames its object and field.
    #[error(
        "rendering {template}{}{}: {detail}",
        line_suffix(*line),
        object_suffix(object.as_deref(), field.as_deref())
    )]
    Render {
        /// The template where it failed.
        template: String,
        /// The line where it failed.
        line: Option<usize>,
        /// The object being rendered (the one touched last), if any.
        object: Option<Box<ObjectRef>>,
        /// The field of that object holding the refused value, when it is one of its own.
        field: Option<String>,
        /// Whether the object's own value was refused (so leaving the object out can help).
        refused_value: bool,
        /// What went wrong.
        detail: String,
    },
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(" line {l}")).unwrap_or_default()
}

fn object_suffix(object: Option<&ObjectRef>, field: Option<&str>) -> String {
    match (object, field) {
        (Some(o), Some(field)) => format!(" (field {field} of {o})"),
        (Some(o), None) => format!(" (while rendering {o})"),
        (None, _) => String::new(),
    }
}

impl RenderError {
    /// The object to leave out so the rest can render, when a value of that object was refused.
    pub fn offending_object(&self) -> Option<&ObjectRef> {
        match self {
            Self::Render { object, refused_value: true, .. } => object.as_deref(),
            _ => None,
        }
    }
}

/// A Warning about an object the render serves as it is, but not entirely as it asks (an
/// Ingress's annotations haptic does not implement).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The object.
    pub object: ObjectRef,
    /// What is wrong, for people.
    pub message: String,
}

/// One render: its files and what it hands on beside them, all from the same stores.
#[derive(Debug)]
pub struct Render {
    /// The files to deploy.
    pub files: FileSet,
    /// The objects left out so the rest could render, each with the error it caused (only
    /// the `_leaving_out` renders leave any out).
    pub left_out: Vec<RenderError>,
    /// The Gateway API status this render owes, and the Gateways' Services, when the
    /// configuration serves the Gateway API.
    pub gateway_status: Option<crate::gateway::Owed>,
    /// The server slots as this render left them (a dry render moves none).
    pub slots: Arc<crate::plan::slots::Slots>,
    /// How many `render_each` blocks this render reused and how many it rendered.
    pub blocks: BlockCounts,
    /// Warnings about objects served as they are (annotations haptic ignores).
    pub notices: Vec<Notice>,
}

/// Compiled templates of one configuration.
#[derive(Debug)]
pub struct Renderer {
    env: Environment<'static>,
    map_names: Vec<String>,
    file_names: Vec<String>,
    extra_context: Value,
    /// What the last successful render handed on: server slots (moved only by a successful
    /// render, seeded from the journal), blocks, sorted views (see `context::Carried`).
    carried: std::sync::Mutex<context::Carried>,
    /// The Gateway API settings, when the configuration serves it.
    gateway: Option<crate::config::GatewaySettings>,
    /// What each template last rendered to (its text's fingerprint and checksum), for
    /// `last_file`.
    last_files: std::sync::Mutex<BTreeMap<String, (memo::Fingerprint, crate::files::Checksum)>>,
}

/// The render's shared state (server slots, collectors), which `name` needs: a template
/// function called outside a render has none.
fn shared_state(state: &minijinja::State, name: &str) -> Result<std::sync::Arc<context::Shared>, minijinja::Error> {
    state.lookup("shared").and_then(|shared| shared.downcast_object::<context::Shared>()).ok_or_else(|| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("{name} needs the render's shared state"))
    })
}

/// Prints one value into a file. Strings are printed only when an HAProxy-safe filter gave
/// them (a "safe" string in minijinja's terms) or they come from the configuration's own
/// `extraContext`: a value read from the cluster (or computed from one) that reaches a file
/// without a filter is refused, in every template, and its object and field are blamed.
/// Numbers and booleans print as themselves; whole maps, lists and objects are refused. No
/// printed string may hold a control character (a newline would start a directive).
fn format_value(out: &mut minijinja::Output, value: &Value) -> Result<(), minijinja::Error> {
    use minijinja::value::ValueKind;
    let refused = |message: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message);
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::String => {
            let text = value.as_str().unwrap_or_default();
            if text.is_empty() {
                return Ok(());
            }
            if !value.is_safe() {
                context::blame_value(text);
                return Err(refused(
                    "refusing to print a value that no HAProxy-safe filter vetted: pass it through one of \
                     haproxy_quote, bare_word, hostname, url_path, map_key, haproxy_duration, one_of, cidr, \
                     socket_path (a value joined to a filtered one is refused too: filter the whole)"
                        .into(),
                ));
            }
            if let Some(c) = filters::forbidden_char(text) {
                context::blame_value(text);
                return Err(refused(format!("refusing to print a value holding {}", filters::describe(c))));
            }
            out.write_str(text).map_err(minijinja::Error::from)
        }
        ValueKind::Number | ValueKind::Bool | ValueKind::None => write!(out, "{value}").map_err(minijinja::Error::from),
        // Whole lines haptic's own functions wrote, each from vetted parts (`server_lines`).
        ValueKind::Plain if let Some(lines) = value.downcast_object_ref::<filters::VettedLines>() => {
            out.write_str(&lines.0).map_err(minijinja::Error::from)
        }
        other => Err(refused(format!("refusing to print a whole {other}: print its fields, through filters"))),
    }
}

/// The configuration's own `extraContext`, its strings marked as vetted: it is written by the
/// operator who installs haptic, not read from the cluster's objects.
fn trusted_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::String(text) => Value::from_safe_string(text.clone()),
        serde_json::Value::Array(items) => Value::from(items.iter().map(trusted_value).collect::<Vec<_>>()),
        serde_json::Value::Object(entries) => Value::from(
            entries.iter().map(|(key, value)| (key.clone(), trusted_value(value))).collect::<BTreeMap<_, _>>(),
        ),
        other => Value::from(Serde(other)),
    }
}

/// The template engine with haptic's syntax, formatter and HAProxy-safe filters: what every
/// configuration's templates run in, before any library is added.
fn engine() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
    // Every template "auto-escapes" with haptic's formatter: only filtered strings print,
    // and joining a filtered string to an unfiltered one runs the unfiltered one through
    // the formatter (minijinja's markup concatenation), which refuses it.
    env.set_auto_escape_callback(|_| AutoEscape::Custom("haproxy".into()));
    // Block tags take their own line and indentation with them, so templates can be laid out
    // readably without leaving blank lines in the output.
    let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).keep_trailing_newline(true).build();
    env.set_syntax(syntax.expect("the default delimiters are valid"));
    env.set_formatter(|out, _state, value| format_value(out, value));
    let vetted = |result: Result<String, minijinja::Error>| result.map(Value::from_safe_string);
    env.add_filter("haproxy_quote", move |value: &str| vetted(filters::haproxy_quote(value)));
    env.add_filter("log_text", move |value: &str| vetted(filters::log_text(value)));
    env.add_filter("bare_word", move |value: &str| vetted(filters::bare_word(value)));
    env.add_filter("hostname", move |value: &str| vetted(filters::hostname(value)));
    env.add_filter("socket_path", move |value: &str| vetted(filters::socket_path(value)));
    env.add_filter("map_key", move |value: &str| vetted(filters::map_key(value)));
    env.add_filter("url_path", move |value: &str| vetted(filters::url_path(value)));
    env.add_filter("haproxy_duration", move |value: &str| vetted(filters::haproxy_duration(value)));
    env.add_filter("one_of", move |value: &str, allowed: minijinja::value::Rest<String>| {
        vetted(filters::one_of(value, &allowed))
    });
    env.add_filter("cidr", move |value: &str| vetted(filters::cidr(value)));
    // minijinja's `safe` would vouch for any value; here only the filters above can.
    env.add_filter("safe", |_value: Value| -> Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "safe is not available: values print through an HAProxy-safe filter (haproxy_quote, log_text, bare_word, \
             hostname, url_path, map_key, haproxy_duration, one_of, cidr, socket_path)",
        ))
    });
    env
}

/// Adds the configuration's templates (`haproxy.cfg`, maps, files, snippets) and checks that
/// every `resources.<alias>` they read is watched.
fn add_templates(env: &mut Environment<'static>, spec: &HAProxyTemplateConfigSpec) -> Result<(), RenderError> {
    let templates = &spec.templates;
    let mut sources: Vec<(String, &str)> = vec![(HAPROXY_CFG.to_owned(), templates.haproxy_config.as_str())];
    for (kind, entries) in [("maps", &templates.maps), ("files", &templates.files), ("snippets", &templates.snippets)] {
        for (name, source) in entries {
            check_file_name(name).map_err(|detail| RenderError::Syntax {
                template: format!("{kind}/{name}"),
                line: None,
                detail,
            })?;
            sources.push((format!("{kind}/{name}"), source.as_str()));
        }
    }
    for (name, source) in &sources {
        env.add_template_owned(name.clone(), source.to_string()).map_err(|error| RenderError::Syntax {
            template: name.clone(),
            line: error.line(),
            detail: error.detail().map(str::to_owned).unwrap_or_else(|| error.kind().to_string()),
        })?;
    }
    let known: BTreeSet<&str> = spec.watched_resources.keys().map(String::as_str).collect();
    for (name, _) in &sources {
        let template = env.get_template(name).map_err(|error| RenderError::Syntax {
            template: name.clone(),
            line: error.line(),
            detail: error.to_string(),
        })?;
        for variable in template.undeclared_variables(true) {
            if let Some(alias) = variable.strip_prefix("resources.").map(|rest| rest.split('.').next().unwrap_or(rest))
                && !known.contains(alias)
            {
                return Err(RenderError::UnknownAlias {
                    template: name.clone(),
                    alias: alias.to_owned(),
                    known: known.iter().copied().collect::<Vec<_>>().join(", "),
                });
            }
        }
    }
    Ok(())
}

impl Renderer {
    /// Compiles every template of a configuration and checks the aliases they use.
    pub fn compile(spec: &HAProxyTemplateConfigSpec) -> Result<Self, RenderError> {
        let mut env = engine();
        library::register(&mut env, &spec.dataplane);
        add_templates(&mut env, spec)?;
        let templates = &spec.templates;
        Ok(Self {
            env,
            map_names: templates.maps.keys().cloned().collect(),
            file_names: templates.files.keys().cloned().collect(),
            extra_context: templates.extra_context.as_ref().map(trusted_value).unwrap_or_default(),
            carried: Default::default(),
            gateway: spec.gateway_api.clone(),
            last_files: Default::default(),
        })
    }

    /// Starts from these server slots (as a journal recorded them), unless slots were assigned
    /// already.
    pub fn seed_slots(&self, slots: Arc<crate::plan::slots::Slots>) {
        if let Ok(mut kept) = self.carried.lock()
            && kept.slots.is_empty()
        {
            kept.slots = slots;
            // Not the slots the kept blocks (if any) left: each block's are checked.
            kept.slots_moved = None;
        }
    }

    /// The server slots as the last successful render left them.
    pub fn slots(&self) -> Arc<crate::plan::slots::Slots> {
        self.carried.lock().map(|carried| carried.slots.clone()).unwrap_or_default()
    }

    /// How many `render_each` blocks the last successful render left for the next to reuse.
    pub fn blocks_kept(&self) -> usize {
        self.carried.lock().map(|carried| carried.blocks.len()).unwrap_or_default()
    }

    /// Renders every file from the current stores and pods.
    pub fn render(&self, stores: &Stores, pods: &[PodInfo]) -> Result<Render, RenderError> {
        self.render_keeping(stores, pods, true)
    }

    /// Renders as `render` does, but keeps nothing of it (server slots, the Gateway API
    /// status): a what-if, such as an admission review of an object not yet stored.
    pub fn render_dry(&self, stores: &Stores, pods: &[PodInfo]) -> Result<Render, RenderError> {
        self.render_keeping(stores, pods, false)
    }

    fn render_keeping(&self, stores: &Stores, pods: &[PodInfo], keep: bool) -> Result<Render, RenderError> {
        // A render allocates and frees millions of small objects; the process's settings give
        // threads no allocation cache, so this one gets one for the render's length.
        crate::memory::with_thread_cache(|| self.render_cached(stores, pods, keep))
    }

    fn render_cached(&self, stores: &Stores, pods: &[PodInfo], keep: bool) -> Result<Render, RenderError> {
        context::reset_tracking();
        memo::reset_recordings();
        // A render starts from what the last kept render handed on and hands on only if the
        // whole render succeeds, so a render that fails (or an attempt that leaves an object out)
        // moves no server.
        let carried = self.carried.lock().map(|carried| carried.clone()).unwrap_or_default();
        let resources = Value::from_object(context::Resources::new(stores, &carried.listings));
        // A dry render hands the slots it started from back unmoved.
        let slots_before = carried.slots.clone();
        let shared = Value::from_object(context::Shared::starting_from(carried));
        // The Gateway API model: built once per render from the same stores, so the status it
        // owes describes exactly what this render serves.
        let gateway = self.gateway.as_ref().map(|settings| {
            let ips = pods.iter().map(|pod| pod.ip.clone()).filter(|ip| !ip.is_empty()).collect();
            crate::gateway::build(
                settings,
                &crate::gateway::Inputs::from_stores(stores, ips, settings.gateway_services.as_ref()),
            )
        });
        let ctx = minijinja::context! {
            gateway => match &gateway {
                Some(model) => Value::from(Serde(model)),
                None => Value::from(Serde(crate::gateway::Model::default())),
            },
            resources => resources.clone(),
            pods => Value::from(Serde(pods)),
            extraContext => self.extra_context.clone(),
            shared => shared.clone(),
        };
        let render_text = |name: &str| -> Result<String, RenderError> {
            let template = self.env.get_template(name).map_err(|error| self.render_error(name, &error))?;
            template.render(&ctx).map_err(|error| self.render_error(name, &error))
        };
        let render = |name: &str| -> Result<RenderedFile, RenderError> {
            let content = render_text(name)?;
            Ok(match self.last_file(name, &content) {
                (_, Some(file)) => file,
                (fingerprint, None) => self.remember(name, fingerprint, RenderedFile::new(content)),
            })
        };
        let (haproxy_cfg, maps, mut files) = std::thread::scope(|scope| {
            let content = render_text(HAPROXY_CFG)?;
            // The configuration (megabytes at 10,000 Ingresses) is hashed on a thread of its
            // own while the other files render, when it changed.
            let (fingerprint, known) = self.last_file(HAPROXY_CFG, &content);
            let hashing = match known {
                Some(file) => Hashing::Done(file),
                None => {
                    let content: Arc<str> = content.into();
                    let shared = content.clone();
                    match std::thread::Builder::new()
                        .name("haptic-checksum".into())
                        .spawn_scoped(scope, move || RenderedFile::new(shared))
                    {
                        Ok(running) => Hashing::Running(running),
                        // No thread to be had: hashed here.
                        Err(_) => Hashing::Done(self.remember(HAPROXY_CFG, fingerprint, RenderedFile::new(content))),
                    }
                }
            };
            let mut maps = BTreeMap::new();
            for name in &self.map_names {
                maps.insert(name.clone(), render(&format!("maps/{name}"))?);
            }
            let mut files = BTreeMap::new();
            for name in &self.file_names {
                files.insert(name.clone(), render(&format!("files/{name}"))?);
            }
            let haproxy_cfg = match hashing {
                Hashing::Done(file) => file,
                Hashing::Running(running) => self.remember(
                    HAPROXY_CFG,
                    fingerprint,
                    running.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                ),
            };
            Ok::<_, RenderError>((haproxy_cfg, maps, files))
        })?;
        let state = shared.downcast_object_ref::<context::Shared>();
        let certs = state.map(context::Shared::certs).unwrap_or_default();
        for (name, file) in state.map(context::Shared::files).unwrap_or_default() {
            files.entry(name).or_insert(file);
        }
        let blocks = state.map(context::Shared::block_counts).unwrap_or_default();
        let notices = state.map(context::Shared::notices).unwrap_or_default();
        let mut slots = slots_before;
        if keep && let (Some(state), Ok(mut kept)) = (state, self.carried.lock()) {
            let listings = resources.downcast_object_ref::<context::Resources>().map(context::Resources::listings);
            *kept = state.take_carried(listings.unwrap_or_default());
            slots = kept.slots.clone();
        }
        Ok(Render {
            files: FileSet { haproxy_cfg, maps, files, certs },
            left_out: Vec::new(),
            gateway_status: gateway
                .map(|model| crate::gateway::Owed { status: model.status, services: model.gateway_services }),
            slots,
            blocks,
            notices,
        })
    }

    /// The file `content` makes for a template: with the checksum of the template's last file
    /// when `content` is that file's text again (recognised by a 128-bit fingerprint with this
    /// process's secret seeds, as blocks are), else `None` and the fingerprint to `remember`
    /// with the checksum computed. At 10,000 Ingresses, hashing files that had not changed with
    /// SHA-256 was a tenth of a render that reused every block. Only fingerprints are kept, not
    /// the files: holding the last render's text cost the controller megabytes once its pods
    /// had moved on.
    fn last_file(&self, template: &str, content: &str) -> (memo::Fingerprint, Option<RenderedFile>) {
        let fingerprint = memo::text_fingerprint(content);
        let known = self.last_files.lock().ok().and_then(|last| {
            let (known, checksum) = last.get(template)?;
            (*known == fingerprint).then(|| RenderedFile {
                content: content.into(),
                checksum: *checksum,
                sensitive: false,
            })
        });
        (fingerprint, known)
    }

    /// Remembers the fingerprint and checksum of a template's file for the next render's
    /// `last_file`, and hands the file back.
    fn remember(&self, template: &str, fingerprint: memo::Fingerprint, file: RenderedFile) -> RenderedFile {
        if let Ok(mut last) = self.last_files.lock() {
            last.insert(template.to_owned(), (fingerprint, file.checksum));
        }
        file
    }

    /// Renders, leaving out objects whose values are refused, one at a time, up to `max_left_out`,
    /// so one bad object cannot stop every other from being served.
    /// The render names each object left out with the error it caused.
    pub fn render_leaving_out(
        &self,
        stores: &Stores,
        pods: &[PodInfo],
        max_left_out: usize,
    ) -> Result<Render, RenderError> {
        self.leaving_out(stores, pods, max_left_out, true)
    }

    /// `render_leaving_out` as a what-if: nothing of it is kept (see `render_dry`).
    pub fn render_dry_leaving_out(
        &self,
        stores: &Stores,
        pods: &[PodInfo],
        max_left_out: usize,
    ) -> Result<Render, RenderError> {
        self.leaving_out(stores, pods, max_left_out, false)
    }

    fn leaving_out(
        &self,
        stores: &Stores,
        pods: &[PodInfo],
        max_left_out: usize,
        keep: bool,
    ) -> Result<Render, RenderError> {
        let mut stores = stores.clone();
        let mut left_out = Vec::new();
        loop {
            let error = match self.render_keeping(&stores, pods, keep) {
                Ok(render) => return Ok(Render { left_out, ..render }),
                Err(error) => error,
            };
            let Some(object) = error.offending_object().filter(|_| left_out.len() < max_left_out).cloned() else {
                return Err(error);
            };
            if crate::store::find(&stores, &object).is_none() {
                return Err(error);
            }
            stores = crate::store::without(&stores, std::slice::from_ref(&object));
            left_out.push(error);
        }
    }

    fn render_error(&self, fallback_name: &str, error: &minijinja::Error) -> RenderError {
        // An error inside an included template arrives wrapped ("error in snippets/x"); the
        // innermost one knows the template, line and message that matter.
        let mut innermost = error;
        while let Some(inner) = std::error::Error::source(innermost).and_then(|s| s.downcast_ref::<minijinja::Error>())
        {
            innermost = inner;
        }
        let offender = context::offender();
        let template = innermost.name().or(error.name()).unwrap_or(fallback_name);
        let mut detail = innermost.detail().map(str::to_owned).unwrap_or_else(|| innermost.kind().to_string());
        if template != fallback_name {
            detail = format!("{detail} (included from {fallback_name})");
        }
        let field = offender.as_ref().and_then(|offender| offender.field.clone());
        RenderError::Render {
            template: template.to_owned(),
            line: innermost.line(),
            refused_value: offender.is_some(),
            object: offender.map(|offender| offender.object).or_else(context::last_object).map(Box::new),
            field,
            detail,
        }
    }
}

/// The configuration's file while its checksum is computed.
enum Hashing<'scope> {
    /// Known (the last render's checksum), or hashed here and remembered already.
    Done(RenderedFile),
    /// Being hashed on a thread of its own.
    Running(std::thread::ScopedJoinHandle<'scope, RenderedFile>),
}

/// A name usable as a file name on the pods: no path separators, no `..`, not empty.
fn check_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.chars().any(char::is_control) {
        Err(format!("{name:?} is not a usable file name"))
    } else if name == crate::files::CERTIFICATE_MANIFEST {
        Err(format!("{name:?} is the name of haptic's own certificate manifest on the pods"))
    } else {
        Ok(())
    }
}
