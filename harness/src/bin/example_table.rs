//! Prints the example routing table (`envoy-config/examples/table.json`): a control plane in the
//! middle of an upgrade, apiservers a and b still on the 1.33 era, c already on the 1.36 era.
//!
//! The fixtures are compiled in so that the output depends on nothing but this source tree:
//! `cargo run -q -p skewgate-harness --bin example-table > envoy-config/examples/table.json`

use anyhow::{Context, Result};
use skewgate_core::build::{ClusterNames, ServerApis, build_table};
use skewgate_core::discovery::{ApiGroupDiscoveryList, ApiResourceList, core_group_list};

const V1_33: &str =
    include_str!("../../../testdata/discovery/k8s-1.33-era_resource-v1beta2/aggregated_v2.json");
const V1_36: &str = include_str!("../../../testdata/discovery/k8s-1.36-era_resource-v1/aggregated_v2.json");
const API_V1: &str = include_str!("../../../testdata/discovery/legacy_core-v1/api__v1.json");

fn main() -> Result<()> {
    let core =
        core_group_list(&ApiResourceList::from_json(API_V1.as_bytes()).context("legacy /api/v1 fixture")?);
    let old = ApiGroupDiscoveryList::from_json(V1_33.as_bytes()).context("1.33-era /apis fixture")?;
    let new = ApiGroupDiscoveryList::from_json(V1_36.as_bytes()).context("1.36-era /apis fixture")?;
    let servers = [
        ServerApis {
            id: "a",
            version: "v1.33.0",
            documents: vec![&core, &old],
            legacy: None,
            features: None,
        },
        ServerApis {
            id: "b",
            version: "v1.33.0",
            documents: vec![&core, &old],
            legacy: None,
            features: None,
        },
        ServerApis {
            id: "c",
            version: "v1.36.0",
            documents: vec![&core, &new],
            legacy: None,
            features: None,
        },
    ];
    let table = build_table(&servers, &ClusterNames::default())?;
    println!("{}", serde_json::to_string_pretty(&table)?);
    Ok(())
}
