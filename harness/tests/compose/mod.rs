//! What the two tests of docker-compose.yml (`static_compose.rs`, `compose_as_processes.rs`)
//! share: readers of the file's values.

use std::collections::BTreeMap;

use serde_json::Value;

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Compose's `${NAME:-default}`, from `env` or the default.
pub fn interpolate(s: &str, env: &BTreeMap<&str, &str>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else { break };
        let inner = &rest[start + 2..start + end];
        let (name, default) = inner.split_once(":-").unwrap_or((inner, ""));
        out.push_str(env.get(name).copied().unwrap_or(default));
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}
