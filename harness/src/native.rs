//! The native fast path (crate `skewgate-module`, `libskewgate_module.so`) in front of the
//! proxy-wasm filter: the bootstrap variant that loads it (`envoy-config/bootstrap-native.yaml` is
//! its rendering). The ECDS resource carrying its routing table is the sidecar's
//! ([`skewgate_envoy::module_ecds`]), re-exported here.
//!
//! The variant is `envoy-config/bootstrap.yaml` with three changes: the module's filter ahead of
//! the proxy-wasm filter (its table from `{{ECDS_DIR}}/module/ecds.json`); the proxy-wasm filter
//! moved into a composite filter that creates it only for requests without the route classes the
//! module sets (`native`, `native-long-running`); and routes for those classes. Requests the module leaves alone
//! (composed discovery and OpenAPI answers) meet the proxy-wasm filter and its routes as before.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use skewgate_core::edits::{CLUSTER_HEADER, NATIVE, NATIVE_LONG_RUNNING, ROUTE_HEADER};

use crate::paths;

use skewgate_envoy::DYNAMIC_MODULE_FILTER_TYPE as DYNAMIC_MODULE_FILTER;
pub use skewgate_envoy::{MODULE_FILTER_NAME, MODULE_NAME, module_ecds, module_ecds_path};

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

const EXTENSION_WITH_MATCHER: &str =
    "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// The proxy-wasm filter behind the module: inside Envoy's composite filter, created for a
/// request only when the module did not route it (no `native*` route class). A skipped filter
/// (ExtensionWithMatcher's SkipFilter, or route-level FilterConfig.disabled, which Envoy reads
/// from the route picked before any filter ran) would still create and destroy a wasm context
/// per request. Its configuration still arrives by ECDS, the shipped file unchanged.
fn composite_wasm_filter(bootstrap: &str) -> Result<Value> {
    let ecds_path = yaml_value(bootstrap, "                  path: ")?;
    // One brace closes the flow mapping; the template's placeholder ends in braces of its own.
    let watched = yaml_value(bootstrap, "                  watched_directory: {path: ")?;
    let ecds_dir = watched.strip_suffix('}').context("watched_directory not a one-line mapping")?;
    Ok(json!({
        "name": "skewgate-composite",
        "typed_config": {
            "@type": EXTENSION_WITH_MATCHER,
            "xds_matcher": {"matcher_list": {"matchers": [{
                "predicate": {"not_matcher": {"single_predicate": {
                    "input": {"name": "route-class", "typed_config": {
                        "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                        "header_name": ROUTE_HEADER
                    }},
                    "value_match": {"prefix": NATIVE}
                }}},
                "on_match": {"action": {"name": "skewgate", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.composite.v3.ExecuteFilterAction",
                    "dynamic_config": {
                        "name": "skewgate",
                        "config_discovery": {
                            "config_source": {"path_config_source": {
                                "path": ecds_path,
                                "watched_directory": {"path": ecds_dir}
                            }},
                            "type_urls": [WASM_TYPE]
                        }
                    }
                }}}
            }]}},
            "extension_config": {"name": "composite", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.composite.v3.Composite"
            }}
        }
    }))
}

/// The value after `key` on the first line, below the skewgate filter, that starts with it.
fn yaml_value(bootstrap: &str, key: &str) -> Result<String> {
    let at =
        bootstrap.find("          - name: skewgate\n").context("bootstrap.yaml has no skewgate filter")?;
    bootstrap[at..]
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .with_context(|| format!("skewgate filter without {key:?}"))
}

/// `bootstrap` (a rendered bootstrap.yaml) with the module ahead of the proxy-wasm filter and
/// the `native` route classes ahead of the shipped routes. Without `wasm`, the module alone (no
/// discovery or OpenAPI composition: for measuring the module by itself).
pub fn with_module(bootstrap: &str, ecds_dir: &Path, wasm: bool) -> Result<String> {
    const WASM_FILTER: &str = "          - name: skewgate\n";
    let at = bootstrap.find(WASM_FILTER).context("bootstrap.yaml has no skewgate filter")?;
    let end =
        at + bootstrap[at..].find("          - name: envoy.filters.http.router").context("no router")?;
    let bootstrap = match wasm {
        true => format!(
            "{}          - {}\n{}",
            &bootstrap[..at],
            composite_wasm_filter(bootstrap)?,
            &bootstrap[end..]
        ),
        false => format!("{}{}", &bootstrap[..at], &bootstrap[end..]),
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

/// The shipped routes' idle timeout, read back from the rendered `default` route.
fn route_timeout(bootstrap: &str) -> Result<String> {
    let default = bootstrap.rfind("- name: default").context("bootstrap.yaml has no default route")?;
    let line = bootstrap[default..]
        .lines()
        .find_map(|l| l.trim().strip_prefix("idle_timeout: "))
        .context("default route without an idle timeout")?;
    Ok(line.trim().to_string())
}

/// The shipped routes (long-running, read with retries, default), for requests the module
/// routed: the same behaviour, and route names that show who routed a request.
fn native_routes(timeout: &str) -> Vec<Value> {
    let class = |c: &str| json!({"name": ROUTE_HEADER, "string_match": {"exact": c}});
    let method = |m: &str| json!({"name": ":method", "string_match": {"exact": m}});
    let host_predicate = json!([{
        "name": "envoy.retry_host_predicates.previous_hosts",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}
    }]);
    let read = json!({
        "cluster_header": CLUSTER_HEADER,
        "timeout": "0s",
        "idle_timeout": timeout,
        "retry_policy": {
            "retry_on": "connect-failure,refused-stream,reset-before-request,reset",
            "num_retries": 2,
            "retry_host_predicate": host_predicate,
            "host_selection_retry_max_attempts": 10
        }
    });
    vec![
        json!({"name": NATIVE_LONG_RUNNING, "match": {"prefix": "/", "headers": [class(NATIVE_LONG_RUNNING)]},
               "route": {"cluster_header": CLUSTER_HEADER, "timeout": "0s", "idle_timeout": "3600s"}}),
        json!({"name": "native-read", "match": {"prefix": "/", "headers": [class(NATIVE), method("GET")]},
               "route": read}),
        json!({"name": "native-read-head", "match": {"prefix": "/", "headers": [class(NATIVE), method("HEAD")]},
               "route": read}),
        json!({"name": NATIVE, "match": {"prefix": "/", "headers": [class(NATIVE)]},
               "route": {"cluster_header": CLUSTER_HEADER, "timeout": "0s", "idle_timeout": timeout}}),
    ]
}
