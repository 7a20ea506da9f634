//! When the sidecar fetches, asks the cluster, saves and pushes: the sync loop's rules as plain
//! data. The loop feeds in every event with the time it saw it and carries out the commands that
//! come back; nothing here waits, spawns or touches the network, so every rule is a unit test.
//!
//! The rules:
//! - one full fetch, one look at the cluster and one push at a time;
//! - every poll fetches every member and asks the cluster; every fetch ends in a push, changed
//!   or not (its report says the sync ran);
//! - a member's changed discovery (fetched or probed) is saved and pushed at once, but when the
//!   cluster's CRD- and APIService-backed group/versions are listed, the push waits for a listing
//!   that started after the change: a new CRD shows in discovery before the listing names it,
//!   and a table built in between would route it to the servers that list it so far;
//! - a member that joins is probed from then on, handed to the OpenAPI composer and fetched at
//!   once (or right after the fetch under way, which started without it); one that leaves is no
//!   longer probed; a change of members or extensions is pushed.

use tokio::time::Instant;

/// What the loop saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The loop started with these members.
    Started { members: Vec<String> },
    /// The poll period elapsed.
    Poll,
    /// The fetch of [`Command::Fetch`] was recorded; `changed`: some member's documents changed.
    Fetched { changed: bool },
    /// A probe of one member that started at `started` was recorded.
    Looked { started: Instant, changed: bool },
    /// The look at the cluster of [`Command::Ask`] was taken in (`None`: it failed).
    Asked(Option<Membership>),
    /// The push of [`Command::Push`] ended: pushed, unchanged or failed, or it could not start.
    Pushed,
}

/// What a look at the cluster changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    pub joined: Vec<String>,
    pub left: Vec<String>,
    /// Whether the table must be built again (members or extensions changed).
    pub changed: bool,
}

/// What the loop is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Fetch every member's discovery in full; its records count from `started`.
    Fetch { started: Instant },
    /// Look at the cluster for its apiservers and extensions.
    Ask,
    /// Save the members' last good documents for the next sidecar.
    Save,
    /// Keep a connection open to this member and probe it.
    Tether(String),
    /// Stop probing this member: it left.
    Untether(String),
    /// Hand the OpenAPI composer the current members.
    Recompose,
    /// Build the table from what is remembered and push it; `since`: the look that made a push
    /// wanted, for the report's `took`.
    Push { since: Instant },
}

/// How the sidecar follows its cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cluster {
    /// It asks the cluster for its apiservers (`cluster.members` other than static).
    pub asks: bool,
    /// It lists CRD- and APIService-backed group/versions (`cluster.extensions`).
    pub lists_extensions: bool,
}

#[derive(Debug)]
pub struct Scheduler {
    cluster: Cluster,
    /// When the fetch under way started.
    fetching: Option<Instant>,
    /// A member joined after the fetch under way started: fetch again when it ends.
    fetch_again: bool,
    /// When the look at the cluster under way started.
    asking: Option<Instant>,
    ask_wanted: bool,
    pushing: bool,
    /// Since when what is remembered differs from the table being pushed or live.
    push_wanted: Option<Instant>,
    /// A discovery change seen since then waits for a listing of extensions that started after.
    extensions_wanted: Option<Instant>,
}

impl Scheduler {
    pub fn new(cluster: Cluster) -> Self {
        let cluster = Cluster { lists_extensions: cluster.asks && cluster.lists_extensions, ..cluster };
        Self {
            cluster,
            fetching: None,
            fetch_again: false,
            asking: None,
            ask_wanted: false,
            pushing: false,
            push_wanted: None,
            extensions_wanted: None,
        }
    }

    /// Takes in what the loop saw at `now` and returns what it is to do, in order.
    pub fn on(&mut self, now: Instant, event: Event) -> Vec<Command> {
        let mut commands = Vec::new();
        match event {
            Event::Started { members } => commands.extend(members.into_iter().map(Command::Tether)),
            Event::Poll => {
                self.ask_wanted = true;
                self.fetch(now, &mut commands);
            }
            Event::Fetched { changed } => {
                let started = self.fetching.take().unwrap_or(now);
                if changed {
                    commands.push(Command::Save);
                    self.wait_for_extensions(started);
                }
                self.push_wanted.get_or_insert(started);
                if std::mem::take(&mut self.fetch_again) {
                    self.fetch(now, &mut commands);
                }
            }
            Event::Looked { started, changed } => {
                if changed {
                    commands.push(Command::Save);
                    self.wait_for_extensions(started);
                    self.push_wanted.get_or_insert(started);
                }
            }
            Event::Asked(membership) => {
                let started = self.asking.take().unwrap_or(now);
                if self.extensions_wanted.is_some_and(|since| since <= started) {
                    self.extensions_wanted = None;
                }
                if let Some(Membership { joined, left, changed }) = membership {
                    let moved = !joined.is_empty() || !left.is_empty();
                    commands.extend(left.into_iter().map(Command::Untether));
                    let joined_any = !joined.is_empty();
                    commands.extend(joined.into_iter().map(Command::Tether));
                    if moved {
                        commands.push(Command::Recompose);
                    }
                    if joined_any {
                        match self.fetching {
                            Some(_) => self.fetch_again = true,
                            None => self.fetch(now, &mut commands),
                        }
                    }
                    if changed {
                        self.push_wanted.get_or_insert(started);
                    }
                }
            }
            Event::Pushed => self.pushing = false,
        }
        // A look wanted while one is under way is taken once that one ends.
        if self.ask_wanted && self.asking.is_none() {
            self.ask_wanted = false;
            if self.cluster.asks {
                self.asking = Some(now);
                commands.push(Command::Ask);
            }
        }
        if !self.pushing && self.extensions_wanted.is_none() {
            if let Some(since) = self.push_wanted.take() {
                self.pushing = true;
                commands.push(Command::Push { since });
            }
        }
        commands
    }

    fn fetch(&mut self, now: Instant, commands: &mut Vec<Command>) {
        if self.fetching.is_none() {
            self.fetching = Some(now);
            commands.push(Command::Fetch { started: now });
        }
    }

    fn wait_for_extensions(&mut self, since: Instant) {
        if self.cluster.lists_extensions {
            self.extensions_wanted.get_or_insert(since);
            self.ask_wanted = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A scheduler and a clock: `at(n)` is n seconds after the start.
    struct Run {
        s: Scheduler,
        t0: Instant,
    }

    impl Run {
        fn new(asks: bool, lists_extensions: bool) -> Self {
            Self { s: Scheduler::new(Cluster { asks, lists_extensions }), t0: Instant::now() }
        }

        fn at(&self, seconds: u64) -> Instant {
            self.t0 + Duration::from_secs(seconds)
        }

        fn on(&mut self, seconds: u64, event: Event) -> Vec<Command> {
            let now = self.at(seconds);
            self.s.on(now, event)
        }
    }

    fn fetch(run: &Run, seconds: u64) -> Command {
        Command::Fetch { started: run.at(seconds) }
    }

    fn push(run: &Run, seconds: u64) -> Command {
        Command::Push { since: run.at(seconds) }
    }

    fn joined(ids: &[&str]) -> Event {
        let joined = ids.iter().map(|id| id.to_string()).collect();
        Event::Asked(Some(Membership { joined, left: Vec::new(), changed: true }))
    }

    #[test]
    fn every_member_is_probed_from_the_start() {
        let mut run = Run::new(false, false);
        let commands = run.on(0, Event::Started { members: vec!["a".into(), "b".into()] });
        assert_eq!(commands, [Command::Tether("a".into()), Command::Tether("b".into())]);
    }

    #[test]
    fn one_fetch_at_a_time_and_every_fetch_ends_in_a_push() {
        let mut run = Run::new(false, false);
        assert_eq!(run.on(0, Event::Poll), [fetch(&run, 0)]);
        assert_eq!(run.on(5, Event::Poll), [], "the first fetch is still under way");
        assert_eq!(run.on(6, Event::Fetched { changed: false }), [push(&run, 0)], "unchanged, pushed anyway");
        assert_eq!(run.on(10, Event::Poll), [fetch(&run, 10)]);
    }

    #[test]
    fn a_changed_fetch_is_saved_then_pushed() {
        let mut run = Run::new(false, false);
        run.on(0, Event::Poll);
        assert_eq!(run.on(1, Event::Fetched { changed: true }), [Command::Save, push(&run, 0)]);
    }

    #[test]
    fn a_changed_probe_is_saved_and_pushed_at_once_an_unchanged_one_is_not() {
        let mut run = Run::new(false, false);
        let started = run.at(3);
        assert_eq!(run.on(4, Event::Looked { started, changed: false }), []);
        assert_eq!(run.on(4, Event::Looked { started, changed: true }), [Command::Save, push(&run, 3)]);
    }

    /// Changes seen while a push is under way go out in one push once it ends, timed from the
    /// first of them.
    #[test]
    fn one_push_at_a_time_and_what_waited_goes_next() {
        let mut run = Run::new(false, false);
        let looked = |run: &Run, s| Event::Looked { started: run.at(s), changed: true };
        assert_eq!(run.on(1, looked(&run, 1)), [Command::Save, push(&run, 1)]);
        assert_eq!(run.on(2, looked(&run, 2)), [Command::Save]);
        assert_eq!(run.on(3, looked(&run, 3)), [Command::Save]);
        assert_eq!(run.on(4, Event::Pushed), [push(&run, 2)]);
        assert_eq!(run.on(5, Event::Pushed), []);
    }

    /// A changed discovery waits for a listing of extensions that started after it: one that
    /// started before (and ends after) does not release it; a failed one does, as the listing
    /// that was asked for.
    #[test]
    fn a_change_waits_for_an_extensions_listing_that_started_after_it() {
        let mut run = Run::new(true, true);
        assert_eq!(run.on(0, Event::Poll), [fetch(&run, 0), Command::Ask]);
        let change = Event::Looked { started: run.at(1), changed: true };
        assert_eq!(run.on(1, change), [Command::Save], "no push before a listing after the change");
        assert_eq!(run.on(2, Event::Asked(None)), [Command::Ask], "that listing started before the change");
        assert_eq!(run.on(3, Event::Asked(None)), [push(&run, 1)]);
        // The first poll's fetch, which started at 0, finds a change too: a listing is asked
        // for, and the push waits for it even once the one under way ends.
        assert_eq!(run.on(4, Event::Fetched { changed: true }), [Command::Save, Command::Ask]);
        assert_eq!(run.on(5, Event::Pushed), []);
        assert_eq!(run.on(6, Event::Asked(Some(Membership::default()))), [push(&run, 0)]);
    }

    #[test]
    fn without_extension_listings_nothing_waits_for_one() {
        let mut run = Run::new(true, false);
        assert_eq!(run.on(0, Event::Poll), [fetch(&run, 0), Command::Ask]);
        assert_eq!(run.on(1, Event::Fetched { changed: true }), [Command::Save, push(&run, 0)]);
    }

    /// `cluster.extensions` without asking the cluster is no listing at all, not a wait forever.
    #[test]
    fn a_static_cluster_is_never_asked() {
        let mut run = Run::new(false, true);
        assert_eq!(run.on(0, Event::Poll), [fetch(&run, 0)]);
        assert_eq!(run.on(1, Event::Fetched { changed: true }), [Command::Save, push(&run, 0)]);
        assert_eq!(run.on(2, Event::Poll), [fetch(&run, 2)]);
    }

    #[test]
    fn one_look_at_the_cluster_at_a_time_and_a_wanted_one_follows() {
        let mut run = Run::new(true, false);
        assert_eq!(run.on(0, Event::Poll), [fetch(&run, 0), Command::Ask]);
        run.on(1, Event::Fetched { changed: false });
        assert_eq!(run.on(2, Event::Poll), [fetch(&run, 2)], "a look is under way");
        assert_eq!(run.on(3, Event::Asked(None)), [Command::Ask], "the poll's look, once the first ended");
        assert_eq!(run.on(4, Event::Asked(None)), []);
    }

    #[test]
    fn a_member_that_joins_is_probed_composed_and_fetched_at_once() {
        let mut run = Run::new(true, false);
        run.on(0, Event::Poll);
        run.on(1, Event::Fetched { changed: false });
        run.on(2, Event::Pushed);
        let commands = run.on(3, joined(&["d"]));
        assert_eq!(
            commands,
            [Command::Tether("d".into()), Command::Recompose, fetch(&run, 3), push(&run, 0)]
        );
    }

    /// The fetch under way started without the new member: another follows it.
    #[test]
    fn a_member_that_joins_during_a_fetch_is_fetched_right_after_it() {
        let mut run = Run::new(true, false);
        run.on(0, Event::Poll);
        let commands = run.on(1, joined(&["d"]));
        assert_eq!(commands, [Command::Tether("d".into()), Command::Recompose, push(&run, 0)]);
        assert_eq!(run.on(2, Event::Fetched { changed: false }), [fetch(&run, 2)]);
        assert_eq!(run.on(3, Event::Pushed), [push(&run, 0)]);
        assert_eq!(run.on(4, Event::Fetched { changed: true }), [Command::Save]);
        assert_eq!(run.on(5, Event::Pushed), [push(&run, 2)]);
    }

    #[test]
    fn a_member_that_leaves_is_no_longer_probed_and_the_table_follows() {
        let mut run = Run::new(true, false);
        run.on(0, Event::Poll);
        run.on(1, Event::Fetched { changed: false });
        run.on(2, Event::Pushed);
        let left = Membership { joined: Vec::new(), left: vec!["d".into()], changed: true };
        assert_eq!(
            run.on(3, Event::Asked(Some(left))),
            [Command::Untether("d".into()), Command::Recompose, push(&run, 0)]
        );
        // Marked departed (DRAINING) but not gone yet: the table follows, nobody moves.
        run.on(4, Event::Poll);
        let departed = Membership { changed: true, ..Membership::default() };
        assert_eq!(run.on(5, Event::Asked(Some(departed))), []);
        assert_eq!(run.on(6, Event::Fetched { changed: false }), [], "a push is under way");
        assert_eq!(run.on(7, Event::Pushed), [push(&run, 4)]);
    }
}
