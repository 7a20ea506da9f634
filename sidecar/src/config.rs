//! `skewgate sync`'s configuration: a JSON or TOML file (same keys), flags on top, validated
//! into [`SyncConfig`] with every problem reported by the name of its field.
//!
//! The file is read into a JSON value and walked by hand rather than through serde derive, so
//! that a wrong type, an unknown key (a typo) and an invalid value all say which field.
//! [`EXAMPLE_TOML`] shows every key; JSON uses the same names.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};
use skewgate_core::policy::HoldPolicy;
use skewgate_core::table::{MAX_GROUP_VERSIONS, MAX_GVRS};

use skewgate_core::duration;
use skewgate_envoy::{Endpoint, Files, Health};

pub const DEFAULT_SERVER_NAME: &str = "kubernetes.default.svc";
/// The identity kube-apiserver itself asserts when it fetches a peer's discovery (docs/upstream-facts.md, "Peer discovery fetch").
pub const DEFAULT_USER: &str = "system:apiserver";
pub const DEFAULT_GROUP: &str = "system:authenticated";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9090";
pub use skewgate_envoy::DEFAULT_ROUTE_TIMEOUT;

/// Every key, with its default where it has one. Relative paths are relative to the file.
pub const EXAMPLE_TOML: &str = r#"# skewgate sync configuration
pollPeriod = "5s"                      # how often every apiserver's discovery is fetched in full
probePeriod = "250ms"                  # how often each one's /readyz and discovery ETags are checked
serverName = "kubernetes.default.svc"  # SNI and the DNS name required in serving certificates
listen = "127.0.0.1:9090"              # /healthz, /readyz, /metrics

[tls]
peerCa = "pki/peer-ca.crt"             # verifies the apiservers' serving certificates
clientCert = "pki/front-proxy.crt"     # front-proxy client certificate (requestheader CA)
clientKey = "pki/front-proxy.key"

[identity]                             # sent as X-Remote-User / X-Remote-Group
user = "system:apiserver"
groups = ["system:authenticated"]

[envoy]
dir = "envoy"                          # writes envoy/cds/{cds,rds}.json and envoy/ecds/ecds.json
wasm = "skewgate_filter.wasm"          # the filter ecds.json names
routeTimeout = "65s"                   # requests that are not long-running are given up on when
                                       # no byte moves either way for this long: a little longer
                                       # than kube-apiserver's --request-timeout (60s), so that
                                       # the apiserver's answer wins when it has one
adminUrl = "http://127.0.0.1:9901"     # optional: confirm each step of a table change
confirmTimeout = "10s"
settleDelay = "2s"                     # the wait per step without adminUrl
nativeModule = false                   # also write envoy/ecds/module/ecds.json (docs/native-module.md)

[limits]                               # per apiserver: a fetch over one fails (kind "limit")
requestTimeout = "5s"                  # per request, connect to last byte
maxBodyBytes = 16777216                # per discovery document (16 MiB)
maxGroups = 5000                       # API groups in /api + /apis
maxGroupVersions = 10000
maxResources = 50000                   # top-level resources over all group/versions
# The routing table has fixed bounds the filter enforces (core/src/table.rs): 16 MiB,
# 10,000 group/versions, 50,000 GVRs, 256 set clusters.

[health]                               # Envoy's active health checks of the apiservers
interval = "2s"
timeout = "1s"                         # also bounds each of the sidecar's own probes
connectTimeout = "1s"

[hold]                                 # requests whose apiservers are all away wait in Envoy
maxWait = "10s"                        # then get 503 with Retry-After; "0s": at once. Shorter
                                       # than envoy.routeTimeout. A restart of kube-apiserver is
                                       # refused 1-2 s and ready 2-4 s after it starts
maxHeld = 1024                         # waiting at once, per Envoy worker; past it: 503 at once

[cluster]                              # optional: the apiservers are those the cluster publishes
members = "static"                     # "static": `apiservers` below; "endpointSlice": the
                                       # default/kubernetes EndpointSlice; "leases": the identity
                                       # Leases in kube-system (`apiservers` is then the bootstrap)
bootstrap = "pool"                     # whom to ask: "pool" (the current members, then
                                       # `apiservers`) or "apiservers" (only those)
port = 6443                            # leases: the port to dial each lease's host on
leaveAfter = "1m"                      # how long an apiserver no longer published stays (DRAINING)
extensions = false                     # list CRDs and APIServices: their group/versions go to the pool

[[apiservers]]
id = "a"                               # a DNS label: it becomes part of cluster names
address = "10.0.0.11"                  # IP address or host name to dial
port = 6443

[[apiservers]]
id = "b"
address = "apiserver-b.internal"
port = 6443
"#;

/// Everything `skewgate sync` needs, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncConfig {
    /// In table order: the first is "local" for the peer merge (docs/upstream-facts.md, "Peer-aggregated discovery" orders by id anyway).
    pub apiservers: Vec<Endpoint>,
    /// SNI and the DNS name required in every serving certificate, whatever address is dialled.
    pub server_name: String,
    pub tls: TlsFiles,
    pub identity: Identity,
    pub envoy: EnvoyOutput,
    pub poll_period: Duration,
    /// How often each apiserver is probed (`/readyz`, and `/api` + `/apis` with `If-None-Match`):
    /// the bound on how long a change goes unseen and on how long a returning apiserver waits.
    pub probe_period: Duration,
    pub limits: Limits,
    pub health: Health,
    /// The sidecar's own `/healthz`, `/readyz`, `/metrics`.
    pub listen: SocketAddr,
    /// Keys that are accepted but do nothing any more, with what to do instead; logged at start.
    pub deprecations: Vec<FieldError>,
    /// Where the apiservers come from, and whether extensions are listed ([`crate::peers`]).
    pub cluster: crate::cluster::ClusterConfig,
    /// How long, and how many, requests wait in Envoy while every apiserver that serves them is
    /// away (the table's policy, which the filter carries out).
    pub hold: HoldPolicy,
}

/// Why `gracePeriod` is ignored.
pub const GRACE_PERIOD_DEPRECATED: &str = "no longer used (remove it): an apiserver that stops \
    answering keeps its last good discovery in the table, its GVRs answering 503 rather than 404, \
    until it answers discovery without them or leaves `apiservers`";

/// Absolute paths: Envoy reads the same files, from its own working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Verifies the apiservers' serving certificates.
    pub peer_ca: PathBuf,
    /// The front-proxy client certificate and key (requestheader CA).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Who the sidecar says it is, in `X-Remote-User` / `X-Remote-Group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyOutput {
    /// Holds `cds/cds.json`, `cds/rds.json` and `ecds/ecds.json`.
    pub dir: PathBuf,
    /// The filter that `ecds.json` names.
    pub wasm: PathBuf,
    /// Every route's idle timeout but the long-running one's (`rds.json`).
    pub route_timeout: Duration,
    /// Envoy's admin API, to confirm each step of a table change; without it the sidecar waits
    /// `settle_delay` instead.
    pub admin_url: Option<String>,
    pub confirm_timeout: Duration,
    pub settle_delay: Duration,
    /// Also write the native module's `ecds/module/ecds.json` with each table, for a bootstrap
    /// that loads the module (`envoy-config/bootstrap-native.yaml`, docs/native-module.md).
    pub native_module: bool,
}

impl EnvoyOutput {
    pub fn files(&self) -> Files {
        Files::new(&self.dir)
    }
}

impl SyncConfig {
    /// The configuration as `skewgate sync` runs it (`skewgate sync --check` prints it):
    /// `config` in the file's own keys, every default filled in and every path absolute (a file
    /// of its own that loads to this same configuration); `writes`, the files it writes for
    /// Envoy; `reads`, the API paths it GETs from the cluster (what its RBAC must allow);
    /// `deprecated`, the keys it ignores.
    pub fn effective(&self) -> serde_json::Value {
        use serde_json::json;
        let d = |duration: Duration| duration::format(duration);
        let ms = |ms: u64| duration::format(Duration::from_millis(ms));
        let files = self.envoy.files();
        let mut envoy = json!({
            "dir": self.envoy.dir,
            "wasm": self.envoy.wasm,
            "routeTimeout": d(self.envoy.route_timeout),
            "confirmTimeout": d(self.envoy.confirm_timeout),
            "settleDelay": d(self.envoy.settle_delay),
            "nativeModule": self.envoy.native_module,
        });
        if let Some(url) = &self.envoy.admin_url {
            envoy["adminUrl"] = json!(url);
        }
        let config = json!({
            "pollPeriod": d(self.poll_period),
            "probePeriod": d(self.probe_period),
            "serverName": self.server_name,
            "listen": self.listen.to_string(),
            "tls": {
                "peerCa": self.tls.peer_ca,
                "clientCert": self.tls.client_cert,
                "clientKey": self.tls.client_key,
            },
            "identity": {"user": self.identity.user, "groups": self.identity.groups},
            "envoy": envoy,
            "limits": {
                "requestTimeout": d(self.limits.request_timeout),
                "maxBodyBytes": self.limits.max_body_bytes,
                "maxGroups": self.limits.max_groups,
                "maxGroupVersions": self.limits.max_group_versions,
                "maxResources": self.limits.max_resources,
            },
            "health": {
                "interval": ms(self.health.interval_ms),
                "timeout": ms(self.health.timeout_ms),
                "connectTimeout": ms(self.health.connect_timeout_ms),
            },
            "hold": {"maxWait": d(self.hold.max_wait), "maxHeld": self.hold.max_held},
            "cluster": {
                "members": self.cluster.members.label(),
                "bootstrap": self.cluster.bootstrap.label(),
                "port": self.cluster.port,
                "leaveAfter": d(self.cluster.leave_after),
                "extensions": self.cluster.extensions,
            },
            "apiservers": self
                .apiservers
                .iter()
                .map(|e| json!({"id": e.id, "address": e.address, "port": e.port}))
                .collect::<Vec<_>>(),
        });
        json!({
            "config": config,
            "writes": {
                "cds": files.cds_path(),
                "rds": files.rds_path(),
                "ecds": files.ecds_path(),
                "moduleEcds": self.envoy.native_module.then(|| files.module_ecds_path()),
            },
            "reads": self.cluster.reads(),
            "deprecated": self
                .deprecations
                .iter()
                .map(|f| json!({"field": f.field, "reason": f.reason}))
                .collect::<Vec<_>>(),
        })
    }
}

/// Bounds on what one apiserver's discovery may hold. Past one, that apiserver's fetch fails
/// with [`crate::fetch::ErrorKind::Limit`] and its last good documents stay in the table. The
/// defaults are those of the routing table (`skewgate_core::table::MAX_*`), which also bounds
/// the union over all apiservers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Whole request, connect to last body byte.
    pub request_timeout: Duration,
    /// Per document.
    pub max_body_bytes: u64,
    /// Groups in `/api` and `/apis` together.
    pub max_groups: usize,
    pub max_group_versions: usize,
    /// Top-level resources (GVRs) over all group/versions.
    pub max_resources: usize,
}

/// A control plane of a few thousand CRDs has about as many groups at most.
pub const DEFAULT_MAX_GROUPS: usize = 5_000;

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            max_body_bytes: 16 * 1024 * 1024,
            max_groups: DEFAULT_MAX_GROUPS,
            max_group_versions: MAX_GROUP_VERSIONS,
            max_resources: MAX_GVRS,
        }
    }
}

/// One problem with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON-path-like name, e.g. `apiservers[1].port`, or the flag, e.g. `--poll-period`.
    pub field: String,
    pub reason: String,
}

/// Every problem found, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub Vec<FieldError>);

impl ConfigError {
    fn one(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self(vec![FieldError { field: field.into(), reason: reason.into() }])
    }

    /// Whether some error names `field`.
    pub fn names(&self, field: &str) -> bool {
        self.0.iter().any(|e| e.field == field)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.reason)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Command-line values that replace the file's.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub envoy_dir: Option<PathBuf>,
    pub wasm: Option<PathBuf>,
    pub admin_url: Option<String>,
    pub poll_period: Option<String>,
    pub probe_period: Option<String>,
    /// Deprecated: accepted and reported, like the key.
    pub grace_period: Option<String>,
    pub listen: Option<String>,
}

impl Overrides {
    /// Puts the flags into the document, so that their values go through the same checks.
    /// Relative paths on the command line are relative to the working directory.
    fn apply(&self, doc: &mut Value) -> Result<(), ConfigError> {
        let Value::Object(root) = doc else { return Ok(()) };
        let cwd =
            std::env::current_dir().map_err(|e| ConfigError::one("(working directory)", e.to_string()))?;
        let abs = |p: &PathBuf| Value::String(cwd.join(p).display().to_string());
        let mut set_envoy = |key: &str, value: Value| {
            let envoy = root.entry("envoy").or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(envoy) = envoy {
                envoy.insert(key.to_owned(), value);
            }
        };
        if let Some(dir) = &self.envoy_dir {
            set_envoy("dir", abs(dir));
        }
        if let Some(wasm) = &self.wasm {
            set_envoy("wasm", abs(wasm));
        }
        if let Some(url) = &self.admin_url {
            set_envoy("adminUrl", Value::String(url.clone()));
        }
        for (key, value) in [
            ("pollPeriod", &self.poll_period),
            ("probePeriod", &self.probe_period),
            ("gracePeriod", &self.grace_period),
            ("listen", &self.listen),
        ] {
            if let Some(value) = value {
                root.insert(key.to_owned(), Value::String(value.clone()));
            }
        }
        Ok(())
    }
}

/// File formats, chosen by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Toml,
}

impl Format {
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
}

impl SyncConfig {
    /// Reads, overrides and validates `path`. Relative paths inside the file are relative to
    /// the file's directory.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Self, ConfigError> {
        let format = Format::of(path).ok_or_else(|| {
            ConfigError::one("--config", format!("{}: use a .json or .toml file", path.display()))
        })?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one("--config", format!("{}: {e}", path.display())))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base = std::env::current_dir().map(|cwd| cwd.join(&base)).unwrap_or(base);
        let mut doc = parse_text(&text, format)?;
        overrides.apply(&mut doc)?;
        Self::from_value(&doc, &base)
    }

    /// Validates a parsed document; relative paths are taken relative to `base`.
    pub fn from_value(doc: &Value, base: &Path) -> Result<Self, ConfigError> {
        let mut r = Reader { errors: Vec::new(), base: base.to_path_buf() };
        let config = r.config(doc);
        match config {
            Some(config) if r.errors.is_empty() => Ok(config),
            _ => Err(ConfigError(r.errors)),
        }
    }
}

/// The document as JSON, whichever format it was written in.
pub fn parse_text(text: &str, format: Format) -> Result<Value, ConfigError> {
    match format {
        Format::Json => {
            serde_json::from_str(text).map_err(|e| ConfigError::one("(document)", format!("not JSON: {e}")))
        }
        Format::Toml => toml::from_str::<Value>(text)
            .map_err(|e| ConfigError::one("(document)", format!("not TOML: {}", e.to_string().trim()))),
    }
}

struct Reader {
    errors: Vec<FieldError>,
    base: PathBuf,
}

const TOP_KEYS: &[&str] = &[
    "apiservers",
    "serverName",
    "tls",
    "identity",
    "envoy",
    "pollPeriod",
    "probePeriod",
    "gracePeriod",
    "limits",
    "health",
    "listen",
    "cluster",
    "hold",
];

impl Reader {
    fn fail(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.errors.push(FieldError { field: field.into(), reason: reason.into() });
    }

    fn config(&mut self, doc: &Value) -> Option<SyncConfig> {
        let root = self.object(Some(doc), "(document)", TOP_KEYS)?;
        let apiservers = self.apiservers(root.get("apiservers"));
        let server_name = self
            .string(root.get("serverName"), "serverName")
            .unwrap_or_else(|| DEFAULT_SERVER_NAME.to_owned());
        if !is_dns_name(&server_name) {
            self.fail("serverName", format!("{server_name:?} is not a DNS name"));
        }
        let tls = self.tls(root.get("tls"));
        let identity = self.identity(root.get("identity"));
        let envoy = self.envoy(root.get("envoy"));
        let poll_period = self.duration(root.get("pollPeriod"), "pollPeriod", Duration::from_secs(5), false);
        let probe_period =
            self.duration(root.get("probePeriod"), "probePeriod", Duration::from_millis(250), false);
        let mut deprecations = Vec::new();
        if root.contains_key("gracePeriod") {
            // Still checked, so that a typo in a file that has it is reported as before.
            self.duration(root.get("gracePeriod"), "gracePeriod", Duration::ZERO, true);
            deprecations
                .push(FieldError { field: "gracePeriod".into(), reason: GRACE_PERIOD_DEPRECATED.into() });
        }
        let limits = self.limits(root.get("limits"));
        let health = self.health(root.get("health"));
        let cluster = self.cluster(root.get("cluster"));
        let hold = self.hold(root.get("hold"));
        if let Some(envoy) = &envoy {
            if !hold.is_off() && hold.max_wait >= envoy.route_timeout {
                // Envoy would end a waiting request with its own timeout first.
                self.fail(
                    "hold.maxWait",
                    format!(
                        "{:?} is not shorter than envoy.routeTimeout ({:?})",
                        hold.max_wait, envoy.route_timeout
                    ),
                );
            }
        }
        let listen = self.string(root.get("listen"), "listen").unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = match listen.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.fail("listen", format!("{listen:?} is not an address:port like 127.0.0.1:9090"));
                None
            }
        };
        Some(SyncConfig {
            apiservers: apiservers?,
            server_name,
            tls: tls?,
            identity: identity?,
            envoy: envoy?,
            poll_period,
            probe_period,
            limits,
            health,
            listen: listen?,
            deprecations,
            cluster,
            hold,
        })
    }

    fn hold(&mut self, value: Option<&Value>) -> HoldPolicy {
        let mut hold = HoldPolicy::default();
        let Some(map) = self.object(value, "hold", &["maxWait", "maxHeld"]) else {
            return hold;
        };
        hold.max_wait = self.duration(map.get("maxWait"), "hold.maxWait", hold.max_wait, true);
        if let Some(n) = self.integer(map.get("maxHeld"), "hold.maxHeld", 1, 1 << 20) {
            hold.max_held = usize::try_from(n).unwrap_or(hold.max_held);
        }
        hold
    }

    fn object<'v>(
        &mut self,
        value: Option<&'v Value>,
        field: &str,
        known: &[&str],
    ) -> Option<&'v Map<String, Value>> {
        match value {
            Some(Value::Object(map)) => {
                for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
                    let name = if field == "(document)" { key.clone() } else { format!("{field}.{key}") };
                    self.fail(name, format!("unknown field (known: {})", known.join(", ")));
                }
                Some(map)
            }
            Some(other) => {
                self.fail(field, format!("expected a table/object, got {}", kind(other)));
                None
            }
            None => None,
        }
    }

    fn string(&mut self, value: Option<&Value>, field: &str) -> Option<String> {
        match value {
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                self.fail(field, format!("expected a string, got {}", kind(other)));
                None
            }
            None => None,
        }
    }

    fn boolean(&mut self, value: Option<&Value>, field: &str) -> Option<bool> {
        match value {
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.fail(field, format!("expected a boolean (true or false), got {}", kind(other)));
                None
            }
            None => None,
        }
    }

    fn required_string(&mut self, value: Option<&Value>, field: &str) -> Option<String> {
        if value.is_none() {
            self.fail(field, "is required");
        }
        let s = self.string(value, field)?;
        if s.trim().is_empty() {
            self.fail(field, "must not be empty");
            return None;
        }
        Some(s)
    }

    fn integer(&mut self, value: Option<&Value>, field: &str, min: u64, max: u64) -> Option<u64> {
        match value {
            Some(v @ Value::Number(n)) => match n.as_u64() {
                Some(i) if (min..=max).contains(&i) => Some(i),
                _ => {
                    self.fail(field, format!("expected an integer from {min} to {max}, got {v}"));
                    None
                }
            },
            Some(other) => {
                self.fail(field, format!("expected an integer, got {}", kind(other)));
                None
            }
            None => None,
        }
    }

    /// A duration string; zero only where `zero_ok`.
    fn duration(&mut self, value: Option<&Value>, field: &str, default: Duration, zero_ok: bool) -> Duration {
        let Some(text) = self.string(value, field) else { return default };
        match duration::parse(&text) {
            Ok(d) if d.is_zero() && !zero_ok => {
                self.fail(field, "must be longer than zero");
                default
            }
            Ok(d) => d,
            Err(reason) => {
                self.fail(field, reason);
                default
            }
        }
    }

    /// A file that must exist; relative to the config file's directory.
    fn file(&mut self, value: Option<&Value>, field: &str) -> Option<PathBuf> {
        let relative = self.required_string(value, field)?;
        let path = self.base.join(relative);
        if !path.is_file() {
            self.fail(field, format!("{}: no such file", path.display()));
            return None;
        }
        Some(path.canonicalize().unwrap_or(path))
    }

    fn apiservers(&mut self, value: Option<&Value>) -> Option<Vec<Endpoint>> {
        let items = match value {
            Some(Value::Array(items)) if !items.is_empty() => items,
            Some(Value::Array(_)) => {
                self.fail("apiservers", "must list at least one apiserver");
                return None;
            }
            Some(other) => {
                self.fail("apiservers", format!("expected a list, got {}", kind(other)));
                return None;
            }
            None => {
                self.fail("apiservers", "is required");
                return None;
            }
        };
        if items.len() > skewgate_core::table::MAX_APISERVERS {
            self.fail(
                "apiservers",
                format!("{} apiservers: at most {}", items.len(), skewgate_core::table::MAX_APISERVERS),
            );
        }
        let mut endpoints = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let field = format!("apiservers[{i}]");
            let Some(map) = self.object(Some(item), &field, &["id", "address", "port"]) else {
                ok = false;
                continue;
            };
            let id = self.required_string(map.get("id"), &format!("{field}.id"));
            if let Some(id) = &id {
                if !skewgate_core::build::is_valid_apiserver_id(id) {
                    self.fail(
                        format!("{field}.id"),
                        format!("{id:?} is not a DNS label (1-63 of [a-z0-9-], alphanumeric at both ends)"),
                    );
                } else if let Some(prev) = endpoints.iter().position(|e: &Endpoint| &e.id == id) {
                    self.fail(format!("{field}.id"), format!("{id:?} is also apiservers[{prev}].id"));
                }
            }
            let address = self.required_string(map.get("address"), &format!("{field}.address"));
            if let Some(address) = &address {
                if address.parse::<std::net::IpAddr>().is_err() && !is_dns_name(address) {
                    self.fail(
                        format!("{field}.address"),
                        format!("{address:?} is not an IP address or host name"),
                    );
                }
            }
            if map.get("port").is_none() {
                self.fail(format!("{field}.port"), "is required");
            }
            let port = self.integer(map.get("port"), &format!("{field}.port"), 1, 65535);
            match (id, address, port) {
                (Some(id), Some(address), Some(port)) => {
                    endpoints.push(Endpoint { id, address, port: port as u16 })
                }
                _ => ok = false,
            }
        }
        ok.then_some(endpoints)
    }

    fn tls(&mut self, value: Option<&Value>) -> Option<TlsFiles> {
        if value.is_none() {
            self.fail("tls", "is required (peerCa, clientCert, clientKey)");
            return None;
        }
        let map = self.object(value, "tls", &["peerCa", "clientCert", "clientKey"])?;
        let peer_ca = self.file(map.get("peerCa"), "tls.peerCa");
        let client_cert = self.file(map.get("clientCert"), "tls.clientCert");
        let client_key = self.file(map.get("clientKey"), "tls.clientKey");
        Some(TlsFiles { peer_ca: peer_ca?, client_cert: client_cert?, client_key: client_key? })
    }

    fn identity(&mut self, value: Option<&Value>) -> Option<Identity> {
        let mut identity = Identity { user: DEFAULT_USER.to_owned(), groups: vec![DEFAULT_GROUP.to_owned()] };
        let Some(map) = self.object(value, "identity", &["user", "groups"]) else {
            return value.is_none().then_some(identity);
        };
        if let Some(user) = self.string(map.get("user"), "identity.user") {
            if !is_header_value(&user) || user.is_empty() {
                self.fail("identity.user", "must be a non-empty header value (no control characters)");
            }
            identity.user = user;
        }
        match map.get("groups") {
            None => {}
            Some(Value::Array(items)) => {
                identity.groups.clear();
                for (i, item) in items.iter().enumerate() {
                    let field = format!("identity.groups[{i}]");
                    if let Some(group) = self.string(Some(item), &field) {
                        if !is_header_value(&group) || group.is_empty() {
                            self.fail(field, "must be a non-empty header value (no control characters)");
                        }
                        identity.groups.push(group);
                    }
                }
            }
            Some(other) => {
                self.fail("identity.groups", format!("expected a list of strings, got {}", kind(other)))
            }
        }
        Some(identity)
    }

    fn envoy(&mut self, value: Option<&Value>) -> Option<EnvoyOutput> {
        if value.is_none() {
            self.fail("envoy", "is required (dir, wasm)");
            return None;
        }
        let map = self.object(
            value,
            "envoy",
            &["dir", "wasm", "routeTimeout", "adminUrl", "confirmTimeout", "settleDelay", "nativeModule"],
        )?;
        let dir = self.required_string(map.get("dir"), "envoy.dir");
        let dir = dir.map(|d| self.base.join(d));
        let wasm = self.file(map.get("wasm"), "envoy.wasm");
        let admin_url = self.string(map.get("adminUrl"), "envoy.adminUrl");
        if let Some(url) = &admin_url {
            match reqwest::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => self.fail("envoy.adminUrl", format!("{url:?} is not an http(s) URL")),
            }
        }
        let confirm_timeout =
            self.duration(map.get("confirmTimeout"), "envoy.confirmTimeout", Duration::from_secs(10), false);
        let settle_delay =
            self.duration(map.get("settleDelay"), "envoy.settleDelay", Duration::from_secs(2), true);
        let route_timeout =
            self.duration(map.get("routeTimeout"), "envoy.routeTimeout", DEFAULT_ROUTE_TIMEOUT, false);
        let native_module = self.boolean(map.get("nativeModule"), "envoy.nativeModule").unwrap_or(false);
        Some(EnvoyOutput {
            dir: dir?,
            wasm: wasm?,
            route_timeout,
            admin_url: admin_url.map(|u| u.trim_end_matches('/').to_owned()),
            confirm_timeout,
            settle_delay,
            native_module,
        })
    }

    fn cluster(&mut self, value: Option<&Value>) -> crate::cluster::ClusterConfig {
        use crate::cluster::{Bootstrap, ClusterConfig, Members};
        let mut c = ClusterConfig::default();
        let known = ["members", "bootstrap", "port", "leaveAfter", "extensions"];
        let Some(map) = self.object(value, "cluster", &known) else { return c };
        match self.string(map.get("members"), "cluster.members").as_deref() {
            None | Some("static") => {}
            Some("endpointSlice") => c.members = Members::EndpointSlice,
            Some("leases") => c.members = Members::Leases,
            Some(other) => {
                self.fail("cluster.members", format!("{other:?}: use static, endpointSlice or leases"))
            }
        }
        match self.string(map.get("bootstrap"), "cluster.bootstrap").as_deref() {
            None | Some("pool") => {}
            Some("apiservers") => c.bootstrap = Bootstrap::Apiservers,
            Some(other) => self.fail("cluster.bootstrap", format!("{other:?}: use pool or apiservers")),
        }
        if let Some(port) = self.integer(map.get("port"), "cluster.port", 1, 65535) {
            c.port = port as u16;
        }
        c.leave_after = self.duration(map.get("leaveAfter"), "cluster.leaveAfter", c.leave_after, true);
        if let Some(extensions) = self.boolean(map.get("extensions"), "cluster.extensions") {
            c.extensions = extensions;
        }
        c
    }

    fn limits(&mut self, value: Option<&Value>) -> Limits {
        let mut limits = Limits::default();
        let keys = ["requestTimeout", "maxBodyBytes", "maxGroups", "maxGroupVersions", "maxResources"];
        let Some(map) = self.object(value, "limits", &keys) else {
            return limits;
        };
        limits.request_timeout =
            self.duration(map.get("requestTimeout"), "limits.requestTimeout", limits.request_timeout, false);
        if let Some(max) = self.integer(map.get("maxBodyBytes"), "limits.maxBodyBytes", 1024, 1 << 32) {
            limits.max_body_bytes = max;
        }
        // Above the table's own bounds a per-apiserver limit would never be reached first.
        let mut count = |key: &str, max: usize, slot: &mut usize| {
            let field = format!("limits.{key}");
            if let Some(n) = self.integer(map.get(key), &field, 1, max as u64) {
                *slot = usize::try_from(n).unwrap_or(max);
            }
        };
        count("maxGroups", MAX_GROUP_VERSIONS, &mut limits.max_groups);
        count("maxGroupVersions", MAX_GROUP_VERSIONS, &mut limits.max_group_versions);
        count("maxResources", MAX_GVRS, &mut limits.max_resources);
        limits
    }

    fn health(&mut self, value: Option<&Value>) -> Health {
        let mut health = Health::default();
        let Some(map) = self.object(value, "health", &["interval", "timeout", "connectTimeout"]) else {
            return health;
        };
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut get = |key: &str, default_ms: u64| {
            let default = Duration::from_millis(default_ms);
            ms(self.duration(map.get(key), &format!("health.{key}"), default, false))
        };
        health.interval_ms = get("interval", health.interval_ms);
        health.timeout_ms = get("timeout", health.timeout_ms);
        health.connect_timeout_ms = get("connectTimeout", health.connect_timeout_ms);
        health
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table/object",
    }
}

fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_header_value(value: &str) -> bool {
    value.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Files {
        dir: PathBuf,
    }

    fn files(name: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("skewgate-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["peer-ca.crt", "front-proxy.crt", "front-proxy.key", "skewgate.wasm"] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        Files { dir }
    }

    fn good() -> Value {
        json!({
            "apiservers": [
                {"id": "a", "address": "127.0.0.1", "port": 7001},
                {"id": "b", "address": "apiserver-b.example", "port": 6443}
            ],
            "tls": {"peerCa": "peer-ca.crt", "clientCert": "front-proxy.crt", "clientKey": "front-proxy.key"},
            "envoy": {"dir": "out", "wasm": "skewgate.wasm"}
        })
    }

    fn error_of(doc: Value, f: &Files) -> ConfigError {
        SyncConfig::from_value(&doc, &f.dir).unwrap_err()
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let f = files("defaults");
        let c = SyncConfig::from_value(&good(), &f.dir).unwrap();
        assert_eq!(
            c.apiservers[1],
            Endpoint { id: "b".into(), address: "apiserver-b.example".into(), port: 6443 }
        );
        assert_eq!(c.server_name, "kubernetes.default.svc");
        assert_eq!(
            c.identity,
            Identity { user: "system:apiserver".into(), groups: vec!["system:authenticated".into()] }
        );
        assert_eq!(c.listen, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(c.poll_period, Duration::from_secs(5));
        assert_eq!(c.probe_period, Duration::from_millis(250));
        assert_eq!(c.envoy.route_timeout, Duration::from_secs(65));
        assert!(c.deprecations.is_empty());
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.health, Health::default());
        assert_eq!(c.hold, HoldPolicy::default());
        assert_eq!(c.envoy.admin_url, None);
        assert!(!c.envoy.native_module);
        assert!(c.tls.peer_ca.is_absolute());
        assert_eq!(c.envoy.dir, f.dir.join("out"));
        assert_eq!(c.envoy.files().cds_path(), f.dir.join("out/cds/cds.json"));
        assert_eq!(c.envoy.files().ecds_path(), f.dir.join("out/ecds/ecds.json"));
    }

    #[test]
    fn every_field_can_be_set() {
        let f = files("full");
        let mut doc = good();
        let extra = json!({
            "serverName": "apiserver.internal",
            "identity": {"user": "skewgate", "groups": ["system:authenticated", "skewgate:sidecars"]},
            "pollPeriod": "500ms", "probePeriod": "100ms", "listen": "0.0.0.0:9191",
            "limits": {"requestTimeout": "2s", "maxBodyBytes": 4096, "maxGroups": 10, "maxGroupVersions": 20,
                       "maxResources": 30},
            "health": {"interval": "1s", "timeout": "250ms", "connectTimeout": "300ms"},
            "hold": {"maxWait": "5s", "maxHeld": 64}
        });
        for (k, v) in extra.as_object().unwrap() {
            doc[k] = v.clone();
        }
        doc["envoy"]["adminUrl"] = json!("http://127.0.0.1:9901/");
        doc["envoy"]["confirmTimeout"] = json!("3s");
        doc["envoy"]["settleDelay"] = json!("0s");
        doc["envoy"]["nativeModule"] = json!(true);
        doc["envoy"]["routeTimeout"] = json!("10s");
        let c = SyncConfig::from_value(&doc, &f.dir).unwrap();
        assert_eq!(c.server_name, "apiserver.internal");
        assert_eq!(c.identity.groups.len(), 2);
        assert_eq!(c.poll_period, Duration::from_millis(500));
        assert_eq!(c.probe_period, Duration::from_millis(100));
        assert_eq!(
            c.limits,
            Limits {
                request_timeout: Duration::from_secs(2),
                max_body_bytes: 4096,
                max_groups: 10,
                max_group_versions: 20,
                max_resources: 30
            }
        );
        assert_eq!(c.health, Health { interval_ms: 1000, timeout_ms: 250, connect_timeout_ms: 300 });
        assert_eq!(c.envoy.admin_url.as_deref(), Some("http://127.0.0.1:9901"));
        assert_eq!(c.envoy.confirm_timeout, Duration::from_secs(3));
        assert_eq!(c.envoy.settle_delay, Duration::ZERO);
        assert!(c.envoy.native_module);
        assert_eq!(c.envoy.route_timeout, Duration::from_secs(10));
        assert_eq!(c.hold, HoldPolicy { max_wait: Duration::from_secs(5), max_held: 64 });
    }

    #[test]
    fn each_bad_field_is_named() {
        let f = files("bad");
        type Mutation = fn(&mut Value);
        let cases: Vec<(&str, Mutation)> = vec![
            ("apiservers", |d| d["apiservers"] = json!([])),
            ("apiservers", |d| d["apiservers"] = json!("a")),
            ("apiservers[0].id", |d| d["apiservers"][0]["id"] = json!("A_1")),
            ("apiservers[1].id", |d| d["apiservers"][1]["id"] = json!("a")),
            ("apiservers[0].id", |d| {
                d["apiservers"][0].as_object_mut().unwrap().remove("id").map(drop).unwrap_or(())
            }),
            ("apiservers[1].address", |d| d["apiservers"][1]["address"] = json!("bad host!")),
            ("apiservers[0].port", |d| d["apiservers"][0]["port"] = json!(0)),
            ("apiservers[0].port", |d| d["apiservers"][0]["port"] = json!(70000)),
            ("apiservers[0].port", |d| d["apiservers"][0]["port"] = json!("7001")),
            ("apiservers[0].zone", |d| d["apiservers"][0]["zone"] = json!("x")),
            ("serverName", |d| d["serverName"] = json!("not a name")),
            ("tls", |d| d.as_object_mut().unwrap().remove("tls").map(drop).unwrap_or(())),
            ("tls.peerCa", |d| d["tls"]["peerCa"] = json!("missing.crt")),
            ("tls.clientCert", |d| d["tls"]["clientCert"] = json!(7)),
            ("tls.clientKey", |d| d["tls"]["clientKey"] = json!("")),
            ("identity.user", |d| d["identity"] = json!({"user": "bad\nuser"})),
            ("identity.groups", |d| d["identity"] = json!({"groups": "system:masters"})),
            ("identity.groups[1]", |d| d["identity"] = json!({"groups": ["ok", 3]})),
            ("envoy.dir", |d| d["envoy"]["dir"] = json!("")),
            ("envoy.wasm", |d| d["envoy"]["wasm"] = json!("nope.wasm")),
            ("envoy.adminUrl", |d| d["envoy"]["adminUrl"] = json!("localhost:9901")),
            ("envoy.confirmTimeout", |d| d["envoy"]["confirmTimeout"] = json!("0s")),
            ("envoy.settleDelay", |d| d["envoy"]["settleDelay"] = json!("soon")),
            ("envoy.nativeModule", |d| d["envoy"]["nativeModule"] = json!("yes")),
            ("hold.maxWait", |d| d["hold"] = json!({"maxWait": "65s"})),
            ("hold.maxWait", |d| d["hold"] = json!({"maxWait": "soon"})),
            ("hold.maxHeld", |d| d["hold"] = json!({"maxHeld": 0})),
            ("hold.forever", |d| d["hold"] = json!({"forever": true})),
            ("pollPeriod", |d| d["pollPeriod"] = json!("5")),
            ("pollPeriod", |d| d["pollPeriod"] = json!("0ms")),
            ("gracePeriod", |d| d["gracePeriod"] = json!(30)),
            ("probePeriod", |d| d["probePeriod"] = json!("0s")),
            ("limits.requestTimeout", |d| d["limits"] = json!({"requestTimeout": "1w"})),
            ("limits.maxBodyBytes", |d| d["limits"] = json!({"maxBodyBytes": -1})),
            ("limits.maxGroups", |d| d["limits"] = json!({"maxGroups": 0})),
            ("limits.maxGroupVersions", |d| d["limits"] = json!({"maxGroupVersions": 10001})),
            ("limits.maxResources", |d| d["limits"] = json!({"maxResources": "many"})),
            ("health.interval", |d| d["health"] = json!({"interval": "0s"})),
            ("health.timeout", |d| d["health"] = json!({"timeout": true})),
            ("health.connectTimeout", |d| d["health"] = json!({"connectTimeout": "x"})),
            ("listen", |d| d["listen"] = json!("localhost")),
            ("pollPeriods", |d| d["pollPeriods"] = json!("5s")),
        ];
        for (field, mutate) in cases {
            let mut doc = good();
            mutate(&mut doc);
            let error = error_of(doc.clone(), &f);
            assert!(error.names(field), "{field}: {error} (doc {doc})");
            assert!(error.to_string().contains(&format!("{field}: ")), "{error}");
        }
    }

    /// [`EXAMPLE_TOML`] loaded, next to the files it names.
    fn example(name: &str) -> (Files, SyncConfig) {
        let f = files(name);
        for file in ["pki/peer-ca.crt", "pki/front-proxy.crt", "pki/front-proxy.key", "skewgate_filter.wasm"]
        {
            std::fs::create_dir_all(f.dir.join(file).parent().unwrap()).unwrap();
            std::fs::write(f.dir.join(file), "x").unwrap();
        }
        let path = f.dir.join("example.toml");
        std::fs::write(&path, EXAMPLE_TOML).unwrap();
        let config = SyncConfig::load(&path, &Overrides::default()).unwrap();
        (f, config)
    }

    /// What `--check` prints is a configuration of its own that loads to the same one, for a
    /// static cluster and for one that is asked for its members and extensions.
    #[test]
    fn the_effective_configuration_loads_to_itself() {
        let (_, example) = example("effective");
        let mut asked = example.clone();
        asked.cluster.members = crate::cluster::Members::Leases;
        asked.cluster.extensions = true;
        asked.envoy.native_module = true;
        for c in [example, asked] {
            let effective = c.effective();
            let again = SyncConfig::from_value(&effective["config"], Path::new("/elsewhere")).unwrap();
            assert_eq!(again, c, "{effective:#}");
            assert_eq!(effective["writes"]["ecds"], json!(c.envoy.files().ecds_path()));
            let reads = effective["reads"].as_array().unwrap().len();
            assert_eq!(reads, if c.cluster.asks() { 3 } else { 0 }, "{effective:#}");
        }
    }

    #[test]
    fn the_example_is_valid_and_spells_out_the_defaults() {
        let (f, c) = example("example");
        assert_eq!(c.apiservers.len(), 2);
        assert_eq!(c.envoy.admin_url.as_deref(), Some("http://127.0.0.1:9901"));
        let mut minimal = c.clone();
        minimal.envoy.admin_url = None;
        let mut doc = good();
        doc["apiservers"] = json!([{"id": "a", "address": "10.0.0.11", "port": 6443},
            {"id": "b", "address": "apiserver-b.internal", "port": 6443}]);
        doc["tls"] = json!({"peerCa": "pki/peer-ca.crt", "clientCert": "pki/front-proxy.crt", "clientKey": "pki/front-proxy.key"});
        doc["envoy"] = json!({"dir": "envoy", "wasm": "skewgate_filter.wasm"});
        assert_eq!(
            SyncConfig::from_value(&doc, &f.dir).unwrap(),
            minimal,
            "the example's values are the defaults"
        );
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let f = files("many");
        let mut doc = good();
        doc["apiservers"][0]["port"] = json!(0);
        doc["pollPeriod"] = json!("x");
        doc["tls"]["peerCa"] = json!("gone.crt");
        let error = error_of(doc, &f);
        assert!(error.names("apiservers[0].port") && error.names("pollPeriod") && error.names("tls.peerCa"));
        assert_eq!(error.0.len(), 3, "{error}");
    }

    #[test]
    fn toml_and_json_files_and_flags() {
        let f = files("files");
        let toml_text = r#"
            pollPeriod = "1s"
            [tls]
            peerCa = "peer-ca.crt"
            clientCert = "front-proxy.crt"
            clientKey = "front-proxy.key"
            [envoy]
            dir = "out"
            wasm = "skewgate.wasm"
            [[apiservers]]
            id = "a"
            address = "127.0.0.1"
            port = 7001
        "#;
        let toml_path = f.dir.join("sync.toml");
        std::fs::write(&toml_path, toml_text).unwrap();
        let c = SyncConfig::load(&toml_path, &Overrides::default()).unwrap();
        assert_eq!(c.poll_period, Duration::from_secs(1));
        assert_eq!(c.apiservers.len(), 1);

        let json_path = f.dir.join("sync.json");
        std::fs::write(&json_path, good().to_string()).unwrap();
        let overrides = Overrides {
            poll_period: Some("250ms".into()),
            admin_url: Some("http://127.0.0.1:1".into()),
            envoy_dir: Some(f.dir.join("elsewhere")),
            ..Overrides::default()
        };
        let c = SyncConfig::load(&json_path, &overrides).unwrap();
        assert_eq!(c.poll_period, Duration::from_millis(250));
        assert_eq!(c.envoy.admin_url.as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(c.envoy.dir, f.dir.join("elsewhere"));
        let bad = Overrides { grace_period: Some("forever".into()), ..Overrides::default() };
        assert!(SyncConfig::load(&json_path, &bad).unwrap_err().names("gracePeriod"));
        // Accepted, ignored, and reported: an old file still loads.
        let old = Overrides { grace_period: Some("30s".into()), ..Overrides::default() };
        let c = SyncConfig::load(&json_path, &old).unwrap();
        assert_eq!(c.deprecations.len(), 1);
        assert_eq!(c.deprecations[0].field, "gracePeriod");
        assert!(c.deprecations[0].reason.contains("503 rather than 404"), "{:?}", c.deprecations);

        let yaml = f.dir.join("sync.yaml");
        std::fs::write(&yaml, "x").unwrap();
        assert!(SyncConfig::load(&yaml, &Overrides::default()).unwrap_err().names("--config"));
        std::fs::write(&toml_path, "pollPeriod = ").unwrap();
        assert!(SyncConfig::load(&toml_path, &Overrides::default()).unwrap_err().names("(document)"));
        std::fs::write(&json_path, "[1]").unwrap();
        assert!(SyncConfig::load(&json_path, &Overrides::default()).unwrap_err().names("(document)"));
    }
}
