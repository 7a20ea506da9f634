//! Merging one OpenAPI document per apiserver into the one the edge serves (docs/openapi.md).
//!
//! Inputs come in priority order (newest API level first, then server-ID order; see
//! the composer's priority). The rule, for v3 group/version documents and for v2 alike:
//! - every input identical: that document, bytes and hash unchanged;
//! - one input covers every other (each path, and each schema/definition name, of every input is
//!   in it): the first such input, unchanged — clients then get a document an apiserver wrote;
//! - otherwise a merge: the first input's document with the paths and every `components` map (v3)
//!   or `paths`, `definitions`, `parameters`, `responses`, `securityDefinitions` (v2) of the
//!   others added, first-seen wins on a name conflict. First-seen is the newest API level: a
//!   served API version's schema only gains fields from one release to the next (Kubernetes' API
//!   compatibility rules), so the newest one's schema is the one that describes every field any
//!   apiserver accepts.

use serde_json::{Map, Value};

/// The maps that are unioned by name.
const V3_MAPS: &[&[&str]] = &[
    &["paths"],
    &["components", "schemas"],
    &["components", "responses"],
    &["components", "parameters"],
    &["components", "requestBodies"],
    &["components", "headers"],
    &["components", "securitySchemes"],
];
const V2_MAPS: &[&[&str]] =
    &[&["paths"], &["definitions"], &["parameters"], &["responses"], &["securityDefinitions"]];

/// Which OpenAPI a document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    V2,
    V3,
}

impl Flavor {
    fn maps(self) -> &'static [&'static [&'static str]] {
        match self {
            Flavor::V2 => V2_MAPS,
            Flavor::V3 => V3_MAPS,
        }
    }
}

/// How the merged document came about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Input `index` as it is (identical to the others, or covering them).
    Input(usize),
    /// A union of the inputs.
    Merged(Value),
}

/// The document for `inputs` (priority order, at least one). Only `Merged` allocates a new
/// document.
pub fn merge(flavor: Flavor, inputs: &[&Value]) -> Outcome {
    if let Some(cover) = (0..inputs.len()).find(|&i| covers(flavor, inputs[i], inputs)) {
        return Outcome::Input(cover);
    }
    let Some((first, rest)) = inputs.split_first() else { return Outcome::Merged(Value::Null) };
    let mut merged = (*first).clone();
    for input in rest {
        for path in flavor.maps() {
            let Some(from) = lookup(input, path) else { continue };
            let Some(into) = lookup_mut(&mut merged, path) else { continue };
            for (name, value) in from {
                if !into.contains_key(name) {
                    into.insert(name.clone(), value.clone());
                }
            }
        }
    }
    Outcome::Merged(merged)
}

/// Whether `doc` has every name of every unioned map of every input.
fn covers(flavor: Flavor, doc: &Value, inputs: &[&Value]) -> bool {
    flavor.maps().iter().all(|path| {
        let have = lookup(doc, path);
        inputs.iter().all(|other| match lookup(other, path) {
            None => true,
            Some(names) => names.keys().all(|n| have.is_some_and(|h| h.contains_key(n))),
        })
    })
}

fn lookup<'v>(doc: &'v Value, path: &[&str]) -> Option<&'v Map<String, Value>> {
    path.iter().try_fold(doc, |v, key| v.get(key))?.as_object()
}

/// The map at `path`, created (with any missing parent) when the document lacks it.
fn lookup_mut<'v>(doc: &'v mut Value, path: &[&str]) -> Option<&'v mut Map<String, Value>> {
    let mut at = doc;
    for key in path {
        let object = at.as_object_mut()?;
        at = object.entry(key.to_string()).or_insert_with(|| Value::Object(Map::new()));
    }
    at.as_object_mut()
}

/// Names in the unioned maps of `doc`, as `map/name` (for tests and `skewgate explain`).
pub fn names(flavor: Flavor, doc: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for path in flavor.maps() {
        if let Some(map) = lookup(doc, path) {
            out.extend(map.keys().map(|k| format!("{}/{k}", path.join("."))));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn doc(paths: &[&str], schemas: &[(&str, i64)]) -> Value {
        let paths: Map<String, Value> = paths.iter().map(|p| (p.to_string(), json!({}))).collect();
        let schemas: Map<String, Value> = schemas.iter().map(|(n, v)| (n.to_string(), json!(v))).collect();
        json!({"openapi": "3.0.0", "paths": paths, "components": {"schemas": schemas}})
    }

    #[test]
    fn identical_and_covering_inputs_are_kept() {
        let a = doc(&["/a"], &[("A", 1)]);
        assert_eq!(merge(Flavor::V3, &[&a, &a]), Outcome::Input(0));
        let b = doc(&["/a", "/b"], &[("A", 2), ("B", 2)]);
        assert_eq!(merge(Flavor::V3, &[&a, &b]), Outcome::Input(1));
    }

    #[test]
    fn union_first_seen_wins() {
        let a = doc(&["/a"], &[("A", 1), ("S", 1)]);
        let b = doc(&["/b"], &[("B", 2), ("S", 2)]);
        let Outcome::Merged(m) = merge(Flavor::V3, &[&a, &b]) else { panic!("not merged") };
        assert_eq!(m, doc(&["/a", "/b"], &[("A", 1), ("B", 2), ("S", 1)]));
        let Outcome::Merged(m) = merge(Flavor::V3, &[&b, &a]) else { panic!("not merged") };
        assert_eq!(m["components"]["schemas"]["S"], json!(2));
        // Idempotent: the merge covers its inputs.
        assert_eq!(merge(Flavor::V3, &[&m, &a, &b]), Outcome::Input(0));
    }

    #[test]
    fn v2_definitions_are_unioned() {
        let a = json!({"swagger": "2.0", "paths": {"/a": {}}, "definitions": {"A": {}}});
        let b = json!({"swagger": "2.0", "paths": {"/b": {}}, "definitions": {"B": {}}});
        let Outcome::Merged(m) = merge(Flavor::V2, &[&a, &b]) else { panic!("not merged") };
        assert_eq!(names(Flavor::V2, &m), ["paths//a", "paths//b", "definitions/A", "definitions/B"]);
    }
}

#[cfg(test)]
mod prop {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// A v3 document with some of 6 paths and 6 schemas, each valued by its document number.
    fn doc(n: i64) -> impl Strategy<Value = Value> {
        (proptest::collection::btree_set(0..6u8, 0..6), proptest::collection::btree_set(0..6u8, 0..6)).prop_map(
            move |(paths, schemas)| {
                let paths: Map<String, Value> = paths.iter().map(|p| (format!("/p{p}"), json!(n))).collect();
                let schemas: Map<String, Value> = schemas.iter().map(|s| (format!("S{s}"), json!(n))).collect();
                json!({"openapi": "3.0.0", "info": {"n": n}, "paths": paths, "components": {"schemas": schemas}})
            },
        )
    }

    fn docs() -> impl Strategy<Value = Vec<Value>> {
        (1..5usize).prop_flat_map(|len| (0..len as i64).map(doc).collect::<Vec<_>>())
    }

    fn result(inputs: &[Value]) -> Value {
        let refs: Vec<&Value> = inputs.iter().collect();
        match merge(Flavor::V3, &refs) {
            Outcome::Input(i) => inputs[i].clone(),
            Outcome::Merged(v) => v,
        }
    }

    proptest! {
        #[test]
        fn superset_first_seen_idempotent(inputs in docs()) {
            let merged = result(&inputs);
            let have: std::collections::BTreeSet<String> = names(Flavor::V3, &merged).into_iter().collect();
            for input in &inputs {
                for name in names(Flavor::V3, input) {
                    prop_assert!(have.contains(&name), "{name}");
                }
            }
            // Each name carries the value of the first input that has it, unless one input
            // covering all others is served whole.
            let covering = (0..inputs.len()).find(|&i| covers(Flavor::V3, &inputs[i], &inputs.iter().collect::<Vec<_>>()));
            for (map, key) in [("paths", None), ("components", Some("schemas"))] {
                let at = |v: &Value| match key { Some(k) => v[map][k].clone(), None => v[map].clone() };
                for (name, value) in at(&merged).as_object().cloned().unwrap_or_default() {
                    let expected = match covering {
                        Some(i) => at(&inputs[i])[&name].clone(),
                        None => inputs.iter().map(at).find(|m| m.get(&name).is_some()).map(|m| m[&name].clone()).unwrap_or_default(),
                    };
                    prop_assert_eq!(value, expected);
                }
            }
            let mut again = vec![merged.clone()];
            again.extend(inputs.iter().cloned());
            prop_assert_eq!(result(&again), merged);
        }
    }
}
