//! The sidecar's Prometheus metrics (`/metrics`, OpenMetrics text via `prometheus-client`).

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FetchErrorLabels {
    pub apiserver: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiserverLabel {
    pub apiserver: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExclusionLabels {
    pub apiserver: String,
    pub reason: String,
}

pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    /// Failed discovery fetches, by apiserver and [`crate::fetch::ErrorKind::label`].
    pub sync_errors: Family<FetchErrorLabels, Counter>,
    /// Failed table pushes and builds, by kind.
    pub push_errors: Family<KindLabel, Counter>,
    /// Tables written to Envoy (a change of cds.json and/or ecds.json).
    pub table_pushes: Counter,
    /// Envoy's files put back ([`crate::guard`]): `kind="file"` replaced on disk, `kind="live"`
    /// Envoy running something else than the files say.
    pub envoy_restores: Family<KindLabel, Counter>,
    pub gvrs: Gauge,
    pub rerouted_gvrs: Gauge,
    /// 1 while the apiserver's documents are current, 0 while the last good ones stand in.
    pub apiserver_current: Family<ApiserverLabel, Gauge>,
    /// 1 while Envoy may send the apiserver new requests (not marked `DRAINING`).
    pub apiserver_eligible: Family<ApiserverLabel, Gauge>,
    /// Times an apiserver was taken out of every cluster, by the first reason seen.
    pub apiserver_exclusions: Family<ExclusionLabels, Counter>,
    /// How long each exclusion lasted, until the apiserver was eligible again.
    pub apiserver_excluded: Histogram,
    last_success_age: Gauge<f64, AtomicU64>,
    last_success: Mutex<Option<Instant>>,
    /// `skewgate_openapi_*`: the OpenAPI composer.
    pub openapi: OpenapiMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("skewgate");
        let sync_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register_with_unit(
            "sync_duration",
            "Time of one sync: fetching every apiserver, building and pushing the table",
            Unit::Seconds,
            sync_duration.clone(),
        );
        let sync_errors = Family::<FetchErrorLabels, Counter>::default();
        registry.register(
            "sync_errors",
            "Failed discovery fetches by apiserver and kind",
            sync_errors.clone(),
        );
        let push_errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "push_errors",
            "Tables that could not be built or pushed, by kind",
            push_errors.clone(),
        );
        let envoy_restores = Family::<KindLabel, Counter>::default();
        // At zero from the start: "nothing put back" is an answer too.
        for kind in ["file", "live"] {
            let _ = envoy_restores.get_or_create(&KindLabel { kind: kind.to_owned() });
        }
        registry.register(
            "envoy_restores",
            "Envoy's files put back after someone else changed them or Envoy ran something else, by kind",
            envoy_restores.clone(),
        );
        let table_pushes = Counter::default();
        registry.register("table_pushes", "Routing tables written to Envoy", table_pushes.clone());
        let gvrs = Gauge::default();
        registry.register("gvrs", "Group/version/resources in the current table", gvrs.clone());
        let rerouted_gvrs = Gauge::default();
        registry.register(
            "rerouted_gvrs",
            "GVRs of the current table that not every apiserver serves",
            rerouted_gvrs.clone(),
        );
        let apiserver_current = Family::<ApiserverLabel, Gauge>::default();
        registry.register(
            "apiserver_current",
            "1 while the apiserver's discovery is current, 0 while stale or dropped",
            apiserver_current.clone(),
        );
        let apiserver_eligible = Family::<ApiserverLabel, Gauge>::default();
        registry.register(
            "apiserver_eligible",
            "1 while Envoy may send the apiserver new requests, 0 while it is marked DRAINING",
            apiserver_eligible.clone(),
        );
        let apiserver_exclusions = Family::<ExclusionLabels, Counter>::default();
        registry.register(
            "apiserver_exclusions",
            "Times an apiserver was marked DRAINING (unreachable, unready, changed, undescribed)",
            apiserver_exclusions.clone(),
        );
        let apiserver_excluded = Histogram::new(exponential_buckets(0.05, 2.0, 14));
        registry.register_with_unit(
            "apiserver_excluded",
            "How long each exclusion of an apiserver lasted, until it was eligible again",
            Unit::Seconds,
            apiserver_excluded.clone(),
        );
        let last_success_age = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "last_successful_sync_age",
            "Time since the last sync that left Envoy with the current table (-1: none yet)",
            Unit::Seconds,
            last_success_age.clone(),
        );
        last_success_age.set(-1.0);
        let openapi = OpenapiMetrics::default();
        openapi.register(registry.sub_registry_with_prefix("openapi"));
        Self {
            registry,
            sync_duration,
            sync_errors,
            push_errors,
            table_pushes,
            envoy_restores,
            gvrs,
            rerouted_gvrs,
            apiserver_current,
            apiserver_eligible,
            apiserver_exclusions,
            apiserver_excluded,
            last_success_age,
            last_success: Mutex::new(None),
            openapi,
        }
    }

    pub fn fetch_error(&self, apiserver: &str, kind: &str) {
        self.sync_errors
            .get_or_create(&FetchErrorLabels { apiserver: apiserver.to_owned(), kind: kind.to_owned() })
            .inc();
    }

    pub fn push_error(&self, kind: &str) {
        self.push_errors.get_or_create(&KindLabel { kind: kind.to_owned() }).inc();
    }

    pub fn set_current(&self, apiserver: &str, current: bool) {
        self.apiserver_current
            .get_or_create(&ApiserverLabel { apiserver: apiserver.to_owned() })
            .set(i64::from(current));
    }

    pub fn set_eligible(&self, apiserver: &str, eligible: bool) {
        self.apiserver_eligible
            .get_or_create(&ApiserverLabel { apiserver: apiserver.to_owned() })
            .set(i64::from(eligible));
    }

    pub fn excluded(&self, apiserver: &str, reason: &str) {
        self.apiserver_exclusions
            .get_or_create(&ExclusionLabels { apiserver: apiserver.to_owned(), reason: reason.to_owned() })
            .inc();
    }

    pub fn succeeded(&self, at: Instant) {
        if let Ok(mut last) = self.last_success.lock() {
            *last = Some(at);
        }
    }

    pub fn last_success_age(&self) -> Option<Duration> {
        self.last_success.lock().ok().and_then(|l| *l).map(|at| at.elapsed())
    }

    /// The OpenMetrics text, with the age computed now.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        if let Some(age) = self.last_success_age() {
            self.last_success_age.set(age.as_secs_f64());
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// The composer's metrics, under `skewgate_openapi_`.
#[derive(Debug, Default)]
pub struct OpenapiMetrics {
    /// Failed fetches of an apiserver's OpenAPI, by apiserver and kind.
    pub fetch_errors: Family<FetchErrorLabels, Counter>,
    /// Compositions served (each after a change of some apiserver's documents).
    pub compositions: Counter,
    /// Bytes held: every apiserver's fetched documents and the composed ones.
    pub held_bytes: Gauge,
    /// Composed v3 documents, and how many of them are merged (not one apiserver's, unchanged).
    pub documents: Gauge,
    pub merged_documents: Gauge,
}

impl OpenapiMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "fetch_errors",
            "Failed OpenAPI fetches by apiserver and kind",
            self.fetch_errors.clone(),
        );
        registry.register("compositions", "OpenAPI compositions served", self.compositions.clone());
        registry.register(
            "held_bytes",
            "Bytes of OpenAPI documents the composer holds",
            self.held_bytes.clone(),
        );
        registry.register("documents", "Composed OpenAPI v3 documents", self.documents.clone());
        registry.register(
            "merged_documents",
            "Composed OpenAPI v3 documents merged from several apiservers'",
            self.merged_documents.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        let m = Metrics::new();
        m.fetch_error("a", "timeout");
        m.fetch_error("a", "timeout");
        m.push_error("clusters_missing");
        m.gvrs.set(112);
        m.rerouted_gvrs.set(41);
        m.table_pushes.inc();
        m.set_current("b", false);
        m.set_eligible("b", false);
        m.excluded("b", "unready");
        m.apiserver_excluded.observe(0.4);
        m.sync_duration.observe(0.2);
        let text = m.encode().unwrap();
        for line in [
            "skewgate_sync_errors_total{apiserver=\"a\",kind=\"timeout\"} 2",
            "skewgate_push_errors_total{kind=\"clusters_missing\"} 1",
            "skewgate_gvrs 112",
            "skewgate_rerouted_gvrs 41",
            "skewgate_table_pushes_total 1",
            "skewgate_envoy_restores_total{kind=\"file\"} 0",
            "skewgate_envoy_restores_total{kind=\"live\"} 0",
            "skewgate_apiserver_current{apiserver=\"b\"} 0",
            "skewgate_apiserver_eligible{apiserver=\"b\"} 0",
            "skewgate_apiserver_exclusions_total{apiserver=\"b\",reason=\"unready\"} 1",
            "skewgate_apiserver_excluded_seconds_count 1",
            "skewgate_sync_duration_seconds_count 1",
            "skewgate_last_successful_sync_age_seconds -1.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        m.succeeded(Instant::now());
        let text = m.encode().unwrap();
        assert!(!text.contains("skewgate_last_successful_sync_age_seconds -1"), "{text}");
    }

    #[test]
    fn openapi_composer_names() {
        let m = Metrics::new();
        let labels = FetchErrorLabels { apiserver: "c".into(), kind: "http_status".into() };
        m.openapi.fetch_errors.get_or_create(&labels).inc();
        m.openapi.compositions.inc();
        m.openapi.held_bytes.set(41_861_140);
        m.openapi.documents.set(53);
        let text = m.encode().unwrap();
        for line in [
            "skewgate_openapi_fetch_errors_total{apiserver=\"c\",kind=\"http_status\"} 1",
            "skewgate_openapi_compositions_total 1",
            "skewgate_openapi_held_bytes 41861140",
            "skewgate_openapi_documents 53",
            "skewgate_openapi_merged_documents 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
