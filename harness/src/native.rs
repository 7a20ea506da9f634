//! The native fast path (crate `skewgate-module`, `libskewgate_module.so`) in front of the
//! proxy-wasm filter: the bootstrap variant that loads it and the ECDS resource carrying its
//! routing table.
//!
//! The variant is `envoy-config/bootstrap.yaml` with three changes: the module's filter ahead of
//! the proxy-wasm filter (its table from `{{ECDS_DIR}}/module/ecds.json`); the proxy-wasm filter
//! wrapped in a matcher that skips it for the route classes the module sets (`native`,
//! `native-long-running`); and routes for those classes. Requests the module leaves alone
//! (composed discovery and OpenAPI answers) meet the proxy-wasm filter and its routes as before.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::paths;

pub const MODULE_FILTER_NAME: &str = "skewgate-module";
/// The shared object's name without `lib` and `.so`, as Envoy looks it up in
/// `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`.
pub const MODULE_NAME: &str = "skewgate_module";
const DYNAMIC_MODULE_FILTER: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";

/// The directory holding `libskewgate_module.so` (release build), or `$SKEWGATE_MODULE_DIR`.
pub fn module_dir() -> Result<PathBuf> {
    let dir = std::env::var_os("SKEWGATE_MODULE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| paths::workspace_root().join("target/release"));
    let so = dir.join(format!("lib{MODULE_NAME}.so"));
    if !so.exists() {
        bail!("dynamic module not built at {}: run `make module` first", so.display());
    }
    dir.canonicalize().with_context(|| format!("resolving {}", dir.display()))
}

/// The module's ECDS file for `table_json`.
pub fn module_ecds(table_json: &str) -> Value {
    json!({"resources": [{
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": MODULE_FILTER_NAME,
        "typed_config": {
            "@type": DYNAMIC_MODULE_FILTER,
            "dynamic_module_config": {"name": MODULE_NAME},
            "filter_name": "skewgate",
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": table_json}
        }
    }]})
}

pub fn module_ecds_path(ecds_dir: &Path) -> PathBuf {
    ecds_dir.join("module/ecds.json")
}

const EXTENSION_WITH_MATCHER: &str =
    "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// The proxy-wasm filter's ECDS file (`skewgate::envoy::ecds`) for a chain with the module in
/// front: each filter wrapped in a matcher that skips it when the module routed the request.
/// Route-level `FilterConfig.disabled` cannot do this: Envoy reads it from the route picked before
/// any filter ran, not from the one the module's headers select.
pub fn wrap_wasm_ecds(ecds: &Value) -> Value {
    let mut ecds = ecds.clone();
    let resources = ecds.get_mut("resources").and_then(Value::as_array_mut);
    for resource in resources.into_iter().flatten() {
        let name = resource["name"].clone();
        let inner = resource["typed_config"].take();
        resource["typed_config"] = json!({
            "@type": EXTENSION_WITH_MATCHER,
            "xds_matcher": {"matcher_list": {"matchers": [{
                "predicate": {"single_predicate": {
                    "input": {"name": "route-class", "typed_config": {
                        "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                        "header_name": "x-skewgate-route"
                    }},
                    "value_match": {"prefix": "native"}
                }},
                "on_match": {"action": {"name": "skip", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter"
                }}}
            }]}},
            "extension_config": {"name": name, "typed_config": inner}
        });
    }
    ecds
}

/// `bootstrap` (a rendered bootstrap.yaml) with the module ahead of the proxy-wasm filter and
/// the `native` route classes ahead of the shipped routes. Without `wasm`, the module alone (no
/// discovery or OpenAPI composition: for measuring the module by itself).
pub fn with_module(bootstrap: &str, ecds_dir: &Path, wasm: bool) -> Result<String> {
    const WASM_FILTER: &str = "          - name: skewgate\n";
    let at = bootstrap.find(WASM_FILTER).context("bootstrap.yaml has no skewgate filter")?;
    let bootstrap = match wasm {
        true => bootstrap.replacen(
            &format!("type_urls: [{WASM_TYPE}]"),
            &format!("type_urls: [{EXTENSION_WITH_MATCHER}]"),
            1,
        ),
        false => {
            let end = at
                + bootstrap[at..].find("          - name: envoy.filters.http.router").context("no router")?;
            format!("{}{}", &bootstrap[..at], &bootstrap[end..])
        }
    };
    let bootstrap = bootstrap.as_str();
    let module_dir = module_ecds_path(ecds_dir).parent().map(Path::to_path_buf).unwrap_or_default();
    let filter = json!({
        "name": MODULE_FILTER_NAME,
        "config_discovery": {
            "config_source": {"path_config_source": {
                "path": module_ecds_path(ecds_dir).display().to_string(),
                "watched_directory": {"path": module_dir.display().to_string()}
            }},
            "type_urls": [DYNAMIC_MODULE_FILTER]
        }
    });
    let with_filter = format!("{}          - {filter}\n{}", &bootstrap[..at], &bootstrap[at..]);

    const ROUTES: &str = "              routes:\n";
    let at = with_filter.find(ROUTES).context("bootstrap.yaml has no routes list")? + ROUTES.len();
    let timeout = route_timeout(bootstrap)?;
    let lines: String = native_routes(&timeout).iter().map(|r| format!("              - {r}\n")).collect();
    Ok(format!("{}{lines}{}", &with_filter[..at], &with_filter[at..]))
}

/// The shipped routes' timeout, read back from the rendered `default` route.
fn route_timeout(bootstrap: &str) -> Result<String> {
    let default = bootstrap.rfind("- name: default").context("bootstrap.yaml has no default route")?;
    let line = bootstrap[default..]
        .lines()
        .find_map(|l| l.trim().strip_prefix("timeout: "))
        .context("default route without a timeout")?;
    Ok(line.trim().to_string())
}

/// The shipped routes (long-running, read with retries, default), for requests the module
/// routed: the same behaviour, and route names that show who routed a request.
fn native_routes(timeout: &str) -> Vec<Value> {
    let class = |c: &str| json!({"name": "x-skewgate-route", "string_match": {"exact": c}});
    let method = |m: &str| json!({"name": ":method", "string_match": {"exact": m}});
    let host_predicate = json!([{
        "name": "envoy.retry_host_predicates.previous_hosts",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}
    }]);
    let read = json!({
        "cluster_header": "x-skewgate-cluster",
        "timeout": timeout,
        "retry_policy": {
            "retry_on": "connect-failure,refused-stream,reset-before-request,reset",
            "num_retries": 2,
            "retry_host_predicate": host_predicate,
            "host_selection_retry_max_attempts": 3
        }
    });
    vec![
        json!({"name": "native-long-running", "match": {"prefix": "/", "headers": [class("native-long-running")]},
               "route": {"cluster_header": "x-skewgate-cluster", "timeout": "0s", "idle_timeout": "3600s"}}),
        json!({"name": "native-read", "match": {"prefix": "/", "headers": [class("native"), method("GET")]},
               "route": read}),
        json!({"name": "native-read-head", "match": {"prefix": "/", "headers": [class("native"), method("HEAD")]},
               "route": read}),
        json!({"name": "native", "match": {"prefix": "/", "headers": [class("native")]},
               "route": {"cluster_header": "x-skewgate-cluster", "timeout": timeout}}),
    ]
}
