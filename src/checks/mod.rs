//! The configuration's validation tests (`spec.validationTests`): each test's fixtures are
//! rendered with the configuration's templates in place of the cluster's objects, and its
//! assertions are checked: on the files (pure, here), and by requests through a real HAProxy
//! running the render (`haproxy.rs`, the IO edge). The controller refuses a configuration
//! version whose tests fail; `haptic validate` runs them offline.

pub mod haproxy;
mod instrument;
pub mod validator;

use std::fmt;
use std::path::PathBuf;

use crate::config::{Assertion, ExpectedAnswer, HAProxyTemplateConfigSpec, RequestAssertion, ValidationTest};
use crate::files::FileSet;
use crate::render::Renderer;

pub use instrument::{Instrumented, MovedPort, instrument};

/// One assertion that did not hold (or could not be checked), located by test and position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The test's name.
    pub test: String,
    /// The assertion's position in the test (from 0), or `None` for the test as a whole (its
    /// render failed, HAProxy refused it).
    pub assertion: Option<usize>,
    /// What went wrong, with what the assertion asked.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.assertion {
            Some(index) => write!(f, "validation test {:?}, assertion {index}: {}", self.test, self.message),
            None => write!(f, "validation test {:?}: {}", self.test, self.message),
        }
    }
}

/// How one test went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestOutcome {
    /// The test's name.
    pub name: String,
    /// Assertions checked.
    pub checked: usize,
    /// Request assertions not run (no HAProxy to run them with).
    pub skipped: usize,
    /// What failed; empty when the test passed.
    pub failures: Vec<Failure>,
}

/// How every test went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// One outcome per test, in the configuration's order.
    pub tests: Vec<TestOutcome>,
}

impl Report {
    /// Every failure, in order.
    pub fn failures(&self) -> impl Iterator<Item = &Failure> {
        self.tests.iter().flat_map(|t| t.failures.iter())
    }

    /// Whether every test passed.
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The failures in one message (for a condition, an Event or the command's error).
    pub fn summary(&self) -> String {
        self.failures().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    }
}

/// Renders one test's fixtures (and `shared` objects beside them) with the configuration.
fn render_fixtures(
    spec: &HAProxyTemplateConfigSpec,
    renderer: &Renderer,
    test: &ValidationTest,
    shared: &[(PathBuf, serde_json::Value)],
) -> Result<FileSet, String> {
    let mut objects: Vec<(PathBuf, serde_json::Value)> = shared.to_vec();
    let origin = PathBuf::from(format!("validationTests/{}", test.name));
    objects.extend(test.fixtures.iter().map(|object| (origin.clone(), object.clone())));
    let stores = crate::offline::build_fixture_stores(spec, &objects).map_err(|e| format!("its fixtures: {e}"))?;
    let pods = crate::offline::pods(spec, &objects);
    renderer.render(&stores, &pods).map(|render| render.files).map_err(|e| format!("its fixtures do not render: {e}"))
}

/// Checks one file assertion (contains, notContains, matches, mapEntry) against a render;
/// `None` for a request assertion, which needs HAProxy.
fn check_file_assertion(assertion: &Assertion, files: &FileSet) -> Option<Result<(), String>> {
    let file_named = |name: &str| -> Result<&str, String> {
        files
            .entries()
            .find(|(path, _)| path == name)
            .map(|(_, file)| file.content.as_ref())
            .ok_or_else(|| format!("the render has no file {name}"))
    };
    let name = assertion.file.as_deref().unwrap_or("haproxy.cfg");
    let result = if let Some(text) = &assertion.contains {
        file_named(name).and_then(|content| {
            if content.contains(text.as_str()) { Ok(()) } else { Err(format!("{name} does not contain {text:?}")) }
        })
    } else if let Some(text) = &assertion.not_contains {
        file_named(name).and_then(|content| match content.lines().position(|line| line.contains(text.as_str())) {
            None if !content.contains(text.as_str()) => Ok(()),
            Some(line) => Err(format!("{name} contains {text:?} (line {})", line + 1)),
            None => Err(format!("{name} contains {text:?}")),
        })
    } else if let Some(pattern) = &assertion.matches {
        let regex = match regex::Regex::new(pattern) {
            Ok(regex) => regex,
            Err(error) => return Some(Err(format!("matches is no regular expression: {error}"))),
        };
        file_named(name).and_then(|content| {
            if content.lines().any(|line| regex.is_match(line)) {
                Ok(())
            } else {
                Err(format!("no line of {name} matches {pattern:?}"))
            }
        })
    } else if let Some(entry) = &assertion.map_entry {
        let path = format!("maps/{}", entry.map);
        file_named(&path).and_then(|content| {
            let found =
                content.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).find_map(|line| {
                    let (key, value) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
                    (key == entry.key).then(|| value.trim().to_owned())
                });
            match (found, &entry.value) {
                (None, _) => Err(format!("{path} has no entry {:?}", entry.key)),
                (Some(value), Some(expected)) if value != *expected => {
                    Err(format!("{path} maps {:?} to {value:?}, not {expected:?}", entry.key))
                }
                _ => Ok(()),
            }
        })
    } else {
        return None;
    };
    Some(result)
}

/// An answer to a request through HAProxy, as far as assertions read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// Response headers, names in lower case (the last value of a repeated one).
    pub headers: std::collections::BTreeMap<String, String>,
    /// The backend that took the request, when one did (instrumented HAProxy says so).
    pub backend: Option<String>,
}

/// Whether `answer` is what `expect` asks for; `Err` says what differs.
fn check_answer(expect: &ExpectedAnswer, answer: &Answer) -> Result<(), String> {
    let mut wrong = Vec::new();
    if let Some(status) = expect.status
        && status != answer.status
    {
        wrong.push(format!("status {} (expected {status})", answer.status));
    }
    if let Some(backend) = &expect.backend
        && answer.backend.as_deref() != Some(backend.as_str())
    {
        match &answer.backend {
            Some(other) => wrong.push(format!("backend {other} (expected {backend})")),
            None => wrong.push(format!("no backend took it (expected {backend}; status {})", answer.status)),
        }
    }
    for (name, value) in &expect.headers {
        match answer.headers.get(&name.to_ascii_lowercase()) {
            Some(got) if got == value => {}
            Some(got) => wrong.push(format!("header {name}: {got:?} (expected {value:?})")),
            None => wrong.push(format!("no header {name} (expected {value:?})")),
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(wrong.join(", ")) }
}

/// Describes a request assertion for messages: `GET example.com/path`.
pub fn describe_request(request: &RequestAssertion) -> String {
    format!("{} {}{}", request.method.as_deref().unwrap_or("GET"), request.host, request.path.as_deref().unwrap_or("/"))
}

/// Where request assertions are sent.
#[derive(Clone, Debug)]
pub enum Requests {
    /// An HAProxy started here from this binary.
    Local(PathBuf),
    /// The validator's HAProxy, through its Dataplane API (the chart's way: the controller's
    /// image holds no HAProxy).
    Validator(std::sync::Arc<validator::ValidatorApi>),
}

/// An HAProxy running one test's render.
enum Running<'a> {
    Local(Box<haproxy::LocalHaproxy>),
    Validator(validator::Serving<'a>),
}

impl Running<'_> {
    async fn ask(&self, request: &RequestAssertion) -> Result<Answer, haproxy::HaproxyError> {
        match self {
            Self::Local(running) => running.ask(request).await,
            Self::Validator(serving) => haproxy::ask(&serving.instrumented, request).await,
        }
    }

    async fn stop(self) {
        match self {
            Self::Local(running) => running.stop().await,
            // The validator's HAProxy keeps the render until the next one; its turn ends here.
            Self::Validator(_) => {}
        }
    }
}

/// Runs every validation test of `spec`: file assertions always; request assertions through
/// `requests` when given, skipped otherwise. `shared` objects are added to every test's
/// fixtures.
pub async fn run(
    spec: &HAProxyTemplateConfigSpec,
    renderer: &Renderer,
    shared: &[(PathBuf, serde_json::Value)],
    haproxy: Option<&Requests>,
) -> Report {
    let mut report = Report::default();
    for test in &spec.validation_tests {
        report.tests.push(run_test(spec, renderer, test, shared, haproxy).await);
    }
    report
}

async fn run_test(
    spec: &HAProxyTemplateConfigSpec,
    renderer: &Renderer,
    test: &ValidationTest,
    shared: &[(PathBuf, serde_json::Value)],
    haproxy: Option<&Requests>,
) -> TestOutcome {
    let mut outcome = TestOutcome { name: test.name.clone(), checked: 0, skipped: 0, failures: Vec::new() };
    let fail = |assertion: Option<usize>, message: String| Failure { test: test.name.clone(), assertion, message };
    let files = match render_fixtures(spec, renderer, test, shared) {
        Ok(files) => files,
        Err(message) => {
            outcome.failures.push(fail(None, message));
            return outcome;
        }
    };
    let mut requests = Vec::new();
    for (index, assertion) in test.assertions.iter().enumerate() {
        match check_file_assertion(assertion, &files) {
            Some(result) => {
                outcome.checked += 1;
                if let Err(message) = result {
                    outcome.failures.push(fail(Some(index), message));
                }
            }
            None => requests.extend(assertion.request.as_ref().map(|request| (index, request))),
        }
    }
    if requests.is_empty() {
        return outcome;
    }
    let Some(where_to) = haproxy else {
        outcome.skipped = requests.len();
        return outcome;
    };
    let started = match where_to {
        Requests::Local(binary) => haproxy::LocalHaproxy::start(binary, &files, &spec.dataplane)
            .await
            .map(|running| Running::Local(Box::new(running))),
        Requests::Validator(api) => api.serve(&files).await.map(Running::Validator),
    };
    let running = match started {
        Ok(running) => running,
        Err(error) => {
            outcome.failures.push(fail(None, error.to_string()));
            return outcome;
        }
    };
    for (index, request) in requests {
        outcome.checked += 1;
        let result = match running.ask(request).await {
            Ok(answer) => check_answer(&request.expect, &answer),
            Err(error) => Err(error.to_string()),
        };
        if let Err(message) = result {
            outcome.failures.push(fail(Some(index), format!("{}: {message}", describe_request(request))));
        }
    }
    running.stop().await;
    outcome
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::files::RenderedFile;

    fn files() -> FileSet {
        FileSet {
            haproxy_cfg: RenderedFile::new("global\nbackend be_web\n    server s1 10.0.0.1:80\n"),
            maps: BTreeMap::from([(
                "host.map".into(),
                RenderedFile::new("example.com be_web\n#c\nother.example be_x\n"),
            )]),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        }
    }

    fn assertion(json: serde_json::Value) -> Assertion {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn file_assertions_say_what_they_looked_for_and_where() {
        let check = |json| check_file_assertion(&assertion(json), &files()).unwrap();
        assert_eq!(check(serde_json::json!({"contains": "backend be_web"})), Ok(()));
        assert_eq!(
            check(serde_json::json!({"contains": "backend be_api"})),
            Err("haproxy.cfg does not contain \"backend be_api\"".into())
        );
        assert_eq!(
            check(serde_json::json!({"notContains": "server s1"})),
            Err("haproxy.cfg contains \"server s1\" (line 3)".into())
        );
        assert_eq!(check(serde_json::json!({"matches": "^\\s+server s\\d 10\\."})), Ok(()));
        assert_eq!(check(serde_json::json!({"file": "maps/host.map", "matches": "^other"})), Ok(()));
        assert_eq!(
            check(serde_json::json!({"file": "maps/nope.map", "contains": "x"})),
            Err("the render has no file maps/nope.map".into())
        );
        assert_eq!(
            check(serde_json::json!({"mapEntry": {"map": "host.map", "key": "example.com", "value": "be_web"}})),
            Ok(())
        );
        assert_eq!(
            check(serde_json::json!({"mapEntry": {"map": "host.map", "key": "example.com", "value": "be_x"}})),
            Err("maps/host.map maps \"example.com\" to \"be_web\", not \"be_x\"".into())
        );
        assert_eq!(
            check(serde_json::json!({"mapEntry": {"map": "host.map", "key": "#c"}})),
            Err("maps/host.map has no entry \"#c\"".into()),
            "comments are no entries"
        );
        let request = assertion(serde_json::json!({"request": {"host": "x", "expect": {"status": 200}}}));
        assert_eq!(check_file_assertion(&request, &files()), None, "requests need HAProxy");
    }

    #[test]
    fn an_answer_is_checked_for_status_backend_and_headers_each_named() {
        let expect: ExpectedAnswer = serde_json::from_value(
            serde_json::json!({"status": 200, "backend": "be_web", "headers": {"Location": "/a"}}),
        )
        .unwrap();
        let mut answer = Answer {
            status: 200,
            headers: BTreeMap::from([("location".into(), "/a".into())]),
            backend: Some("be_web".into()),
        };
        assert_eq!(check_answer(&expect, &answer), Ok(()));
        answer.status = 302;
        answer.backend = None;
        answer.headers.clear();
        assert_eq!(
            check_answer(&expect, &answer),
            Err("status 302 (expected 200), no backend took it (expected be_web; status 302), no header Location (expected \"/a\")".into())
        );
    }

    #[test]
    fn failures_name_test_and_assertion() {
        let failure = Failure { test: "routes".into(), assertion: Some(2), message: "x".into() };
        assert_eq!(failure.to_string(), "validation test \"routes\", assertion 2: x");
        let whole = Failure { test: "routes".into(), assertion: None, message: "y".into() };
        let report = Report {
            tests: vec![TestOutcome { name: "routes".into(), checked: 1, skipped: 0, failures: vec![failure, whole] }],
        };
        assert!(!report.passed());
        assert_eq!(report.summary(), "validation test \"routes\", assertion 2: x; validation test \"routes\": y");
    }
}
