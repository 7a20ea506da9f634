//! Merge of several orderings of names into one, as upstream's
//! `k8s.io/apimachinery/pkg/util/sort.MergePreservingRelativeOrder`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// Merges `lists` into one list holding every distinct name once, keeping every
/// "x comes before y" seen in any list; names with no such constraint between them come out in
/// lexicographic order.
///
/// * If one list already holds every distinct name exactly once, it is returned as is (the first
///   such list wins), even where another list orders two names the other way.
/// * If the lists contradict each other (a cycle, including a name repeated back to back) and no
///   list qualifies for the rule above, no order can satisfy them all; like upstream, the result
///   is then every distinct name in lexicographic order.
pub fn merge_preserving_relative_order<L, S>(lists: &[L]) -> Vec<String>
where
    L: AsRef<[S]>,
    S: AsRef<str>,
{
    let graph = PrecedenceGraph::from_lists(lists);
    if let Some(complete) = first_complete_list(lists, graph.len()) {
        return complete;
    }
    graph.topological_order().unwrap_or_else(|| graph.names_sorted())
}

fn first_complete_list<L, S>(lists: &[L], distinct_count: usize) -> Option<Vec<String>>
where
    L: AsRef<[S]>,
    S: AsRef<str>,
{
    lists
        .iter()
        .map(AsRef::as_ref)
        .find(|list| list.len() == distinct_count && has_no_duplicates(list))
        .map(|list| list.iter().map(|name| name.as_ref().to_owned()).collect())
}

fn has_no_duplicates<S: AsRef<str>>(list: &[S]) -> bool {
    let mut seen = BTreeSet::new();
    list.iter().all(|name| seen.insert(name.as_ref()))
}

/// Edge x → y for every adjacent pair (x, y) of any list.
struct PrecedenceGraph<'a> {
    nodes: BTreeMap<&'a str, Node<'a>>,
}

#[derive(Default)]
struct Node<'a> {
    successors: BTreeSet<&'a str>,
    predecessor_count: usize,
}

impl<'a> PrecedenceGraph<'a> {
    fn from_lists<L, S>(lists: &'a [L]) -> Self
    where
        L: AsRef<[S]>,
        S: AsRef<str> + 'a,
    {
        let mut graph = PrecedenceGraph { nodes: BTreeMap::new() };
        for list in lists {
            let names: Vec<&'a str> = list.as_ref().iter().map(AsRef::as_ref).collect();
            for name in &names {
                graph.nodes.entry(name).or_default();
            }
            for pair in names.windows(2) {
                if let [before, after] = pair {
                    graph.add_edge(before, after);
                }
            }
        }
        graph
    }

    fn add_edge(&mut self, before: &'a str, after: &'a str) {
        let is_new = self.nodes.get_mut(before).is_some_and(|node| node.successors.insert(after));
        // Counting a repeated edge twice would leave `after` waiting forever.
        if !is_new {
            return;
        }
        if let Some(node) = self.nodes.get_mut(after) {
            node.predecessor_count += 1;
        }
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Kahn's algorithm, always taking the smallest ready name; `None` on a cycle.
    fn topological_order(&self) -> Option<Vec<String>> {
        let mut waiting_on: BTreeMap<&str, usize> =
            self.nodes.iter().map(|(name, node)| (*name, node.predecessor_count)).collect();
        let mut ready: BinaryHeap<Reverse<&str>> =
            waiting_on.iter().filter(|(_, count)| **count == 0).map(|(name, _)| Reverse(*name)).collect();
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some(Reverse(name)) = ready.pop() {
            order.push(name.to_owned());
            for successor in self.successors(name) {
                if let Some(count) = waiting_on.get_mut(successor) {
                    *count = count.saturating_sub(1);
                    if *count == 0 {
                        ready.push(Reverse(successor));
                    }
                }
            }
        }
        (order.len() == self.nodes.len()).then_some(order)
    }

    fn successors(&self, name: &str) -> impl Iterator<Item = &'a str> + '_ {
        self.nodes.get(name).into_iter().flat_map(|node| node.successors.iter().copied())
    }

    fn names_sorted(&self) -> Vec<String> {
        self.nodes.keys().map(|name| (*name).to_owned()).collect()
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn merge(lists: &[&[&str]]) -> Vec<String> {
        merge_preserving_relative_order(lists)
    }

    // The cases of upstream's sort_test.go, as data.
    #[test]
    fn consensus_ordering() {
        let lists: &[&[&str]] =
            &[&["A", "B", "C", "D"], &["A", "B", "C", "D"], &["A", "X", "Z", "D"], &["Z", "Y"], &["Q"]];
        assert_eq!(merge(lists), ["A", "B", "C", "Q", "X", "Z", "D", "Y"]);
    }

    #[test]
    fn empty_inputs_give_an_empty_list() {
        assert!(merge(&[]).is_empty());
        assert!(merge(&[&[], &[], &[]]).is_empty());
    }

    #[test]
    fn a_single_list_is_kept() {
        assert_eq!(merge(&[&["foo", "bar", "baz"]]), ["foo", "bar", "baz"]);
    }

    #[test]
    fn an_empty_list_adds_nothing() {
        assert_eq!(merge(&[&[], &["A", "B", "C"]]), ["A", "B", "C"]);
    }

    #[test]
    fn unconstrained_names_come_out_lexicographically() {
        assert_eq!(merge(&[&["C", "D", "E"], &["B", "D", "E"], &["A", "D", "E"]]), ["A", "B", "C", "D", "E"]);
        assert_eq!(merge(&[&["A", "D", "E"], &["A", "C", "E"], &["A", "B", "E"]]), ["A", "B", "C", "D", "E"]);
        assert_eq!(merge(&[&["z", "m"], &["b", "m"]]), ["b", "z", "m"]);
    }

    #[test]
    fn a_list_holding_every_name_is_returned_as_is() {
        assert_eq!(merge(&[&["a", "b", "c"], &["b", "c"]]), ["a", "b", "c"]);
        // Even though the other list contradicts it, and even though it is not lexicographic.
        assert_eq!(merge(&[&["b"], &["c", "b", "a"], &["a", "b"]]), ["c", "b", "a"]);
    }

    #[test]
    fn the_first_complete_list_wins() {
        assert_eq!(merge(&[&["B", "A"], &["A", "B"]]), ["B", "A"]);
        assert_eq!(merge(&[&["A", "B"], &["B", "A"]]), ["A", "B"]);
    }

    #[test]
    fn a_complete_list_with_duplicates_does_not_qualify() {
        // ["b","a","b"] has the right length only by repeating "b"; no shortcut, and the
        // edges b→a→b form a cycle.
        assert_eq!(merge(&[&["b", "a", "b"], &["c"]]), ["a", "b", "c"]);
    }

    #[test]
    fn cycles_fall_back_to_lexicographic_order() {
        assert_eq!(merge(&[&["A", "B"], &["B", "C"], &["C", "A"]]), ["A", "B", "C"]);
        assert_eq!(merge(&[&["A", "B"], &["C", "D"], &["B", "A"]]), ["A", "B", "C", "D"]);
        assert_eq!(merge(&[&["z", "z"]]), ["z"]);
    }

    #[test]
    fn large_cycle_terminates() {
        let forward: Vec<String> = (0..500).map(|i| format!("n{i:03}")).collect();
        let mut backward = forward.clone();
        backward.reverse();
        let partial_forward = forward[..499].to_vec();
        let partial_backward = backward[..499].to_vec();
        let merged = merge_preserving_relative_order(&[partial_forward, partial_backward]);
        assert_eq!(merged, forward);
    }

    #[test]
    fn accepts_owned_strings() {
        let lists = vec![vec!["v1".to_owned(), "v1beta1".to_owned()], vec!["v2".to_owned(), "v1".to_owned()]];
        assert_eq!(merge_preserving_relative_order(&lists), ["v2", "v1", "v1beta1"]);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod prop {
    use proptest::prelude::*;

    use super::merge_preserving_relative_order;

    /// A hidden total order of `n` names and several lists that are subsequences of it, so that
    /// the lists never contradict each other.
    fn consistent_lists() -> impl Strategy<Value = Vec<Vec<String>>> {
        (1usize..14).prop_flat_map(|n| {
            let names: Vec<String> = (0..n).map(|i| format!("g{i:02}")).collect();
            (Just(names).prop_shuffle(), prop::collection::vec(prop::collection::vec(any::<bool>(), n), 1..6))
                .prop_map(|(order, masks)| {
                    masks
                        .iter()
                        .map(|mask| {
                            order
                                .iter()
                                .zip(mask)
                                .filter(|(_, keep)| **keep)
                                .map(|(name, _)| name.clone())
                                .collect()
                        })
                        .collect()
                })
        })
    }

    /// Every name of every list, once, sorted: what a merge must hold.
    fn distinct_names(lists: &[Vec<String>]) -> Vec<&String> {
        let mut names: Vec<&String> = lists.iter().flatten().collect();
        names.sort();
        names.dedup();
        names
    }

    fn position(merged: &[String], name: &str) -> Option<usize> {
        merged.iter().position(|candidate| candidate == name)
    }

    proptest! {
        #[test]
        fn every_name_appears_exactly_once(lists in consistent_lists()) {
            let merged = merge_preserving_relative_order(&lists);
            let mut got: Vec<&String> = merged.iter().collect();
            got.sort();
            prop_assert_eq!(got, distinct_names(&lists));
        }

        #[test]
        fn every_input_order_is_kept(lists in consistent_lists()) {
            let merged = merge_preserving_relative_order(&lists);
            for list in &lists {
                for pair in list.windows(2) {
                    let positions = (position(&merged, &pair[0]), position(&merged, &pair[1]));
                    prop_assert!(
                        matches!(positions, (Some(before), Some(after)) if before < after),
                        "{:?} lost the order of {:?} in {:?}", lists, pair, merged
                    );
                }
            }
        }

        #[test]
        fn consistent_lists_merge_the_same_in_any_order(lists in consistent_lists()) {
            let mut reversed = lists.clone();
            reversed.reverse();
            prop_assert_eq!(
                merge_preserving_relative_order(&lists),
                merge_preserving_relative_order(&reversed)
            );
        }

        #[test]
        fn arbitrary_lists_never_panic_and_cover_every_name(
            lists in prop::collection::vec(prop::collection::vec("[a-e]", 0..6), 0..5)
        ) {
            let merged = merge_preserving_relative_order(&lists);
            let mut got: Vec<&String> = merged.iter().collect();
            got.sort();
            got.dedup();
            prop_assert_eq!(got.len(), merged.len(), "duplicates in {:?}", merged);
            prop_assert_eq!(got, distinct_names(&lists));
        }
    }
}
