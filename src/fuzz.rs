//! Fuzz targets: the parsers that read what other programs wrote (the Dataplane API's answers,
//! the configuration as the pod stores it) and the filters that keep cluster values inside
//! HAProxy's syntax, run on generated and mutated inputs for a time budget.
//!
//! Each target runs batches of proptest cases, each batch from a fresh seed, until
//! `HAPTIC_FUZZ_SECONDS` (default 3) have passed; a failure is shrunk and reported with its
//! seed. `make test` runs them for the default budget; `make fuzz` for as long as asked
//! (`FUZZ_SECONDS=600`). Each prints how many cases it ran.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::dataplane::StoredConfig;
use crate::dataplane::answers;
use crate::plan::config;
use crate::render::filters;

/// Longest error message a parser may make of an answer, whatever the answer's size: errors
/// are logged and journaled, and an answer is not ours to copy there whole.
const MAX_ERROR_LEN: usize = answers::MESSAGE_LIMIT + 64;

fn budget() -> Duration {
    let seconds = std::env::var("HAPTIC_FUZZ_SECONDS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(3.0);
    Duration::from_secs_f64(seconds.max(0.1))
}

/// Runs `test` on inputs from `strategy` until the budget is spent; panics with the shrunk
/// failing input and the seed that found it.
fn fuzz<S: Strategy>(target: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let deadline = Instant::now() + budget();
    let mut cases = 0u64;
    let mut batch = 0u64;
    while Instant::now() < deadline {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut seed = [0u8; 32];
        seed[..16].copy_from_slice(&nanos.to_le_bytes());
        seed[16..24].copy_from_slice(&batch.to_le_bytes());
        let config = Config { cases: 512, failure_persistence: None, max_shrink_iters: 4096, ..Config::default() };
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
        match runner.run(&strategy, &test) {
            Ok(()) => {}
            Err(TestError::Fail(reason, input)) => {
                panic!("fuzz target {target} failed (seed {seed:02x?}): {reason}\nminimal input: {input:#?}")
            }
            Err(TestError::Abort(reason)) => panic!("fuzz target {target} aborted: {reason}"),
        }
        cases += 512;
        batch += 1;
    }
    eprintln!("fuzz target {target}: {cases} cases in {:?}, no failure", budget());
}

/// Text that is mostly like `samples` (real answers and configurations), mutated: cut,
/// spliced with hostile fragments, bytes replaced; or anything at all.
fn mutated(samples: &'static [&'static str]) -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        Just("\n".to_owned()),
        Just("\"".to_owned()),
        Just("\\".to_owned()),
        Just("#".to_owned()),
        Just("'".to_owned()),
        Just("{".to_owned()),
        Just("[".to_owned()),
        Just("\u{0}".to_owned()),
        Just("\u{feff}".to_owned()),
        Just("# _version=".to_owned()),
        Just("server s 10.0.0.1:80 weight".to_owned()),
        Just("backend ".to_owned()),
        Just("[fd00::1]:".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-1".to_owned()),
        Just("null".to_owned()),
        "\\PC{0,12}",
        "[ -~]{0,40}",
    ];
    let edits = proptest::collection::vec((any::<prop::sample::Index>(), 0usize..8, fragment), 0..8);
    let mutated = (prop::sample::select(samples), edits).prop_map(|(sample, edits)| {
        let mut text = sample.to_owned();
        for (at, cut, insert) in edits {
            let mut start = at.index(text.len() + 1);
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            let mut end = (start + cut).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(start..end, &insert);
        }
        text
    });
    prop_oneof![
        6 => mutated,
        1 => "\\PC{0,200}",
        1 => any::<Vec<u8>>().prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        1 => (1usize..200).prop_map(|depth| format!("{}{}", "[".repeat(depth * 10), "]".repeat(depth * 10))),
        1 => (0usize..64).prop_map(|kib| format!("{{\"message\": \"{}\"}}", "x".repeat(kib * 1024))),
    ]
}

const ANSWERS: &[&str] = &[
    r#"{"api":{"build_date":"2025-05-01T00:00:00.000Z","version":"v3.2.7 3f1e3ef3"},"system":{}}"#,
    r#"{"haproxy":"up"}"#,
    r#"{"haproxy":"unknown"}"#,
    r#"{"id":"2025-05-01-1","status":"failed","response":"[ALERT] (1) : config : parsing [x.cfg:3]"}"#,
    r#"[{"id":"a-1","status":"succeeded"},{"id":"a-2","status":"in_progress","reload_timestamp":17}]"#,
    r#"{"name":"srv2","address":"10.0.0.7","port":8080,"admin_state":"ready","operational_state":"up"}"#,
    r#"{"name":"s","address":"fd00::7","admin_state":"maint"}"#,
    r#"[{"storage_name":"host.map","description":"","file":"/etc/haproxy/maps/host.map","size":12}]"#,
    r#"{"code":400,"message":"invalid configuration: [ALERT] parsing [/tmp/x:3] : unknown keyword"}"#,
    "42\n",
];

const CONFIGS: &[&str] = &[
    "# _md5hash=0123456789abcdef\n# _version=7\nglobal\n  maxconn 100\n\ndefaults unnamed_defaults_1\n  \
     mode http\n\nbackend app\n  balance roundrobin\n  server s1 10.0.0.1:8080 weight 10 check\n  \
     server s2 [fd00::2]:80 disabled\n  server s3 fd00::3 enabled\n",
    "frontend web\n  bind :80 # public\n  http-request return string \"a # b\" if { path / }\n  \
     log-format %t\\ %s\n  use_backend %[req.hdr(host),lower,map('/etc/haproxy/maps/host.map')]\n",
    "backend x\n  server 'odd name' '10.0.0.1':'80'\n  server\n  server a\n  server b c d e weight\n",
];

#[test]
fn dataplane_answer_parsers_never_panic_and_bound_their_errors() {
    fuzz("dataplane answers", mutated(ANSWERS), |body| {
        let errors = [
            answers::parse_info(&body).err(),
            answers::parse_health(&body).err(),
            answers::parse_version(&body).err(),
            answers::parse_reload(&body).err(),
            answers::parse_reloads(&body).err(),
            answers::parse_runtime_server(&body).err(),
            answers::parse_storage_names(&body).err(),
            StoredConfig::from_text(body.clone(), Some(&body)).err(),
        ];
        for error in errors.into_iter().flatten().map(|error| error.to_string()) {
            prop_assert!(error.len() <= MAX_ERROR_LEN, "an error of {} bytes: {:.200}", error.len(), error);
        }
        let message = answers::error_message(&body);
        prop_assert!(message.len() <= MAX_ERROR_LEN, "an error message of {} bytes", message.len());
        Ok(())
    });
}

#[test]
fn dataplane_answers_written_as_the_api_writes_them_read_back_as_written() {
    let reload = (
        "[a-z0-9-]{0,24}",
        prop::sample::select(&["in_progress", "succeeded", "failed"][..]),
        proptest::option::of("\\PC{0,60}"),
    );
    let server = ("\\PC{0,40}", proptest::option::of(any::<u16>()), "[a-z]{0,8}");
    fuzz("dataplane answers round trip", (reload, server), |((id, status, response), (address, port, state))| {
        let body = serde_json::json!({"id": id, "status": status, "response": response}).to_string();
        let parsed = answers::parse_reload(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parsed.id.map(|id| id.0), (!id.is_empty()).then(|| id.clone()));
        prop_assert_eq!(parsed.response, response.filter(|r| !r.is_empty()));
        let body = serde_json::json!({"address": address, "port": port, "admin_state": state}).to_string();
        let parsed = answers::parse_runtime_server(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!((parsed.address, parsed.port, parsed.admin_state), (address, port, state));
        Ok(())
    });
}

#[test]
fn the_planners_configuration_parser_never_panics_and_keeps_every_section_and_server() {
    fuzz("configuration parser", mutated(CONFIGS), |text| {
        let parsed = config::parse(&text);
        let headers = text
            .lines()
            .filter(|line| config::words(line).first().is_some_and(|w| config::SECTION_KEYWORDS.contains(&w.as_str())))
            .count();
        prop_assert_eq!(parsed.sections.len(), headers);
        // Every line's words are found again in the parse, in order.
        let mut flat: Vec<Vec<String>> = parsed.preamble.clone();
        for section in &parsed.sections {
            flat.push(section.header.clone());
            flat.extend(section.directives.iter().cloned());
        }
        let servers: usize = parsed.sections.iter().map(|s| s.servers.len()).sum();
        let lines = text.lines().map(config::words).filter(|w| !w.is_empty()).count();
        prop_assert_eq!(flat.len() + servers, lines);
        Ok(())
    });
}

/// HAProxy's own reading of one configuration line into words (configuration manual, 2.2
/// "Quoting and escaping"): outside quotes a backslash escapes the next character and `#`
/// starts a comment; single quotes take everything literally; double quotes allow backslash
/// escapes and expand `$VAR` (reported here as an error: a value must never expand).
fn haproxy_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') | (Some('"'), '"') => quote = None,
            (Some('\''), c) => current.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') => break,
            (None, c) if c == ' ' || c == '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            (_, '\\') => {
                let next = chars.next().ok_or("a line ending in a backslash")?;
                if matches!(next, 'n' | 'r' | 't' | 'x') {
                    // HAProxy turns these into control characters or hex bytes.
                    return Err(format!("the escape sequence \\{next}"));
                }
                current.push(next);
                in_word = true;
            }
            (Some('"'), '$') => return Err("a $ inside double quotes expands".into()),
            (_, c) => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("an unclosed quote".into());
    }
    if in_word {
        words.push(current);
    }
    Ok(words)
}

fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,30}",
        "[ -~]{0,30}",
        "[a-z0-9.*-]{0,30}",
        "[a-z0-9/ '\"#\\\\$%\\[\\]{}-]{0,30}",
        any::<Vec<u8>>().prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        (0usize..12).prop_map(|kib| "a".repeat(kib * 1024)),
        Just("*.".to_owned()),
        Just("${HOME}".to_owned()),
        Just("%[src]".to_owned()),
        Just("x if TRUE".to_owned()),
    ]
}

#[test]
fn haproxy_safe_filters_give_haproxy_exactly_the_value_or_refuse_it() {
    fuzz("HAProxy-safe filters", hostile(), |value| {
        if let Ok(quoted) = filters::haproxy_quote(&value) {
            prop_assert_eq!(haproxy_words(&format!("x {quoted}")), Ok(vec!["x".to_owned(), value.clone()]));
        } else {
            prop_assert!(value.chars().any(char::is_control));
        }
        // Log-format text: one word whose every `%` is doubled, so the log-format reader gives the
        // value back and never starts a sample expression.
        if let Ok(text) = filters::log_text(&value) {
            prop_assert_eq!(haproxy_words(&format!("x {text}")), Ok(vec!["x".to_owned(), value.replace('%', "%%")]));
        }
        let bare = |text: &str| -> bool {
            haproxy_words(&format!("x {text}")).is_ok_and(|words| words == ["x", text])
                && !text.contains(['\n', '\r', '%', '$'])
        };
        if let Ok(host) = filters::hostname(&value) {
            prop_assert_eq!(&host, &value);
            prop_assert!(bare(&host) && host.len() <= 253, "hostname let through {host:?}");
            prop_assert!(host.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.*".contains(&b)));
        }
        if let Ok(path) = filters::url_path(&value) {
            // `$` is literal outside double quotes, and `%` only ever starts an %-escape here.
            let one_word = haproxy_words(&format!("x {path}")).is_ok_and(|words| words == ["x", path.as_str()]);
            prop_assert!(one_word && path.starts_with('/') && !path.contains("%["), "url_path let through {path:?}");
        }
        if let Ok(key) = filters::map_key(&value) {
            prop_assert!(!key.is_empty() && !key.chars().any(|c| c.is_whitespace() || c.is_control()));
        }
        if let Ok(path) = filters::socket_path(&value) {
            prop_assert!(bare(&path) && path.starts_with('/'), "socket_path let through {path:?}");
        }
        if let Ok(duration) = filters::haproxy_duration(&value) {
            prop_assert!(bare(&duration) && duration.starts_with(|c: char| c.is_ascii_digit()), "{duration:?}");
        }
        if let Ok(network) = filters::cidr(&value) {
            prop_assert!(bare(&network), "cidr let through {network:?}");
            let address = network.split('/').next().unwrap_or_default();
            prop_assert!(address.parse::<std::net::IpAddr>().is_ok());
        }
        Ok(())
    });
}

#[test]
fn the_model_of_haproxys_word_reader_agrees_with_the_manual() {
    assert_eq!(haproxy_words(r"a 'b c' d\ e # f"), Ok(vec!["a".into(), "b c".into(), "d e".into()]));
    assert_eq!(haproxy_words(r"'it'\''s'"), Ok(vec!["it's".into()]));
    assert_eq!(haproxy_words("\"a\\\"b\""), Ok(vec!["a\"b".into()]));
    assert!(haproxy_words("\"$HOME\"").is_err());
    assert!(haproxy_words("'open").is_err());
}
