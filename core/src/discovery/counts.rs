//! Groups, group/versions and resources of an aggregated discovery body, counted without keeping
//! any of it. A body over `[limits]` is refused before it is parsed into documents: parsing a giant
//! one would grow the sidecar for good, since the allocator keeps much of what a parse frees.

use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub groups: usize,
    pub group_versions: usize,
    /// Top-level resources over all group/versions.
    pub resources: usize,
}

impl Counts {
    /// The counts of parsed documents, as [`count`] finds them in their bodies.
    pub fn of(lists: &[&super::ApiGroupDiscoveryList]) -> Counts {
        let groups = || lists.iter().flat_map(|l| &l.items);
        let versions = || groups().flat_map(|g| &g.versions);
        Counts {
            groups: groups().count(),
            group_versions: versions().count(),
            resources: versions().map(|v| v.resources.len()).sum(),
        }
    }
}

impl std::ops::Add for Counts {
    type Output = Counts;

    fn add(self, other: Counts) -> Counts {
        Counts {
            groups: self.groups + other.groups,
            group_versions: self.group_versions + other.group_versions,
            resources: self.resources + other.resources,
        }
    }
}

/// The counts of an `APIGroupDiscoveryList`; `None` when the body is not JSON of that shape
/// (a legacy document, garbage): the real parser says what is wrong with it.
pub fn count(body: &[u8]) -> Option<Counts> {
    let mut counts = Counts::default();
    let mut de = serde_json::Deserializer::from_slice(body);
    Level::List.deserialize_into(&mut de, &mut counts).ok()?;
    de.end().ok()?;
    Some(counts)
}

/// Where in the document a value is.
#[derive(Debug, Clone, Copy)]
enum Level {
    /// The list: `items` holds groups.
    List,
    /// A group: `versions` holds group/versions.
    Group,
    /// A group/version: `resources` holds resources.
    Version,
}

impl Level {
    /// The key whose value holds the next level down, and what each of its elements counts as.
    fn child(self) -> &'static str {
        match self {
            Level::List => "items",
            Level::Group => "versions",
            Level::Version => "resources",
        }
    }

    fn deserialize_into<'de, D: Deserializer<'de>>(self, de: D, counts: &mut Counts) -> Result<(), D::Error> {
        de.deserialize_any(Node { level: self, counts })
    }
}

/// An object of one level; `null` counts as empty, as Go reads it.
struct Node<'a> {
    level: Level,
    counts: &'a mut Counts,
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_unit<E: Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Key>()? {
            if key.0 == self.level.child() {
                map.next_value_seed(Children { level: self.level, counts: &mut *self.counts })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// The list under a level's child key: each element is counted, and groups and versions are
/// walked one level down.
struct Children<'a> {
    level: Level,
    counts: &'a mut Counts,
}

impl<'de> DeserializeSeed<'de> for Children<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Children<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_unit<E: Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let below = match self.level {
            Level::List => Some(Level::Group),
            Level::Group => Some(Level::Version),
            Level::Version => None,
        };
        loop {
            let more = match below {
                Some(level) => seq.next_element_seed(Child { level, counts: &mut *self.counts })?.is_some(),
                None => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                return Ok(());
            }
            match self.level {
                Level::List => self.counts.groups += 1,
                Level::Group => self.counts.group_versions += 1,
                Level::Version => self.counts.resources += 1,
            }
        }
    }
}

struct Child<'a> {
    level: Level,
    counts: &'a mut Counts,
}

impl<'de> DeserializeSeed<'de> for Child<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        self.level.deserialize_into(de, self.counts)
    }
}

/// An object key: one of the three that matter, or "" for any other.
struct Key(&'static str);

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl Visitor<'_> for KeyVisitor {
            type Value = Key;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }

            fn visit_str<E: Error>(self, key: &str) -> Result<Key, E> {
                let known = ["items", "versions", "resources"].into_iter().find(|k| *k == key);
                Ok(Key(known.unwrap_or("")))
            }
        }

        de.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::ApiGroupDiscoveryList;

    const APIS_136: &str =
        include_str!("../../../testdata/discovery/k8s-1.36-era_resource-v1/aggregated_v2.json");

    #[test]
    fn counts_agree_with_the_parsed_document() {
        let list = ApiGroupDiscoveryList::from_json(APIS_136.as_bytes()).unwrap();
        let versions = list.items.iter().map(|g| g.versions.len()).sum();
        let expected =
            Counts { groups: list.items.len(), group_versions: versions, resources: list.gvrs().count() };
        assert_eq!(count(APIS_136.as_bytes()), Some(expected));
        assert!(expected.groups > 20 && expected.resources > 80, "{expected:?}");
    }

    #[test]
    fn nulls_and_other_keys_count_as_nothing() {
        let body = br#"{"kind":"APIGroupDiscoveryList","items":[
            {"metadata":{"name":"a","items":[1,2]},"versions":null},
            {"versions":[{"version":"v1","resources":null},{"resources":[{"resource":"x","versions":[1]},{}]}]}
        ],"extra":{"items":[1]}}"#;
        assert_eq!(count(body), Some(Counts { groups: 2, group_versions: 2, resources: 2 }));
        assert_eq!(count(br#"{"items":null}"#), Some(Counts::default()));
    }

    #[test]
    fn what_is_not_an_aggregated_list_is_left_to_the_parser() {
        for body in [&b"[1]"[..], b"{\"items\":3}", b"{\"items\":[", b"not json", b"{} {}", b""] {
            assert_eq!(count(body), None, "{}", String::from_utf8_lossy(body));
        }
        // A legacy APIGroupList has no items: nothing to count, the walk has its own checks.
        assert_eq!(count(br#"{"kind":"APIGroupList","groups":[{"name":"a"}]}"#), Some(Counts::default()));
    }
}
