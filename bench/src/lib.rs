//! Pieces of `make bench`: synthetic tables of any size, the request mix, the upstream responder,
//! native Envoy routes generated from a table, wrk runs and /proc readings, the run's machine and
//! commit; `make scale`'s pieces ([`scale`]) and the plots ([`plot`]).

pub mod plot;
pub mod scale;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use skewgate_core::table::{GroupVersionConfig, TableConfig};

use skewgate_harness::envoy::Envoy;
use skewgate_harness::paths;
use skewgate_pki::Pki;

/// Envoy's `direct_response` limit for the upstream's discovery documents (the merged `/apis` at
/// 10,000 GVRs is a few MB).
const MAX_ANSWER_BYTES: u32 = 64 << 20;

/// Synthetic CRD-like groups hold this many resources each.
const RESOURCES_PER_GROUP: usize = 10;

/// `base` grown to about `total` GVRs with CRD-like groups `crdN.bench.skewgate.io/v1`; one group
/// in four is served by a subset (alternately the last apiserver alone and all but the last), as
/// a CRD version rolled out with the upgrade would be.
pub fn synthetic_table(base: &TableConfig, total: usize) -> TableConfig {
    let mut table = base.clone();
    let ids: Vec<String> = base.apiservers.iter().map(|a| a.id.clone()).collect();
    let (last, rest) = match ids.split_last() {
        Some((last, rest)) => (vec![last.clone()], rest.to_vec()),
        None => (Vec::new(), Vec::new()),
    };
    let existing: usize = base.group_versions.iter().map(|gv| gv.resources.len()).sum();
    let groups = total.saturating_sub(existing).div_ceil(RESOURCES_PER_GROUP);
    for g in 0..groups {
        let served_by = match g % 8 {
            3 => last.clone(),
            7 => rest.clone(),
            _ => ids.clone(),
        };
        let resources =
            (0..RESOURCES_PER_GROUP).map(|r| (format!("widgets{r}"), served_by.clone())).collect();
        table.group_versions.push(GroupVersionConfig {
            group: format!("crd{g}.bench.skewgate.io"),
            version: "v1".into(),
            served_by: served_by.clone(),
            resources,
            extension: false,
        });
    }
    let names = skewgate_core::build::ClusterNames::default();
    table.assign_sets(|m| names.set_cluster(m));
    table.generation = format!("bench-{total}");
    table
}

pub fn gvr_count(table: &TableConfig) -> usize {
    table.group_versions.iter().map(|gv| gv.resources.len()).sum()
}

/// What controllers and kubectl send, cycled by wrk: rerouted and pool GVRs, named objects,
/// lists and watch-shaped queries, and CRD-like GVRs from the start, middle and end of the table
/// (the end is the worst case for routes matched in order).
pub fn request_mix(table: &TableConfig) -> Vec<String> {
    let mut paths: Vec<String> = [
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/claim-1",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?limit=500",
        "/apis/resource.k8s.io/v1/resourceslices?allowWatchBookmarks=true&resourceVersion=12345&watch=true",
        "/apis/resource.k8s.io/v1alpha3/deviceclasses/gpu.example.com",
        "/apis/networking.k8s.io/v1beta1/ipaddresses?limit=500",
        "/api/v1/namespaces/kube-system/pods/coredns-5d78c9869d-abcde",
        "/api/v1/namespaces/default/configmaps?labelSelector=app%3Dweb&limit=500",
        "/apis/apps/v1/namespaces/default/deployments/web",
        "/api/v1/nodes?resourceVersion=1&watch=true",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1",
    ]
    .map(String::from)
    .to_vec();
    let synthetic: Vec<&GroupVersionConfig> =
        table.group_versions.iter().filter(|gv| gv.group.ends_with(".bench.skewgate.io")).collect();
    if !synthetic.is_empty() {
        for gv in [synthetic[0], synthetic[synthetic.len() / 2], synthetic[synthetic.len() - 1]] {
            let resource = gv.resources.keys().last().cloned().unwrap_or_default();
            paths.push(format!("/apis/{}/{}/namespaces/team-a/{resource}/w-1", gv.group, gv.version));
            paths.push(format!("/apis/{}/{}/{resource}?limit=100", gv.group, gv.version));
        }
    }
    paths
}

/// One Envoy route per GVR of `table`, as a user would generate them without skewgate: a regex on
/// the path (cluster-scoped, namespaced, named, subresources) sending it to the same cluster the
/// filter would pick. Ordered as the table lists them.
pub fn native_routes(table: &TableConfig) -> Vec<Value> {
    let cluster = |ids: &[String]| -> String {
        if ids.len() == table.apiservers.len() {
            return table.pool_cluster.clone();
        }
        table
            .sets
            .iter()
            .find(|s| s.members == *ids)
            .map_or_else(|| table.pool_cluster.clone(), |s| s.cluster.clone())
    };
    let mut routes = Vec::new();
    for gv in &table.group_versions {
        let prefix = if gv.group.is_empty() {
            format!("/api/{}", gv.version)
        } else {
            format!("/apis/{}/{}", gv.group, gv.version)
        };
        for (resource, ids) in &gv.resources {
            let regex = format!(
                "^{}/(watch/)?(namespaces/[^/]+/)?{}(/.*)?$",
                regex_escape(&prefix),
                regex_escape(resource)
            );
            routes.push(json!({
                "match": {"safe_regex": {"regex": regex}},
                "route": {"cluster": cluster(ids), "timeout": "0s", "idle_timeout": "3600s"}
            }));
        }
    }
    routes
}

/// `bootstrap` (a rendered bootstrap.yaml) without the skewgate filter, every route to `pool`.
pub fn without_filter(bootstrap: &str, pool: &str) -> Result<String> {
    let routed = without_filter_keeping_routes(bootstrap)?
        .replace("cluster_header: x-skewgate-cluster", &format!("cluster: {pool}"));
    // The pool arrives by CDS after the listener exists.
    const ROUTE_CONFIG: &str = "            name: apiservers\n";
    if !routed.contains(ROUTE_CONFIG) {
        bail!("bootstrap.yaml has no route configuration named apiservers");
    }
    Ok(routed.replacen(ROUTE_CONFIG, &format!("{ROUTE_CONFIG}            validate_clusters: false\n"), 1))
}

/// `bootstrap` (the rendering of bootstrap.yaml) without the skewgate filter and the certificate
/// header filter before it (which only the filter reads), its routes still read from `rds.json`:
/// plain Envoy on the sidecar's files, for its own reload time.
pub fn without_filter_keeping_routes(bootstrap: &str) -> Result<String> {
    let certificate = format!("          - name: {}\n", skewgate_envoy::CERTIFICATE_FILTER_NAME);
    const FILTER: &str = "          - name: skewgate\n";
    const ROUTER: &str = "          - name: envoy.filters.http.router";
    let at = bootstrap
        .find(&certificate)
        .or_else(|| bootstrap.find(FILTER))
        .context("bootstrap.yaml has no skewgate filter")?;
    let end = at + bootstrap[at..].find(ROUTER).context("bootstrap.yaml has no router after the filter")?;
    Ok(format!("{}{}", &bootstrap[..at], &bootstrap[end..]))
}

fn regex_escape(s: &str) -> String {
    s.chars().flat_map(|c| if c == '.' { vec!['\\', '.'] } else { vec![c] }).collect()
}

/// A discovery document an apiserver answers, for one path and `Accept`.
#[derive(Debug, Clone)]
pub struct Answer {
    pub path: String,
    pub accept: String,
    pub content_type: String,
    pub body: String,
}

/// What the apiservers answer to the discovery requests among `requests`: the document skewgate
/// composes for the same request (an apiserver's own is of the same size: it lists nearly the
/// same groups), so that Envoy alone forwards as many bytes as skewgate sends. A small fixed body
/// instead made every discovery request look 3× dearer through skewgate than through Envoy alone.
pub fn discovery_answers(table: &skewgate_core::table::RoutingTable, requests: &[Request]) -> Vec<Answer> {
    use skewgate_core::decision::{Action, RequestHead, composed_reply, decide};
    let merged = table.merged_discovery().map(|m| m.document.clone());
    requests
        .iter()
        .filter_map(|r| {
            let accept = r.headers.iter().find(|(k, _)| k == "accept").map(|(_, v)| v.clone())?;
            let head = RequestHead {
                method: "GET",
                target: &r.path,
                accept: Some(&accept),
                if_none_match: None,
                client_subject: None,
                client_certificate: None,
                certificate_checked: false,
                token: true,
                pretty_agent: false,
            };
            let composed = match decide(table, &head).action {
                Action::Route(route) => {
                    route.compose.and_then(|c| composed_reply(table, c.source, 200)).map(|reply| {
                        (reply.content_type.to_string(), String::from_utf8_lossy(reply.body).into_owned())
                    })
                }
                Action::Refuse(_) => None,
            };
            // `/apis` asked for one apiserver's own view (profile=nopeer): its own aggregated
            // document, as large as the merged one.
            let (content_type, body) = composed.or_else(|| {
                let v2 = accept.split(',').next().unwrap_or_default().to_string();
                (r.path == "/apis").then(|| merged.clone().map(|m| (v2, m))).flatten()
            })?;
            Some(Answer { path: r.path.clone(), accept, content_type, body })
        })
        .collect()
}

/// A second Envoy standing in for the apiservers: one mTLS listener per apiserver id answering
/// every request at once with `x-skewgate-served-by` and a small JSON body, or the discovery
/// document of `answers`, so the Envoy under test is what the benchmark measures.
pub fn upstream_bootstrap(
    pki: &Pki,
    listeners: &[(String, u16)],
    admin_port: u16,
    answers: &[Answer],
) -> Value {
    let p = |path: &Path| path.display().to_string();
    let mut routes: Vec<Value> = answers
        .iter()
        .map(|a| {
            json!({
                "match": {"path": a.path, "headers": [{"name": "accept", "string_match": {"exact": a.accept}}]},
                "direct_response": {"status": 200, "body": {"inline_string": a.body}},
                "response_headers_to_add": [{"header": {"key": "content-type", "value": a.content_type}}]
            })
        })
        .collect();
    routes.push(json!({
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"x\"}}"}}
    }));
    let listeners: Vec<Value> = listeners
        .iter()
        .map(|(id, port)| {
            json!({
                "name": id,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{
                    "transport_socket": {
                        "name": "envoy.transport_sockets.tls",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                            "require_client_certificate": true,
                            "common_tls_context": {
                                "tls_certificates": [{
                                    "certificate_chain": {"filename": p(&pki.apiserver.cert)},
                                    "private_key": {"filename": p(&pki.apiserver.key)}
                                }],
                                "validation_context": {"trusted_ca": {"filename": p(&pki.requestheader_ca.cert_path)}}
                            }
                        }
                    },
                    "filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": id,
                            "route_config": {
                                "max_direct_response_body_size_bytes": MAX_ANSWER_BYTES,
                                "virtual_hosts": [{
                                    "name": "all", "domains": ["*"],
                                    "response_headers_to_add": [{"header": {"key": "x-skewgate-served-by", "value": id}}],
                                    "routes": routes.clone()
                                }]
                            },
                            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                        }
                    }]
                }]
            })
        })
        .collect();
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": listeners}
    })
}

/// What one wrk run saw.
#[derive(Debug, Clone, Serialize)]
pub struct WrkRun {
    pub requests: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Non-2xx responses plus socket errors.
    pub errors: u64,
}

/// Writes the wrk Lua script that cycles through `paths`.
pub fn write_wrk_script(path: &Path, paths: &[String]) -> Result<()> {
    let list: Vec<String> = paths.iter().map(|p| format!("  {:?}", p)).collect();
    let script = format!(
        "local paths = {{\n{}\n}}\nlocal i = 0\nrequest = function()\n  i = i % #paths + 1\n  return wrk.format(\"GET\", paths[i])\nend\n",
        list.join(",\n")
    );
    std::fs::write(path, script)?;
    Ok(())
}

pub fn wrk(url: &str, script: &Path, threads: u32, connections: u32, seconds: u64) -> Result<WrkRun> {
    let out = Command::new("wrk")
        .args([
            &format!("-t{threads}"),
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--latency",
            "-s",
        ])
        .arg(script)
        .arg(url)
        .output()
        .context("running wrk (apt-get install wrk)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    parse_wrk(&text)
}

fn parse_wrk(text: &str) -> Result<WrkRun> {
    let summary = text.lines().find(|l| l.contains(" requests in ")).context("wrk: no summary")?;
    let mut words = summary.split_whitespace();
    let requests: u64 = words.next().context("wrk: no count")?.parse()?;
    let seconds =
        words.nth(2).map(|d| parse_duration_ms(d.trim_end_matches(',')) / 1000.0).unwrap_or(f64::NAN);
    let errors = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            if let Some(n) = l.strip_prefix("Non-2xx or 3xx responses:") {
                return n.trim().parse::<u64>().ok();
            }
            l.strip_prefix("Socket errors:").map(|rest| {
                rest.split(',').filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok()).sum()
            })
        })
        .sum();
    let percentile = |p: &str| -> f64 {
        text.lines()
            .find(|l| l.trim_start().starts_with(p))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(parse_duration_ms)
            .unwrap_or(f64::NAN)
    };
    Ok(WrkRun {
        requests,
        seconds,
        requests_per_second: requests as f64 / seconds,
        p50_ms: percentile("50%"),
        p99_ms: percentile("99%"),
        errors,
    })
}

/// wrk's durations: `812.00us`, `1.23ms`, `10.00s`, `2.00m`.
fn parse_duration_ms(s: &str) -> f64 {
    let units = [("us", 0.001), ("ms", 1.0), ("s", 1000.0), ("m", 60_000.0)];
    for (suffix, scale) in units {
        if let Some(v) = s.strip_suffix(suffix) {
            if let Ok(n) = v.parse::<f64>() {
                return n * scale;
            }
        }
    }
    f64::NAN
}

/// CPU time of the threads of `pid` (all of them, or those named `name`) in µs, from the
/// scheduler's own count (`/proc/<pid>/task/<tid>/schedstat`, ns): `/proc/<pid>/stat` counts in
/// clock ticks (10 ms), too coarse for a few seconds of a process that is mostly waiting.
pub fn threads_cpu_micros(pid: u32, name: Option<&str>) -> Result<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let task = task?.path();
        if let Some(name) = name {
            if std::fs::read_to_string(task.join("comm")).unwrap_or_default().trim() != name {
                continue;
            }
        }
        // A thread that ended since the directory was read has no file any more.
        let Ok(schedstat) = std::fs::read_to_string(task.join("schedstat")) else { continue };
        ns += schedstat.split_whitespace().next().context("schedstat")?.parse::<u64>()?;
    }
    Ok(ns as f64 / 1000.0)
}

/// User + system CPU time of a process (all threads), in microseconds.
pub fn cpu_micros(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("/proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields.get(11).context("utime")?.parse::<u64>()? + fields.get(12).context("stime")?.parse::<u64>()?;
    Ok(ticks as f64 * 1_000_000.0 / clock_ticks()?)
}

fn clock_ticks() -> Result<f64> {
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// Resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

/// Puts every thread of `pid` on these CPUs.
pub fn pin(pid: u32, cpus: &str) -> Result<()> {
    let ok = Command::new("taskset").args(["-a", "-cp", cpus, &pid.to_string()]).output()?.status.success();
    if !ok {
        bail!("taskset -a -cp {cpus} {pid} failed");
    }
    Ok(())
}

/// A client for Envoy's listener that trusts any certificate (the benchmarks' own PKI).
pub fn client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(5))
        .build()?)
}

/// Until every path of `mix` answers 200 through `envoy` (its health checks have found the
/// apiservers), at most 30 s.
pub async fn wait_routable(envoy: &Envoy, mix: &[String]) -> Result<()> {
    let client = client()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    for path in mix {
        let url = format!("https://127.0.0.1:{}{path}", envoy.settings.listen_port);
        loop {
            let status = client.get(&url).send().await.map(|r| r.status().as_u16());
            if matches!(status, Ok(200)) {
                break;
            }
            if Instant::now() > deadline {
                bail!("{path} not routable: {status:?}\n{}", envoy.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// The machine a run measured on: CPUs, date, kernel.
pub fn machine() -> Result<Value> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string());
    let date = Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC").output()?;
    Ok(json!({
        "cpu": format!("{} × {}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), cpu.unwrap_or_default()),
        "date": String::from_utf8_lossy(&date.stdout).trim(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    }))
}

pub fn envoy_version() -> Result<String> {
    let out = Command::new(paths::envoy_binary()?).arg("--version").output()?;
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().last().unwrap_or("").to_string())
}

/// The commit the run measured, short.
pub fn commit() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(paths::workspace_root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_output() {
        let text = "Running 5s test @ https://127.0.0.1:1/\n  1 threads and 16 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency     1.10ms  300.00us   9.00ms   90.00%\n  Latency Distribution\n     50%    1.02ms\n     75%    1.20ms\n     90%    1.40ms\n     99%  812.00us\n  71234 requests in 5.00s, 10.00MB read\n  Non-2xx or 3xx responses: 3\n  Socket errors: connect 0, read 2, write 0, timeout 1\nRequests/sec:  14246.80\n";
        let run = parse_wrk(text).unwrap();
        assert_eq!(run.requests, 71234);
        assert_eq!(run.seconds, 5.0);
        assert_eq!(run.p50_ms, 1.02);
        assert!((run.p99_ms - 0.812).abs() < 1e-9);
        assert_eq!(run.errors, 6);
    }

    #[test]
    fn synthetic_tables_reach_their_size_and_compile() {
        let base: TableConfig =
            serde_json::from_str(include_str!("../../envoy-config/examples/table.json")).unwrap();
        for total in [1_000, 10_000] {
            let t = synthetic_table(&base, total);
            let n = gvr_count(&t);
            assert!(n >= total && n < total + RESOURCES_PER_GROUP, "{total}: {n}");
            skewgate_core::table::RoutingTable::compile(t.clone()).unwrap();
            assert_eq!(native_routes(&t).len(), n);
            assert!(request_mix(&t).len() > 10);
        }
    }
}

/// One request of a wrk script: path and query, and extra headers.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub headers: Vec<(String, String)>,
}

const TOKEN: (&str, &str) = ("authorization", "Bearer bench-token");
const V2_ACCEPT: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";

/// A client-side Envoy that lets wrk, which cannot present a client certificate, play certificate
/// clients (kubelets, controllers): each listener (plain HTTP, loopback) forwards over one HTTP/2
/// mTLS connection, with `client`'s certificate, to the Envoy under test at the paired port.
pub fn certificate_client_bootstrap(
    pki: &Pki,
    client: &skewgate_pki::Pair,
    targets: &[(u16, u16)],
    admin_port: u16,
) -> Value {
    let p = |path: &Path| path.display().to_string();
    let mut listeners = Vec::new();
    let mut clusters = Vec::new();
    for (i, (listen, target)) in targets.iter().enumerate() {
        let cluster = format!("target-{i}");
        listeners.push(json!({
            "name": format!("client-{i}"),
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": format!("client_{i}"),
                    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}
                    ]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                }
            }]}]
        }));
        clusters.push(json!({
            "name": cluster,
            "type": "STATIC",
            "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": target}}}}]}]},
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {"max_concurrent_streams": 1000}}
            }},
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                    "sni": "localhost",
                    "common_tls_context": {
                        "alpn_protocols": ["h2"],
                        "tls_certificates": [{"certificate_chain": {"filename": p(&client.cert)}, "private_key": {"filename": p(&client.key)}}],
                        "validation_context": {"trusted_ca": {"filename": p(&pki.cluster_ca.cert_path)}}
                    }
                }
            }
        }));
    }
    json!({
        "node": {"id": "bench-client", "cluster": "bench"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters}
    })
}

/// Request classes of a control plane's traffic, each a wrk script of its own so that Envoy's CPU
/// per request is known per class, all with a bearer token but `uniform-cert`:
/// - `uniform`: resources every apiserver serves (pods, nodes, leases, configmaps, events), gets,
///   lists and one watch;
/// - `rerouted`: GVRs a subset serves;
/// - `discovery`: merged /apis, its nopeer profile, legacy group and group/version documents;
/// - `realistic`: 40 uniform : 5 rerouted : 1 discovery (merged /apis);
/// - `uniform-cert`: `uniform` from a certificate client (no token), through
///   [`certificate_client_bootstrap`].
pub fn class_mixes(table: &TableConfig) -> Vec<(&'static str, Vec<Request>)> {
    let token = |path: &str| Request { path: path.into(), headers: vec![(TOKEN.0.into(), TOKEN.1.into())] };
    let with = |path: &str, extra: (&str, &str)| Request {
        path: path.into(),
        headers: vec![(TOKEN.0.into(), TOKEN.1.into()), (extra.0.into(), extra.1.into())],
    };
    let uniform: Vec<Request> = [
        "/api/v1/namespaces/kube-system/pods/coredns-5d78c9869d-abcde",
        "/api/v1/nodes/node-1",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1",
        "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
        "/api/v1/namespaces/default/pods?limit=500",
        "/api/v1/namespaces/default/events?limit=500",
        "/apis/apps/v1/namespaces/default/deployments/web",
        "/api/v1/pods?allowWatchBookmarks=true&resourceVersion=1&watch=true",
    ]
    .iter()
    .map(|p| token(p))
    .collect();
    let mut rerouted: Vec<Request> = [
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/claim-1",
        "/apis/resource.k8s.io/v1/resourceslices?limit=500",
    ]
    .iter()
    .map(|p| token(p))
    .collect();
    let synthetic_subset = table
        .group_versions
        .iter()
        .find(|gv| gv.group.ends_with(".bench.skewgate.io") && gv.served_by.len() < table.apiservers.len());
    if let Some(gv) = synthetic_subset {
        let resource = gv.resources.keys().next().cloned().unwrap_or_default();
        rerouted.push(token(&format!("/apis/{}/{}/namespaces/team-a/{resource}/w-1", gv.group, gv.version)));
    }
    let discovery = vec![
        with("/apis", ("accept", V2_ACCEPT)),
        with(
            "/apis",
            ("accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer"),
        ),
        with("/apis/resource.k8s.io", ("accept", "application/json")),
        with("/apis/resource.k8s.io/v1", ("accept", "application/json")),
        with("/api", ("accept", "application/json")),
    ];
    // Clients cache discovery (kubectl for minutes, controllers for their lifetime): it is a
    // small share of the requests, though an expensive one.
    let mut realistic = Vec::new();
    for i in 0..5 {
        realistic.extend(uniform.iter().cloned());
        realistic.push(rerouted[i % rerouted.len()].clone());
    }
    realistic.push(discovery[0].clone());
    // The same uniform requests from a certificate client (a kubelet's identity), without a token.
    let uniform_cert =
        uniform.iter().map(|r| Request { path: r.path.clone(), headers: Vec::new() }).collect();
    // 40 uniform : 5 rerouted : 1 discovery.
    vec![
        ("uniform", uniform),
        ("uniform-cert", uniform_cert),
        ("rerouted", rerouted),
        ("discovery", discovery),
        ("realistic", realistic),
    ]
}

/// Writes a wrk Lua script cycling through `requests`, with their headers.
pub fn write_wrk_requests(path: &Path, requests: &[Request]) -> Result<()> {
    let list: Vec<String> = requests
        .iter()
        .map(|r| {
            let headers: Vec<String> = r.headers.iter().map(|(k, v)| format!("[{k:?}] = {v:?}")).collect();
            format!("  {{ {:?}, {{ {} }} }}", r.path, headers.join(", "))
        })
        .collect();
    let script = format!(
        "local requests = {{\n{}\n}}\nlocal i = 0\nrequest = function()\n  i = i % #requests + 1\n  return wrk.format(\"GET\", requests[i][1], requests[i][2])\nend\n",
        list.join(",\n")
    );
    std::fs::write(path, script)?;
    Ok(())
}

/// How many of `requests` each way around the proxy-wasm filter takes off it: the bypass routes
/// (reads and watches, the pool's and the serving sets'; a certificate client's after the first
/// request of its connection) and the dynamic module.
pub fn coverage(table: &skewgate_core::table::RoutingTable, requests: &[Request]) -> (usize, usize) {
    use skewgate_core::decision::{RequestHead, decide};
    let plan = skewgate_core::bypass::plan(table);
    let bypass = |path: &str| {
        let health = plan.is_some() && regex_lite_match(skewgate_core::bypass::HEALTH, path);
        health
            || plan.iter().flat_map(|p| &p.targets).any(|t| {
                t.path_regexes.iter().chain(&t.watch_regexes).any(|r| regex_lite_match(r, path))
                    && !t.except.iter().any(|r| regex_lite_match(r, path))
            })
    };
    let mut by_route = 0;
    let mut by_module = 0;
    for r in requests {
        let accept = r.headers.iter().find(|(k, _)| k == "accept").map(|(_, v)| v.as_str());
        let head = RequestHead {
            method: "GET",
            target: &r.path,
            accept,
            if_none_match: None,
            client_subject: None,
            client_certificate: None,
            certificate_checked: false,
            token: true,
            pretty_agent: false,
        };
        by_module += usize::from(skewgate_core::native::module_handles(table, &decide(table, &head)));
        by_route += usize::from(bypass(&r.path));
    }
    (by_route, by_module)
}

fn regex_lite_match(regex: &str, haystack: &str) -> bool {
    regex_automata::meta::Regex::new(regex).is_ok_and(|re| re.is_match(haystack))
}

/// The command an Envoy runs under to have its instructions counted: callgrind, counting nothing
/// until [`callgrind_control`] turns it on, its dumps under `dir`.
pub fn callgrind_wrapper(dir: &Path) -> Vec<String> {
    vec![
        "valgrind".into(),
        "--tool=callgrind".into(),
        "--instr-atstart=no".into(),
        // .venv/bin/envoy is a Python script that execs the binary.
        "--trace-children=yes".into(),
        format!("--callgrind-out-file={}", dir.join("callgrind.out").display()),
    ]
}

/// `callgrind_control <option> <pid>`: `-z` zeroes the counts, `-i on`/`-i off` starts and stops
/// counting, `-d` dumps them to a file of their own.
pub fn callgrind_control(pid: u32, option: &[&str]) -> Result<()> {
    let out = Command::new("callgrind_control")
        .args(option)
        .arg(pid.to_string())
        .output()
        .context("running callgrind_control (apt-get install valgrind)")?;
    if !out.status.success() {
        bail!("callgrind_control {option:?} {pid}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Dumps the counts of the callgrind whose dumps go under `dir` and returns the instructions
/// counted since they were last zeroed. Valgrind writes the dump when the program next runs,
/// after `callgrind_control` returns: this waits for the file (`callgrind.out.<n>`, the next `n`).
pub fn callgrind_dump(pid: u32, dir: &Path) -> Result<u64> {
    let dumps = || -> Result<Vec<(u32, std::path::PathBuf)>> {
        Ok(std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                Some((e.file_name().to_str()?.strip_prefix("callgrind.out.")?.parse().ok()?, e.path()))
            })
            .collect())
    };
    let before = dumps()?.into_iter().map(|(n, _)| n).max().unwrap_or(0);
    callgrind_control(pid, &["-d"])?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let newest = dumps()?.into_iter().filter(|(n, _)| *n > before).max();
        let text = newest.map(|(_, path)| std::fs::read_to_string(path)).transpose()?.unwrap_or_default();
        // The totals line comes last: a file that has it is whole.
        if let Some(totals) = text.lines().find_map(|l| l.strip_prefix("totals:")) {
            return Ok(totals.split_whitespace().next().context("empty totals")?.parse()?);
        }
        if std::time::Instant::now() > deadline {
            bail!("callgrind wrote no dump under {} within 30 s", dir.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
