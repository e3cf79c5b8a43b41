//! The deployment files under deploy/ are checked offline: every YAML file parses, the Kubernetes
//! objects are well-formed and probe the right admin endpoints, the ConfigMap's config passes
//! `rangeway check` and gets its download id key from the Secret, and every metric the alerts and
//! the Grafana board query is one a live rangeway really exports on /metrics. The balancer
//! example sends the PROXY protocol to instances whose config requires it, and every name
//! Prometheus scrapes the admin listener by is one that listener answers (`admin_hosts`).
//!
//! YAML is parsed by PyYAML (`python3-yaml`, installed by scripts/deps.sh), which prints each file
//! as JSON for serde_json.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use rangeway::config::Config;
use rangeway_middleware::chain::StageRegistry;
use serde_json::Value;
use support::http::{RawRequest, get_until, request};
use support::origin::{Behaviour, Origin};
use support::proxy::Proxy;
use support::tmp::TempDir;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Every file under `dir` whose name ends with one of `extensions`, sorted.
fn files_under(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| extensions.contains(&e))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The documents of a YAML file, as JSON values; panics with PyYAML's message when it does not
/// parse.
fn yaml_documents(path: &Path) -> Vec<Value> {
    let output = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)",
        ])
        .arg(path)
        .output()
        .expect("python3 runs (scripts/deps.sh installs it, with python3-yaml)");
    assert!(
        output.status.success(),
        "{} does not parse as YAML:\n{}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("python3 printed JSON")
}

fn kubernetes_objects() -> Vec<(PathBuf, Value)> {
    files_under(&deploy_dir().join("kubernetes"), &["yaml", "yml"])
        .into_iter()
        .flat_map(|path| {
            yaml_documents(&path)
                .into_iter()
                .filter(|doc| !doc.is_null())
                .map(move |doc| (path.clone(), doc))
        })
        .collect()
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value:#}"))
}

#[test]
fn every_yaml_file_under_deploy_parses() {
    let files = files_under(&deploy_dir(), &["yaml", "yml"]);
    assert!(files.len() >= 8, "expected the deploy/ YAML files, found {files:?}");
    for path in &files {
        let documents = yaml_documents(path);
        assert!(
            documents.iter().any(|doc| !doc.is_null()),
            "{} holds no YAML document",
            path.display()
        );
    }
}

#[test]
fn kubernetes_objects_are_well_formed_and_kustomization_lists_them() {
    let objects = kubernetes_objects();
    let mut kinds = BTreeSet::new();
    for (path, object) in &objects {
        let kind = str_at(object, "/kind");
        assert!(!str_at(object, "/apiVersion").is_empty(), "{}", path.display());
        if kind != "Kustomization" {
            assert!(!str_at(object, "/metadata/name").is_empty(), "{}", path.display());
            assert!(
                object.pointer("/metadata/namespace").is_none(),
                "{}: the manifests are namespace-less",
                path.display()
            );
        }
        kinds.insert(kind.to_owned());
    }
    for kind in [
        "ConfigMap",
        "Deployment",
        "Kustomization",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "StatefulSet",
    ] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }

    // kustomization.yaml lists every other file of the folder, and only existing ones.
    let dir = deploy_dir().join("kubernetes");
    let (_, kustomization) = objects
        .iter()
        .find(|(_, o)| str_at(o, "/kind") == "Kustomization")
        .expect("a Kustomization");
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_owned())
        .collect();
    let present: BTreeSet<String> = files_under(&dir, &["yaml", "yml"])
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| name != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present, "kustomization.yaml resources vs the files in deploy/kubernetes");
}

#[test]
fn the_deployment_probes_the_admin_port_and_its_selectors_match() {
    let objects = kubernetes_objects();
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .map(|(_, o)| o)
            .find(|o| str_at(o, "/kind") == kind && str_at(o, "/metadata/name") == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let deployment = find("Deployment", "rangeway");
    assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2, "several replicas");

    let container = deployment.pointer("/spec/template/spec/containers/0").expect("a container");
    let admin_port = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "admin")
        .expect("a port named admin");
    assert_eq!(admin_port["containerPort"], 9090);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert!(
            get["port"] == "admin" || get["port"] == 9090,
            "{probe} must use the admin port, not {}",
            get["port"]
        );
    }
    // The admin listener must be reachable by the kubelet: not loopback inside the pod.
    let admin_listen = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "RANGEWAY__SERVER__ADMIN_LISTEN")
        .expect("RANGEWAY__SERVER__ADMIN_LISTEN set");
    assert_eq!(admin_listen["value"], "0.0.0.0:9090");
    for resource in ["requests", "limits"] {
        for key in ["cpu", "memory"] {
            assert!(
                container["resources"][resource][key].is_string(),
                "resources.{resource}.{key}"
            );
        }
    }

    // The Service, the PodDisruptionBudget and the pod template agree on the labels.
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let matches = |selector: &Value| {
        selector.as_object().expect("a selector").iter().all(|(k, v)| &pod_labels[k] == v)
    };
    assert!(matches(&deployment["spec"]["selector"]["matchLabels"]));
    assert!(matches(&find("Service", "rangeway")["spec"]["selector"]));
    assert!(matches(&find("PodDisruptionBudget", "rangeway")["spec"]["selector"]["matchLabels"]));
    assert_eq!(find("Service", "rangeway")["spec"]["ports"][0]["port"], 8080);

    // The config volume is the ConfigMap, and the Secret the env comes from exists.
    let volumes = deployment["spec"]["template"]["spec"]["volumes"].as_array().expect("volumes");
    let config_map =
        volumes.iter().find_map(|v| v["configMap"]["name"].as_str()).expect("a configMap volume");
    find("ConfigMap", config_map);
    let secret = str_at(container, "/envFrom/0/secretRef/name");
    find("Secret", secret);

    // The Redis the config names is a Service of the folder.
    let config = str_at(find("ConfigMap", config_map), "/data/rangeway.toml");
    assert!(config.contains("redis://rangeway-redis:6379"), "{config}");
    find("Service", "rangeway-redis");
    find("StatefulSet", "rangeway-redis");

    // With Redis, the config must name the download id key, and every replica must get the same
    // one: the variable comes from the Secret, by name, so that a Secret without it stops the pod.
    let id_key_var = id_key_env_of(config).unwrap_or_else(|| {
        panic!("the config uses Redis but names no state.id_key_env:\n{config}")
    });
    let from_secret = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == id_key_var.as_str())
        .unwrap_or_else(|| panic!("the container's env does not set {id_key_var}"));
    assert_eq!(str_at(from_secret, "/valueFrom/secretKeyRef/name"), secret);
    assert_eq!(str_at(from_secret, "/valueFrom/secretKeyRef/key"), id_key_var);
    assert!(
        find("Secret", secret)["stringData"].get(&id_key_var).is_some(),
        "the Secret {secret} has no {id_key_var}"
    );
}

/// The variable a config's `id_key_env = "NAME"` line names.
fn id_key_env_of(config: &str) -> Option<String> {
    config.lines().find_map(|line| {
        let line = line.split('#').next()?.trim();
        let value = line.strip_prefix("id_key_env")?.trim_start().strip_prefix('=')?;
        Some(value.trim().trim_matches('"').to_owned())
    })
}

/// `rangeway check` accepts the ConfigMap's config, with the admin token and download id key the
/// Secret provides, and refuses the example Secret's placeholder key.
#[test]
fn the_configmap_config_passes_rangeway_check() {
    let objects = kubernetes_objects();
    let config_map = objects
        .iter()
        .map(|(_, o)| o)
        .find(|o| str_at(o, "/kind") == "ConfigMap")
        .expect("a ConfigMap");
    let dir = TempDir::new("deploy-check");
    let file = dir.join("rangeway.toml");
    std::fs::write(&file, str_at(config_map, "/data/rangeway.toml")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_rangeway"))
        .args(["check", "--config"])
        .arg(&file)
        .env("RANGEWAY_ADMIN_TOKEN", "example-token")
        .env("RANGEWAY_ID_KEY", "an-example-key-of-more-than-32-characters")
        .output()
        .expect("rangeway check runs");
    assert!(
        output.status.success(),
        "rangeway check refused the ConfigMap's config:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // The admin Service's name is one the admin listener answers in Host. (Read from the text:
    // loading the config needs the Secret's variables in this process's environment.)
    let admin_hosts: Vec<String> = str_at(config_map, "/data/rangeway.toml")
        .lines()
        .find_map(|line| line.trim().strip_prefix("admin_hosts")?.trim().strip_prefix('='))
        .and_then(|array| serde_json::from_str(array.trim()).ok())
        .expect("the ConfigMap's config sets server.admin_hosts");
    let admin_service = objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| str_at(o, "/kind") == "Service")
        .find(|o| o["spec"]["ports"][0]["targetPort"] == "admin")
        .expect("the admin Service");
    let name = str_at(admin_service, "/metadata/name");
    assert!(admin_hosts.iter().any(|host| host == name), "{name} not in {admin_hosts:?}");

    // The example Secret's id key is a placeholder rangeway refuses: a deployment cannot run on a
    // key printed in a public file, from which anyone could compute other clients' download ids.
    let secret =
        objects.iter().map(|(_, o)| o).find(|o| str_at(o, "/kind") == "Secret").expect("a Secret");
    let config = str_at(config_map, "/data/rangeway.toml");
    let id_key_var = id_key_env_of(config).expect("the ConfigMap's config names state.id_key_env");
    let placeholder = str_at(secret, &format!("/stringData/{id_key_var}"));
    let output = Command::new(env!("CARGO_BIN_EXE_rangeway"))
        .args(["check", "--config"])
        .arg(&file)
        .env("RANGEWAY_ADMIN_TOKEN", "example-token")
        .env(&id_key_var, placeholder)
        .output()
        .expect("rangeway check runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "the Secret's example id key was accepted: {said}");
    assert!(said.contains("state.id_key_env"), "{said}");
    assert!(!said.contains(placeholder), "rangeway check printed the key: {said}");
}

/// The `rangeway_*` metric names in `text`.
fn metric_names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("rangeway_") {
        let preceded_by_name_char = rest[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[start..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        if !preceded_by_name_char {
            names.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
    names
}

/// Every PromQL expression of the alert rules and of the board (targets and template variables).
fn queries() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let alerts = deploy_dir().join("prometheus/alerts.yml");
    for document in yaml_documents(&alerts) {
        for group in document["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap_or("?");
                found.push((format!("alerts.yml {name}"), str_at(rule, "/expr").to_owned()));
            }
        }
    }
    let board_path = deploy_dir().join("grafana/rangeway.json");
    let board: Value =
        serde_json::from_str(&std::fs::read_to_string(&board_path).expect("the board is readable"))
            .expect("the board is JSON");
    let mut panels: Vec<&Value> = board["panels"].as_array().expect("panels").iter().collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            found.push((format!("board panel {title:?}"), str_at(target, "/expr").to_owned()));
        }
    }
    for variable in board["templating"]["list"].as_array().expect("templating") {
        if let Some(query) = variable["definition"].as_str() {
            found.push((format!("board variable {}", variable["name"]), query.to_owned()));
        }
    }
    found
}

#[test]
fn every_metric_the_alerts_and_the_board_query_is_exported() {
    let queries = queries();
    let used: BTreeSet<(String, String)> = queries
        .iter()
        .flat_map(|(place, expr)| {
            metric_names_in(expr).into_iter().map(move |n| (n, place.clone()))
        })
        .collect();
    assert!(used.len() >= 10, "suspiciously few metric names found: {used:?}");

    // A live rangeway, with traffic that makes every labelled series exist: a plain download, a
    // range the origin ignores, a range the origin gets wrong (an upstream error), and a resume
    // refused because the object changed.
    let origin = Origin::start();
    origin.put("/plain.bin", vec![1u8; 4096]);
    origin.put("/ignored.bin", vec![2u8; 4096]);
    origin.set_behaviour("/ignored.bin", Behaviour::IgnoreRange);
    origin.put("/wrong.bin", vec![3u8; 4096]);
    origin.set_behaviour("/wrong.bin", Behaviour::WrongRange(100));
    // Bytes that fail the digest their origin publishes (refused before the headers went out).
    let zero_digest = format!("sha-256=:{}:", "A".repeat(43) + "=");
    origin.put_with_headers("/corrupt.bin", vec![6u8; 4096], &[("Repr-Digest", &zero_digest)]);
    origin.put("/changing.bin", vec![4u8; 4096]);
    // A route with middleware too, whose error count is exported from the start, and one through
    // the slice cache.
    let cache = TempDir::new("deploy-cache");
    let proxy = Proxy::start(&format!(
        "[cache]\ndir = \"{}\"\n\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\ncache = false\n\n[[routes]]\npath_prefix = \"/gz/\"\nupstream = \"origin\"\nstrip_prefix = true\ncache = false\n  [[routes.middleware]]\n  kind = \"gzip\"\n\n[[routes]]\npath_prefix = \"/cached/\"\nupstream = \"origin\"\nstrip_prefix = true\n",
        cache.path().display(),
        origin.base_url()
    ));
    let send = |path: &str, headers: &[(&str, &str)]| {
        let mut raw = RawRequest::get(path);
        for (name, value) in headers {
            raw = raw.header(name, value);
        }
        request(proxy.addr(), &raw).expect("request through rangeway").status
    };
    assert_eq!(send("/plain.bin", &[]), 200);
    assert_eq!(send("/cached/plain.bin", &[("Range", "bytes=0-99")]), 206);
    assert_eq!(send("/ignored.bin", &[("Range", "bytes=0-99")]), 206);
    assert_eq!(send("/wrong.bin", &[("Range", "bytes=1000-1099")]), 502);
    assert_eq!(send("/corrupt.bin", &[]), 502);
    let id = ("X-Download-Id", "deploy-test");
    assert_eq!(send("/changing.bin", &[id, ("Range", "bytes=0-99")]), 206);
    // The download is recorded once its response is done: wait for it before changing the object.
    let recorded = get_until(&proxy.admin_url("/v1/downloads/deploy-test"), |r| r.status == 200);
    assert_eq!(recorded.status, 200);
    origin.put("/changing.bin", vec![5u8; 4096]);
    assert_eq!(send("/changing.bin", &[id, ("Range", "bytes=100-")]), 412);

    // Every request above is counted once its logging phase ran.
    let metrics = get_until(&proxy.admin_url("/metrics"), |r| {
        String::from_utf8_lossy(&r.body)
            .contains("rangeway_requests_total{route=\"/\",status=\"412\"} 1")
    });
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8(metrics.body).expect("the exposition is UTF-8");
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|line| match line.strip_prefix("# TYPE ") {
            Some(typed) => typed.split(' ').next(),
            None if !line.starts_with('#') => line.split(['{', ' ']).next(),
            None => None,
        })
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();

    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            !exported.contains(name.as_str()) && !exported.contains(family)
        })
        .map(|(name, place)| format!("{name} (in {place})"))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics queried but not exported by rangeway:\n  {}\n--- /metrics ---\n{text}",
        missing.join("\n  ")
    );

    // And the other way round: the board shows every rangeway metric there is.
    let board = std::fs::read_to_string(deploy_dir().join("grafana/rangeway.json")).unwrap();
    let on_board = metric_names_in(&board);
    let families: BTreeSet<&String> = exported
        .iter()
        .filter(|name| name.starts_with("rangeway_"))
        .filter(|name| !["_bucket", "_sum", "_count"].iter().any(|s| name.ends_with(s)))
        .collect();
    for family in families {
        assert!(
            on_board.iter().any(|used| used.starts_with(family.as_str())),
            "{family} is exported but not on the Grafana board"
        );
    }
}

/// The balancer examples that send each object to one instance (so that each slice is fetched
/// once between them) are configs HAProxy and nginx accept.
#[test]
fn the_balancer_examples_are_valid_configs() {
    let dir = deploy_dir().join("balancer");
    let haproxy = Command::new("haproxy")
        .args(["-c", "-f"])
        .arg(dir.join("haproxy.cfg"))
        .output()
        .expect("run haproxy (scripts/deps.sh --test installs it)");
    assert!(haproxy.status.success(), "{}", String::from_utf8_lossy(&haproxy.stderr));
    let text = std::fs::read_to_string(dir.join("haproxy.cfg")).expect("read");
    assert!(text.contains("hash-type consistent") && text.contains("balance uri"));
    // Every instance is sent the PROXY protocol v2, and its config requires it.
    let servers: Vec<&str> =
        text.lines().map(str::trim).filter(|line| line.starts_with("server ")).collect();
    assert!(!servers.is_empty());
    for server in &servers {
        assert!(server.contains(" send-proxy-v2"), "{server}");
    }
    let instance = Config::load(&dir.join("rangeway.toml"), &StageRegistry::new())
        .unwrap_or_else(|e| panic!("balancer/rangeway.toml:\n{e}"));
    assert!(instance.server.proxy_protocol);
    // The static targets Prometheus scrapes are names the instances' admin listener answers.
    let scrape = yaml_documents(&deploy_dir().join("prometheus").join("scrape.yml"));
    let targets: Vec<&str> = scrape[0]["scrape_configs"]
        .as_array()
        .expect("scrape_configs")
        .iter()
        .flat_map(|job| job["static_configs"].as_array().into_iter().flatten())
        .flat_map(|config| config["targets"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    assert!(!targets.is_empty());
    for target in targets {
        let host = target.rsplit_once(':').map_or(target, |(host, _)| host);
        assert!(instance.server.admin_hosts.iter().any(|name| name == host), "{target}");
    }

    let work = TempDir::new("balancer-nginx");
    let nginx = Command::new("nginx")
        .arg("-p")
        .arg(work.path())
        .arg("-e")
        .arg(work.join("error.log"))
        .args(["-t", "-c"])
        .arg(dir.join("nginx.conf"))
        .output()
        .expect("run nginx");
    assert!(nginx.status.success(), "{}", String::from_utf8_lossy(&nginx.stderr));
    let text = std::fs::read_to_string(dir.join("nginx.conf")).expect("read");
    assert!(text.contains("hash $uri consistent"));
}
