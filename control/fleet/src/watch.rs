//! A watch over several prefixes, each followed from a revision of its own.
//!
//! One gRPC watch stream carries one etcd watcher per prefix. etcd orders each
//! watcher's events but not the watchers among themselves (a watcher catching up
//! sends its backlog while the others send live events; a transaction over two
//! prefixes arrives as two messages), so the watch does not pretend otherwise:
//! each prefix's changes come out as soon as its watcher sends them, in that
//! prefix's revision order, and each prefix has its own **position**, the revision
//! up to which everything under it was delivered. A restart resumes every prefix
//! from its own position + 1, so nothing is replayed and nothing missed.
//!
//! Merging the prefixes into one revision order instead would make a change under
//! one prefix wait until every quiet prefix had reported progress past it: on
//! members before etcd 3.4.31 and 3.5.13 (Debian's 3.4.23 among them) only the
//! periodic notifications say so, every
//! `--experimental-watch-progress-notify-interval` (10 minutes by default). Each
//! key belongs to one prefix (overlapping prefixes are refused), and nothing the
//! daemon does needs one order across prefixes: a guest's mapping and its move are
//! one key of one VPC.
//!
//! A position advances with
//! - the watcher's events: etcd never splits one revision of one watcher over two
//!   messages (its catch-up batches end on revision boundaries, and fragmented
//!   messages are not asked for), so after events of revision R the watcher has
//!   sent all it has up to R;
//! - the watcher's progress notifications (it is caught up, and has nothing below
//!   the notification's revision left to send), sent by etcd through the same
//!   queue as its events, so never ahead of them;
//! - a stream-wide progress answer (every watcher is caught up to its revision),
//!   asked for every second, but only from members whose answer is ordered with
//!   the events (etcd 3.4.31+, 3.5.13+). Older members send them out of order, so
//!   there the periodic notifications are all there is.
//!
//! Positions of quiet prefixes moving up matters twice: `fleet status` shows the
//! revision a sled is current at, and a restart's watch starts above the store's
//! compaction rather than falling into a full resync.
//!
//! Prefixes are added and removed on the live stream ([`Watch::add_prefix`],
//! [`Watch::remove_prefix`]) rather than by re-creating the watch: re-creating
//! would restart every other prefix's watcher, on 1,000 sleds, each time a port
//! lands in a new VPC.

use crate::call::{check_cluster, rpc};
use crate::error::{Operation, StoreError};
use etcd_client::{
    Event, EventType, ResponseHeader, WatchClient, WatchOptions, WatchRequestSender, WatchResponse,
    WatchResponseStream,
};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// How often to ask members whose answers are ordered for a progress answer: the
/// positions of quiet prefixes are then at most this far behind the store.
const PROGRESS_REQUEST_EVERY: Duration = Duration::from_secs(1);

/// Each watched prefix and the revision up to which everything under it was
/// delivered: where a watch resumes ([`crate::Store::watch`]).
pub type Positions = BTreeMap<String, i64>;

/// What a [`Watch`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// Every change of one revision under one prefix, sorted by key. A prefix's
    /// revisions come in increasing order; a transaction over several prefixes
    /// comes as one event for each.
    Changes {
        /// The prefix whose watcher sent them; its position is now `revision`.
        prefix: String,
        /// The transaction's revision.
        revision: i64,
        /// Its changes under `prefix`.
        changes: Vec<Change>,
    },
    /// Nothing under `prefix` changed up to `revision`: its position moved there.
    Progress {
        /// The quiet prefix.
        prefix: String,
        /// Everything under it up to here was delivered.
        revision: i64,
    },
    /// The store compacted away revisions the watch still needed (a prefix
    /// started from a revision older than the compaction, or fell that far
    /// behind): changes were lost, and the caller must take a snapshot and start
    /// again. The last event of this watch.
    Compacted {
        /// The prefix whose watcher etcd cancelled.
        prefix: String,
        /// The oldest revision the store still has.
        compact_revision: i64,
    },
}

/// One key's change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// As in [`crate::Kv::key`].
    pub key: String,
    /// The new value; `None` when the key was deleted (or its lease expired).
    pub value: Option<Vec<u8>>,
    /// The revision of the change.
    pub mod_revision: i64,
}

/// A watch over several prefixes ([`crate::Store::watch`]); see the module's doc
/// for what comes out in which order. Its errors end it: on a transient one,
/// reconnect and watch again from [`Watch::positions`].
pub struct Watch {
    endpoint: String,
    cluster_id: u64,
    ordered_progress: bool,
    requests: WatchRequestSender,
    responses: WatchResponseStream,
    tracker: Tracker,
    next_watch_id: i64,
    /// Watchers asked for and not yet confirmed, oldest first: etcd answers
    /// creates in order, and a refused one (a permission) comes back with no
    /// watch id, so the oldest unanswered create is the one refused.
    unconfirmed: VecDeque<i64>,
    /// When to ask for progress next (members with ordered answers only).
    progress_due: Instant,
    ended: bool,
}

impl Watch {
    pub(crate) async fn start(
        mut client: WatchClient,
        endpoint: String,
        timeout: Duration,
        cluster_id: u64,
        ordered_progress: bool,
        positions: &Positions,
    ) -> Result<Watch, StoreError> {
        let Some((first, &after)) = positions.iter().next() else {
            return Err(StoreError::NothingToWatch);
        };
        let from_revision = start_of(after)?;
        let operation = Operation::Watch {
            prefix: first.clone(),
            from_revision,
        };
        let opening = client.watch(first.as_bytes(), Some(watch_options(1, from_revision)));
        let stream = rpc(&endpoint, timeout, operation, opening).await?;
        let (requests, responses) = stream.split();
        let mut watch = Watch {
            endpoint,
            cluster_id,
            ordered_progress,
            requests,
            responses,
            tracker: Tracker::default(),
            next_watch_id: 2,
            unconfirmed: VecDeque::from([1]),
            progress_due: Instant::now() + PROGRESS_REQUEST_EVERY,
            ended: false,
        };
        watch.tracker.add(1, first.clone(), after);
        for (prefix, &after) in positions.iter().skip(1) {
            watch.add_prefix(prefix, after).await?;
        }
        Ok(watch)
    }

    /// The next event. Cancel-safe: dropping the future (in a `select!` with a
    /// timer, say) loses nothing; a later call continues.
    pub async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        loop {
            if let Some(event) = self.tracker.ready.pop_front() {
                if matches!(event, WatchEvent::Compacted { .. }) {
                    self.ended = true;
                }
                return Ok(event);
            }
            if self.ended {
                return Err(self.ended_error());
            }
            let message = if self.ordered_progress {
                tokio::select! {
                    message = self.responses.message() => message,
                    () = tokio::time::sleep_until(self.progress_due) => {
                        self.ask_progress().await?;
                        continue;
                    }
                }
            } else {
                self.responses.message().await
            };
            match message {
                Ok(Some(response)) => self.handle(&response)?,
                Ok(None) => {
                    self.ended = true;
                    return Err(self.ended_error());
                }
                Err(source) => {
                    self.ended = true;
                    return Err(StoreError::Rpc {
                        endpoint: self.endpoint.clone(),
                        operation: self.operation(),
                        source,
                    });
                }
            }
        }
    }

    /// Starts watching `prefix` after revision `after` (a sled starts hosting a
    /// port in a new VPC): take a [`crate::Store::snapshot`] of the prefix, then
    /// add it after the snapshot's revision. A prefix that overlaps one watched
    /// already is refused.
    pub async fn add_prefix(&mut self, prefix: &str, after: i64) -> Result<(), StoreError> {
        let from_revision = start_of(after)?;
        if let Some(watched) = self.tracker.overlapping(prefix) {
            return Err(if watched == prefix {
                StoreError::AlreadyWatched {
                    prefix: prefix.to_string(),
                }
            } else {
                StoreError::OverlappingPrefix {
                    prefix: prefix.to_string(),
                    watched: watched.to_string(),
                }
            });
        }
        let id = self.next_watch_id;
        self.requests
            .watch(prefix.as_bytes(), Some(watch_options(id, from_revision)))
            .await
            .map_err(|source| StoreError::Rpc {
                endpoint: self.endpoint.clone(),
                operation: Operation::Watch {
                    prefix: prefix.to_string(),
                    from_revision,
                },
                source,
            })?;
        self.next_watch_id += 1;
        self.unconfirmed.push_back(id);
        self.tracker.add(id, prefix.to_string(), after);
        Ok(())
    }

    /// Stops watching `prefix` (the sled's last port in that VPC went): its
    /// events not yet taken are dropped.
    pub async fn remove_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
        let Some(id) = self.tracker.id_of(prefix) else {
            return Err(StoreError::NotWatched {
                prefix: prefix.to_string(),
            });
        };
        self.requests
            .cancel(id)
            .await
            .map_err(|source| StoreError::Rpc {
                endpoint: self.endpoint.clone(),
                operation: self.operation(),
                source,
            })?;
        self.tracker.remove(id);
        Ok(())
    }

    /// Every prefix's position: a new watch after a reconnect starts from these.
    pub fn positions(&self) -> Positions {
        self.tracker.positions()
    }

    /// The revision up to which everything watched was delivered: the lowest
    /// position.
    pub fn delivered(&self) -> i64 {
        self.tracker.delivered()
    }

    /// The cluster every answer of this watch came from.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The member the watch streams from.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn handle(&mut self, response: &WatchResponse) -> Result<(), StoreError> {
        check_cluster(&self.endpoint, self.cluster_id, response.header())?;
        let id = response.watch_id();
        let revision = response.header().map_or(0, ResponseHeader::revision);
        if response.created() {
            let confirmed = self.unconfirmed.pop_front();
            if !response.canceled() {
                return Ok(());
            }
            let refused = if id == STREAM_PROGRESS {
                confirmed
            } else {
                Some(id)
            };
            // A prefix removed before etcd answered needs no watcher anyway.
            let Some(prefix) = refused.and_then(|id| self.tracker.prefix_of(id)) else {
                return Ok(());
            };
            return Err(self.refused(prefix.to_string(), response));
        }
        if response.canceled() {
            // A watcher we removed ourselves is not tracked any more.
            let Some(prefix) = self.tracker.prefix_of(id).map(str::to_string) else {
                return Ok(());
            };
            if response.compact_revision() > 0 {
                self.tracker.compacted(prefix, response.compact_revision());
                return Ok(());
            }
            return Err(self.refused(prefix, response));
        }
        if id == STREAM_PROGRESS {
            // Answers to progress requests; not asked for from members that
            // might send them out of order, and ignored from those.
            if self.ordered_progress {
                self.tracker.progress(None, revision);
            }
            return Ok(());
        }
        if response.events().is_empty() {
            self.tracker.progress(Some(id), revision);
        } else {
            self.tracker
                .events(id, response.events().iter().filter_map(change));
        }
        Ok(())
    }

    /// A watcher etcd would not create or cancelled: the watch ends (the caller
    /// learns which prefix, and why).
    fn refused(&mut self, prefix: String, response: &WatchResponse) -> StoreError {
        self.ended = true;
        StoreError::WatchCanceled {
            endpoint: self.endpoint.clone(),
            prefix,
            reason: response.cancel_reason().to_string(),
        }
    }

    async fn ask_progress(&mut self) -> Result<(), StoreError> {
        self.progress_due = Instant::now() + PROGRESS_REQUEST_EVERY;
        self.requests
            .request_progress()
            .await
            .map_err(|source| StoreError::Rpc {
                endpoint: self.endpoint.clone(),
                operation: self.operation(),
                source,
            })
    }

    /// The watch as a whole, for errors of the stream: named by its first prefix.
    fn operation(&self) -> Operation {
        let (prefix, after) = self.tracker.first().unwrap_or_default();
        Operation::Watch {
            prefix,
            from_revision: after + 1,
        }
    }

    fn ended_error(&self) -> StoreError {
        StoreError::WatchEnded {
            endpoint: self.endpoint.clone(),
        }
    }
}

/// The first revision of a watch of a prefix delivered up to `after`.
fn start_of(after: i64) -> Result<i64, StoreError> {
    // etcd reads a start of 0 as "from now", and would miss changes.
    if after < 0 {
        return Err(StoreError::InvalidRevision(after + 1));
    }
    Ok(after + 1)
}

/// The watch id etcd gives answers to progress requests, which concern every
/// watcher of the stream, and refusals of watchers it did not create.
const STREAM_PROGRESS: i64 = -1;

fn watch_options(id: i64, from_revision: i64) -> WatchOptions {
    WatchOptions::new()
        .with_prefix()
        .with_start_revision(from_revision)
        .with_progress_notify()
        .with_watch_id(id)
}

fn change(event: &Event) -> Option<Change> {
    let kv = event.kv()?;
    Some(Change {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: match event.event_type() {
            EventType::Put => Some(kv.value().to_vec()),
            EventType::Delete => None,
        },
        mod_revision: kv.mod_revision(),
    })
}

/// The watchers' positions and the events ready to be taken, apart from the
/// stream so that it can be tested without a store.
#[derive(Default)]
struct Tracker {
    watchers: BTreeMap<i64, Watcher>,
    ready: VecDeque<WatchEvent>,
}

struct Watcher {
    prefix: String,
    /// Everything under the prefix up to here was delivered.
    position: i64,
}

impl Tracker {
    fn add(&mut self, id: i64, prefix: String, after: i64) {
        self.watchers.insert(
            id,
            Watcher {
                prefix,
                position: after,
            },
        );
    }

    /// Forgets a watcher and the events of its prefix not yet taken.
    fn remove(&mut self, id: i64) {
        let Some(gone) = self.watchers.remove(&id) else {
            return;
        };
        self.ready.retain(|e| match e {
            WatchEvent::Changes { prefix, .. } | WatchEvent::Progress { prefix, .. } => {
                *prefix != gone.prefix
            }
            WatchEvent::Compacted { .. } => true,
        });
    }

    /// A watcher's events, one [`WatchEvent::Changes`] per revision (a catch-up
    /// message may hold several).
    fn events(&mut self, id: i64, changes: impl Iterator<Item = Change>) {
        let Some(watcher) = self.watchers.get_mut(&id) else {
            return;
        };
        let mut by_revision: BTreeMap<i64, BTreeMap<String, Change>> = BTreeMap::new();
        for change in changes.filter(|c| c.mod_revision > watcher.position) {
            by_revision
                .entry(change.mod_revision)
                .or_default()
                .insert(change.key.clone(), change);
        }
        for (revision, changes) in by_revision {
            watcher.position = revision;
            self.ready.push_back(WatchEvent::Changes {
                prefix: watcher.prefix.clone(),
                revision,
                changes: changes.into_values().collect(),
            });
        }
    }

    /// A progress notification: for one watcher, or (`None`) for all.
    fn progress(&mut self, id: Option<i64>, revision: i64) {
        for (_, watcher) in self
            .watchers
            .iter_mut()
            .filter(|(w, _)| id.is_none_or(|id| **w == id))
        {
            if revision > watcher.position {
                watcher.position = revision;
                self.ready.push_back(WatchEvent::Progress {
                    prefix: watcher.prefix.clone(),
                    revision,
                });
            }
        }
    }

    fn compacted(&mut self, prefix: String, compact_revision: i64) {
        self.ready.push_back(WatchEvent::Compacted {
            prefix,
            compact_revision,
        });
    }

    fn positions(&self) -> Positions {
        self.watchers
            .values()
            .map(|w| (w.prefix.clone(), w.position))
            .collect()
    }

    fn delivered(&self) -> i64 {
        self.watchers
            .values()
            .map(|w| w.position)
            .min()
            .unwrap_or(0)
    }

    /// A watched prefix that `prefix` equals, contains or lies within.
    fn overlapping(&self, prefix: &str) -> Option<&str> {
        self.watchers
            .values()
            .map(|w| w.prefix.as_str())
            .find(|w| w.starts_with(prefix) || prefix.starts_with(w))
    }

    fn id_of(&self, prefix: &str) -> Option<i64> {
        self.watchers
            .iter()
            .find(|(_, w)| w.prefix == prefix)
            .map(|(id, _)| *id)
    }

    fn prefix_of(&self, id: i64) -> Option<&str> {
        self.watchers.get(&id).map(|w| w.prefix.as_str())
    }

    fn first(&self) -> Option<(String, i64)> {
        self.watchers
            .values()
            .next()
            .map(|w| (w.prefix.clone(), w.position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: i64) -> Change {
        Change {
            key: key.to_string(),
            value: Some(b"v".to_vec()),
            mod_revision: revision,
        }
    }

    fn drain(t: &mut Tracker) -> Vec<WatchEvent> {
        t.ready.drain(..).collect()
    }

    fn changes(prefix: &str, revision: i64, keys: &[&str]) -> WatchEvent {
        WatchEvent::Changes {
            prefix: prefix.to_string(),
            revision,
            changes: keys.iter().map(|k| put(k, revision)).collect(),
        }
    }

    fn progress(prefix: &str, revision: i64) -> WatchEvent {
        WatchEvent::Progress {
            prefix: prefix.to_string(),
            revision,
        }
    }

    fn two_watchers(after: i64) -> Tracker {
        let mut t = Tracker::default();
        t.add(1, "/a/".into(), after);
        t.add(2, "/b/".into(), after);
        t
    }

    #[test]
    fn a_live_change_does_not_wait_for_a_quiet_prefix() {
        let mut t = two_watchers(10);
        t.events(1, [put("/a/x", 15)].into_iter());
        assert_eq!(drain(&mut t), [changes("/a/", 15, &["/a/x"])]);
        // The other prefix catches up on its own; each has its own position.
        t.events(2, [put("/b/y", 12)].into_iter());
        assert_eq!(drain(&mut t), [changes("/b/", 12, &["/b/y"])]);
        assert_eq!(
            t.positions(),
            Positions::from([("/a/".into(), 15), ("/b/".into(), 12)])
        );
        assert_eq!(t.delivered(), 12);
        t.progress(Some(2), 20);
        assert_eq!(drain(&mut t), [progress("/b/", 20)]);
        assert_eq!(t.delivered(), 15);
    }

    #[test]
    fn a_catch_up_message_is_one_event_per_revision() {
        let mut t = Tracker::default();
        t.add(1, "/a/".into(), 2);
        t.events(
            1,
            [put("/a/y", 4), put("/a/x", 3), put("/a/z", 4)].into_iter(),
        );
        assert_eq!(
            drain(&mut t),
            [
                changes("/a/", 3, &["/a/x"]),
                changes("/a/", 4, &["/a/y", "/a/z"])
            ]
        );
        // Progress that says nothing new is not reported.
        t.progress(Some(1), 4);
        assert_eq!(drain(&mut t), []);
    }

    #[test]
    fn stream_progress_moves_every_position() {
        let mut t = two_watchers(1);
        t.events(1, [put("/a/x", 5)].into_iter());
        t.progress(None, 9);
        assert_eq!(
            drain(&mut t),
            [
                changes("/a/", 5, &["/a/x"]),
                progress("/a/", 9),
                progress("/b/", 9)
            ]
        );
        assert_eq!(t.delivered(), 9);
    }

    #[test]
    fn removing_a_prefix_drops_its_events_not_yet_taken() {
        let mut t = two_watchers(1);
        t.events(1, [put("/a/x", 6)].into_iter());
        t.events(2, [put("/b/x", 7)].into_iter());
        t.remove(1);
        assert_eq!(drain(&mut t), [changes("/b/", 7, &["/b/x"])]);
        assert_eq!(t.id_of("/a/"), None);
        assert_eq!(t.delivered(), 7);
    }

    #[test]
    fn overlapping_prefixes_are_found_both_ways() {
        let mut t = Tracker::default();
        t.add(1, "/v/vpc/1/".into(), 0);
        assert_eq!(t.overlapping("/v/vpc/1/"), Some("/v/vpc/1/"));
        assert_eq!(t.overlapping("/v/vpc/"), Some("/v/vpc/1/"));
        assert_eq!(t.overlapping("/v/vpc/1/v2p/"), Some("/v/vpc/1/"));
        assert_eq!(t.overlapping("/v/vpc/10/"), None);
    }

    #[test]
    fn an_added_watcher_starts_at_its_own_position() {
        let mut t = Tracker::default();
        t.add(1, "/a/".into(), 10);
        // Snapshot of /b/ at 12, watched after it.
        t.add(2, "/b/".into(), 12);
        t.events(1, [put("/a/x", 11)].into_iter());
        assert_eq!(drain(&mut t), [changes("/a/", 11, &["/a/x"])]);
        t.events(2, [put("/b/y", 14)].into_iter());
        assert_eq!(drain(&mut t), [changes("/b/", 14, &["/b/y"])]);
        assert_eq!(t.delivered(), 11);
    }
}
