//! How a stand-in makes itself known to the cluster, as kube-apiserver does: its address in the
//! EndpointSlices of the `kubernetes` service in `default` (the lease endpoint reconciler) and
//! its identity Lease in `kube-system` (docs/upstream-facts.md, "Peer identity and endpoints"). Gone again on a graceful stop; a killed
//! stand-in stays published, as a killed kube-apiserver does until its leases expire.
//!
//! An EndpointSlice has one port list for all its endpoints. Real apiservers share one port on
//! their own addresses, so `kubernetes` lists them all; stand-ins share 127.0.0.1 on their own
//! ports, so each port gets its slice: `kubernetes` for the port of the first stand-in that
//! published, `kubernetes-<port>` for the others, every one labelled
//! `kubernetes.io/service-name=kubernetes`, which is how EndpointSlice consumers find them all.
//! Each endpoint's `hostname` is the stand-in's id.

use std::net::SocketAddr;

use serde_json::{Value, json};

use super::clock;
use super::status::Status;
use super::store::{Key, Write};
use super::store_handle::StoreHandle;

const SLICE_GROUP: &str = "discovery.k8s.io";
const LEASE_GROUP: &str = "coordination.k8s.io";
const SERVICE: &str = "kubernetes";

/// The name of a stand-in's identity Lease: `apiserver-<hash of its id>`, stable across restarts.
pub fn lease_name(id: &str) -> String {
    let hash =
        id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("apiserver-{hash:016x}")
}

fn slice_key(name: &str) -> Key {
    Key::new(SLICE_GROUP, "endpointslices", "default", name)
}

fn endpoint(id: &str, addr: SocketAddr) -> Value {
    json!({"addresses": [addr.ip().to_string()], "conditions": {"ready": true, "serving": true, "terminating": false},
           "hostname": id})
}

fn slice_port(slice: &Value) -> Option<u64> {
    slice["ports"][0]["port"].as_u64()
}

fn new_slice(name: &str, addr: SocketAddr) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": clock::now_rfc3339(),
            "generation": 1,
            "labels": {"kubernetes.io/service-name": SERVICE, "endpointslice.kubernetes.io/managed-by": "endpointslicemirroring-controller.k8s.io"},
        },
        "addressType": if addr.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [],
        "ports": [{"name": "https", "port": addr.port(), "protocol": "TCP"}],
    })
}

/// The slice a stand-in at `addr` belongs in.
fn slice_name(store: &StoreHandle, addr: SocketAddr) -> Result<String, Status> {
    let main = store.get(&slice_key(SERVICE))?;
    Ok(match main.as_deref().and_then(slice_port) {
        Some(port) if port != u64::from(addr.port()) => format!("{SERVICE}-{}", addr.port()),
        _ => SERVICE.to_owned(),
    })
}

/// Puts `id` at `addr` into its slice and writes its identity Lease.
pub fn publish(store: &StoreHandle, id: &str, addr: SocketAddr) -> Result<(), Status> {
    let name = slice_name(store, addr)?;
    store.write(&slice_key(&name), Some("default"), false, |current| {
        let mut slice = current.map_or_else(|| new_slice(&name, addr), |c| (**c).clone());
        let entry = endpoint(id, addr);
        let endpoints = slice["endpoints"].as_array_mut();
        let Some(endpoints) = endpoints else { return Ok(Write::Unchanged) };
        endpoints.retain(|e| e["hostname"] != id);
        endpoints.push(entry);
        Ok(Write::Put(slice))
    })?;
    let lease = lease_name(id);
    let now = clock::now_rfc3339();
    store.write(&Key::new(LEASE_GROUP, "leases", "kube-system", &lease), Some("kube-system"), false, |_| {
        Ok(Write::Put(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": lease,
                "namespace": "kube-system",
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": clock::now_rfc3339(),
                "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": id},
                "annotations": {"skewgate.io/address": addr.to_string()},
            },
            "spec": {
                "holderIdentity": format!("{lease}_{}", uuid::Uuid::new_v4()),
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
            },
        })))
    })?;
    Ok(())
}

/// Takes `id` out of every slice (deleting a slice left empty, but `kubernetes`) and deletes
/// its Lease.
pub fn unpublish(store: &StoreHandle, id: &str, addr: SocketAddr) -> Result<(), Status> {
    let name = slice_name(store, addr)?;
    store.write(&slice_key(&name), Some("default"), false, |current| {
        let Some(current) = current else { return Ok(Write::Unchanged) };
        let mut slice = (**current).clone();
        let Some(endpoints) = slice["endpoints"].as_array_mut() else { return Ok(Write::Unchanged) };
        let before = endpoints.len();
        endpoints.retain(|e| e["hostname"] != id);
        Ok(match (endpoints.len(), before) {
            (after, before) if after == before => Write::Unchanged,
            (0, _) if name != SERVICE => Write::Delete,
            _ => Write::Put(slice),
        })
    })?;
    store.write(
        &Key::new(LEASE_GROUP, "leases", "kube-system", &lease_name(id)),
        None,
        false,
        |current| Ok(if current.is_some() { Write::Delete } else { Write::Unchanged }),
    )?;
    Ok(())
}
