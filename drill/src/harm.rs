//! What controllers did with what they were told during the upgrade, counted from what etcd
//! holds afterwards: dependents the garbage collector deleted although their owner is still
//! there, objects left under a namespace the namespace controller finalized, namespaces still
//! terminating; and the controller-manager's errors, grouped. Pure: the drill gathers a
//! [`Census`] through a direct connection and the controller-manager's log, this counts.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// An owner and the dependent created with an `ownerReference` to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnedSet {
    /// The owner's kind (`ResourceClaim`, `ConfigMap`).
    pub owner_kind: String,
    pub owner: Object,
    pub dependent: Object,
}

/// An object as etcd holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Object {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A namespace the workload deleted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Deleted {
    pub name: String,
    /// Seconds into the load when it was deleted: which step of the upgrade it fell in.
    pub at: f64,
    /// Seconds from the DELETE to the namespace's GET answering 404 (`None`: not seen gone).
    pub took: Option<f64>,
}

/// What etcd holds after the upgrade, read straight from an apiserver serving every kind
/// involved, and what the workload did.
#[derive(Debug, Clone, Default)]
pub struct Census {
    pub sets: Vec<OwnedSet>,
    pub deleted: Vec<Deleted>,
    /// Every object of the kinds involved, in every namespace.
    pub objects: Vec<Object>,
    /// Every namespace that exists (terminating ones included).
    pub namespaces: BTreeSet<String>,
}

/// The harm counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Harm {
    /// Owner kind → sets created.
    pub sets: BTreeMap<String, usize>,
    /// Owner kind → dependents gone while their owner (same uid) is still there.
    pub wrongly_collected: BTreeMap<String, usize>,
    /// Kind → objects under a namespace the workload deleted and that no longer exists.
    pub left_behind: BTreeMap<String, usize>,
    pub namespaces_deleted: usize,
    /// Deleted namespaces that still exist.
    pub stuck: Vec<String>,
    /// Seconds each deleted namespace took to go.
    pub deletion_seconds: Vec<f64>,
    /// Every deleted namespace, with when and how long.
    pub deleted: Vec<Deleted>,
}

impl Harm {
    pub fn wrongly_collected_total(&self) -> usize {
        self.wrongly_collected.values().sum()
    }

    pub fn left_behind_total(&self) -> usize {
        self.left_behind.values().sum()
    }

    /// The deletion that took longest, of those seen done.
    pub fn slowest(&self) -> Option<&Deleted> {
        let took = |d: &&Deleted| d.took.unwrap_or_default();
        self.deleted.iter().filter(|d| d.took.is_some()).max_by(|a, b| took(a).total_cmp(&took(b)))
    }
}

pub fn count(census: &Census) -> Harm {
    let present: BTreeSet<(&str, &str, &str)> =
        census.objects.iter().map(|o| (o.kind.as_str(), o.namespace.as_str(), o.uid.as_str())).collect();
    let there = |o: &Object| present.contains(&(o.kind.as_str(), o.namespace.as_str(), o.uid.as_str()));
    let mut harm = Harm::default();
    for set in &census.sets {
        *harm.sets.entry(set.owner_kind.clone()).or_default() += 1;
        let wrong = harm.wrongly_collected.entry(set.owner_kind.clone()).or_default();
        if there(&set.owner) && !there(&set.dependent) {
            *wrong += 1;
        }
    }
    let gone: BTreeSet<&str> =
        census.deleted.iter().map(|d| d.name.as_str()).filter(|n| !census.namespaces.contains(*n)).collect();
    for o in census.objects.iter().filter(|o| gone.contains(o.namespace.as_str())) {
        *harm.left_behind.entry(o.kind.clone()).or_default() += 1;
    }
    harm.namespaces_deleted = census.deleted.len();
    harm.stuck = census
        .deleted
        .iter()
        .filter(|d| census.namespaces.contains(&d.name))
        .map(|d| d.name.clone())
        .collect();
    harm.deletion_seconds = census.deleted.iter().filter_map(|d| d.took).collect();
    harm.deleted = census.deleted.clone();
    harm
}

/// The error lines of a klog log (`E1127 12:34:56.789012  4242 file.go:12] …`), grouped by what
/// they say: the structured message, with the start of its `err=` value, each run of digits blanked so that
/// the same error about different objects falls into one group.
pub fn errors(log: &str) -> BTreeMap<String, usize> {
    let mut groups = BTreeMap::new();
    for line in log.lines() {
        let bytes = line.as_bytes();
        let klog_error =
            bytes.first() == Some(&b'E') && bytes.len() > 5 && bytes[1..5].iter().all(u8::is_ascii_digit);
        let Some((_, said)) = line.split_once("] ").filter(|_| klog_error) else { continue };
        *groups.entry(error_group(said)).or_default() += 1;
    }
    groups
}

fn error_group(said: &str) -> String {
    let message = match said.strip_prefix('"') {
        Some(rest) => rest.split('"').next().unwrap_or_default(),
        None => said,
    };
    let err = said.split_once(" err=\"").map(|(_, e)| e.split('"').next().unwrap_or_default());
    let text = match err {
        Some(err) => format!("{message}: {err}"),
        None => message.to_string(),
    };
    let mut blanked = String::new();
    for c in text.chars().take(120) {
        match c.is_ascii_digit() {
            true if blanked.ends_with('#') => {}
            true => blanked.push('#'),
            false => blanked.push(c),
        }
    }
    blanked
}
