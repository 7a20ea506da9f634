//! Requests the edge held while their GVR had no ready apiserver, from the filter's own stats in
//! Envoy's admin (`/stats?format=json&filter=skewgate`): the counter
//! `skewgate.held_requests_total.cluster=<c>;outcome=<resumed|expired|refused>;` and the
//! histogram `skewgate.hold_milliseconds`. An Envoy whose filter keeps no such stats reads as
//! nothing held.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

const HELD: &str = "skewgate.held_requests_total";
const HOLD_MS: &str = "skewgate.hold_milliseconds";

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Held {
    /// Outcome (`resumed`, `expired`, `refused`) → requests, over every cluster.
    pub outcomes: BTreeMap<String, u64>,
    /// How long held requests waited, cumulative over the run (`None`: no sample).
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl Held {
    pub fn total(&self) -> u64 {
        self.outcomes.values().sum()
    }

    /// The waits the histogram should hold: every request held, but those refused (never held).
    pub fn waits(&self) -> u64 {
        self.total() - self.outcomes.get("refused").copied().unwrap_or(0)
    }
}

/// The waits Envoy's histogram has taken in so far, from its Prometheus page: a histogram's
/// samples reach its cumulative figures only at Envoy's next stats flush (every 5 s), counters
/// at once, so a reading right after the last waits ended lacks them.
pub fn waits_recorded(prometheus: &str) -> u64 {
    prometheus
        .lines()
        .filter(|l| l.contains("hold_milliseconds_count"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|n| n as u64)
        .sum()
}

/// Reads Envoy's JSON stats. Wasm stats may carry Envoy's `wasmcustom.` prefix: names are
/// matched wherever the filter's name appears in them.
pub fn parse(stats: &Value) -> Held {
    let mut held = Held::default();
    let entries = stats["stats"].as_array().map(Vec::as_slice).unwrap_or_default();
    for entry in entries {
        if let (Some(name), Some(value)) = (entry["name"].as_str(), entry["value"].as_u64()) {
            if let Some((_, tags)) = name.split_once(HELD) {
                let outcome = tags
                    .split(';')
                    .find_map(|t| t.trim_start_matches('.').strip_prefix("outcome="))
                    .unwrap_or("unknown");
                *held.outcomes.entry(outcome.to_string()).or_default() += value;
            }
        }
        let Some(histograms) = entry.get("histograms") else { continue };
        let quantiles: Vec<f64> = histograms["supported_quantiles"]
            .as_array()
            .map(|q| q.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        let computed = histograms["computed_quantiles"].as_array().map(Vec::as_slice).unwrap_or_default();
        for h in computed.iter().filter(|h| h["name"].as_str().is_some_and(|n| n.contains(HOLD_MS))) {
            let values = h["values"].as_array().map(Vec::as_slice).unwrap_or_default();
            let at = |q: f64| {
                let i = quantiles.iter().position(|x| (x - q).abs() < 1e-9)?;
                values.get(i)?["cumulative"].as_f64()
            };
            held.p50_ms = at(50.0);
            held.p99_ms = at(99.0);
            held.max_ms = at(100.0);
        }
    }
    held
}
