//! A watch over several prefixes whose changes come out in revision order, one
//! revision (one transaction) at a time.
//!
//! One gRPC watch stream carries one etcd watcher per prefix. etcd orders each
//! watcher's events, but not the watchers among themselves: a watcher catching up
//! from an old revision (or one that fell behind a slow reader) sends its backlog
//! in batches while the others already send live events, and one transaction that
//! touches two prefixes arrives as two messages. So the watch merges: it keeps,
//! per watcher, the revision up to which that watcher has sent everything (its
//! *watermark*), holds changes back in a buffer ordered by revision, and releases
//! a revision once every watcher's watermark has reached it. A watermark advances
//! with
//! - the watcher's events: etcd never splits one revision of one watcher over
//!   two messages (its catch-up batches end on revision boundaries, and fragmented
//!   messages are not asked for), so after events of revision R the watcher has
//!   sent all it has up to R;
//! - the watcher's progress notifications (it is caught up, and has nothing below
//!   the notification's revision left to send): sent by etcd every
//!   `--experimental-watch-progress-notify-interval` to watchers without events,
//!   through the same queue as their events, so never ahead of them;
//! - a stream-wide progress answer to our request (every watcher is caught up to
//!   its revision), asked for every 100 ms while changes wait, but only from
//!   members whose answer is ordered with the events (etcd 3.4.31+, 3.5.13+).
//!   On older members the periodic notifications are all there is, and how long a
//!   change in one prefix may wait for a quiet one is that interval (see
//!   docs/fleet.md, "The store client").
//!
//! Prefixes are added and removed on the live stream ([`Watch::add_prefix`],
//! [`Watch::remove_prefix`]) rather than by re-creating the watch: re-creating
//! would replay every other prefix from the last saved revision, on 1,000 sleds,
//! each time a port lands in a new VPC.

use crate::error::{Operation, StoreError};
use crate::store::{check_cluster, rpc};
use etcd_client::{
    Event, EventType, ResponseHeader, WatchClient, WatchOptions, WatchRequestSender, WatchResponse,
    WatchResponseStream,
};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// How often to ask for a progress notification while changes wait for a quiet
/// watcher's watermark (what Kubernetes uses for the same purpose).
const PROGRESS_REQUEST_EVERY: Duration = Duration::from_millis(100);

/// What a [`Watch`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// Every change of one revision under the watched prefixes, sorted by key:
    /// a transaction's writes together. Revisions come in increasing order.
    Changes {
        /// The transaction's revision.
        revision: i64,
        /// Its changes under the watched prefixes.
        changes: Vec<Change>,
    },
    /// Nothing under the watched prefixes changed up to `revision`: a restart may
    /// resume from `revision + 1` (and an idle sled's saved revision keeps up with
    /// the store, ahead of compaction).
    Progress {
        /// Everything up to here was delivered.
        revision: i64,
    },
    /// The store compacted away revisions the watch still needed (it started from
    /// a revision older than the compaction, or fell that far behind): changes
    /// were lost, and the caller must take a snapshot and start again. The last
    /// event of this watch.
    Compacted {
        /// The prefix whose watcher etcd cancelled (the others follow).
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

/// A watch over several prefixes ([`crate::Store::watch`]); see the module's
/// doc for how the prefixes' events are merged. Its errors end it: on a transient
/// one, reconnect and watch again from [`Watch::delivered`] + 1.
pub struct Watch {
    endpoint: String,
    cluster_id: u64,
    ordered_progress: bool,
    requests: WatchRequestSender,
    responses: WatchResponseStream,
    merge: Merge,
    next_watch_id: i64,
    /// Watchers asked for and not yet confirmed, oldest first: etcd answers
    /// creates in order, and a refused one (a permission) comes back with no
    /// watch id, so the oldest unanswered create is the one refused.
    unconfirmed: VecDeque<i64>,
    /// When progress was last asked for, while changes wait; `None` when none
    /// wait (the next wait asks at once).
    progress_asked: Option<Instant>,
    ended: bool,
}

impl Watch {
    pub(crate) async fn start(
        mut client: WatchClient,
        endpoint: String,
        timeout: Duration,
        cluster_id: u64,
        ordered_progress: bool,
        prefixes: &[String],
        from_revision: i64,
    ) -> Result<Watch, StoreError> {
        if from_revision < 1 {
            return Err(StoreError::InvalidRevision(from_revision));
        }
        let Some((first, rest)) = prefixes.split_first() else {
            return Err(StoreError::NothingToWatch);
        };
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
            merge: Merge::new(from_revision),
            next_watch_id: 2,
            unconfirmed: VecDeque::from([1]),
            progress_asked: None,
            ended: false,
        };
        watch.merge.add(1, first.clone(), from_revision);
        for prefix in rest {
            watch.add_prefix(prefix, from_revision).await?;
        }
        Ok(watch)
    }

    /// The next event. Cancel-safe: dropping the future (in a `select!` with a
    /// timer, say) loses nothing; a later call continues.
    pub async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        loop {
            if let Some(event) = self.merge.ready.pop_front() {
                if matches!(event, WatchEvent::Compacted { .. }) {
                    self.ended = true;
                }
                return Ok(event);
            }
            if self.ended {
                return Err(self.ended_error());
            }
            let message = if self.ordered_progress && self.merge.waiting() {
                let due = self
                    .progress_asked
                    .map_or_else(Instant::now, |t| t + PROGRESS_REQUEST_EVERY);
                tokio::select! {
                    message = self.responses.message() => message,
                    () = tokio::time::sleep_until(due) => {
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
            if !self.merge.waiting() {
                self.progress_asked = None;
            }
        }
    }

    /// Starts watching `prefix` from `from_revision` (a sled starts hosting a port
    /// in a new VPC): take a [`crate::Store::snapshot`] of the prefix, then add it
    /// from the snapshot's revision + 1. The start must lie past what this watch
    /// has delivered ([`StoreError::WatchStartBehind`]), which a fresh snapshot's
    /// revision always does.
    pub async fn add_prefix(&mut self, prefix: &str, from_revision: i64) -> Result<(), StoreError> {
        if from_revision < 1 {
            return Err(StoreError::InvalidRevision(from_revision));
        }
        if from_revision <= self.merge.delivered {
            return Err(StoreError::WatchStartBehind {
                prefix: prefix.to_string(),
                from_revision,
                delivered: self.merge.delivered,
            });
        }
        if self.merge.id_of(prefix).is_some() {
            return Err(StoreError::AlreadyWatched {
                prefix: prefix.to_string(),
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
        self.merge.add(id, prefix.to_string(), from_revision);
        Ok(())
    }

    /// Stops watching `prefix` (the sled's last port in that VPC went): its
    /// changes still waiting in the buffer are dropped, and changes of the other
    /// prefixes that waited only for it come out at the next [`Watch::next`].
    pub async fn remove_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
        let Some(id) = self.merge.id_of(prefix) else {
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
        self.merge.remove(id);
        Ok(())
    }

    /// The revision up to which everything was delivered: a new watch after a
    /// reconnect starts at this + 1.
    pub fn delivered(&self) -> i64 {
        self.merge.delivered
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
            let Some(prefix) = refused.and_then(|id| self.merge.prefix_of(id)) else {
                return Ok(());
            };
            return Err(self.refused(prefix.to_string(), response));
        }
        if response.canceled() {
            // A watcher we removed ourselves is not in the merge any more.
            let Some(prefix) = self.merge.prefix_of(id).map(str::to_string) else {
                return Ok(());
            };
            if response.compact_revision() > 0 {
                self.merge.compacted(prefix, response.compact_revision());
                return Ok(());
            }
            return Err(self.refused(prefix, response));
        }
        if id == STREAM_PROGRESS {
            // Answers to progress requests; not asked for from members that
            // might send them out of order, and ignored from those.
            if self.ordered_progress {
                self.merge.progress(None, revision);
            }
            return Ok(());
        }
        if response.events().is_empty() {
            self.merge.progress(Some(id), revision);
        } else {
            self.merge
                .events(id, response.events().iter().filter_map(change));
        }
        Ok(())
    }

    /// A watcher etcd would not create or cancelled: the watch ends, since the
    /// merge cannot go past a prefix it no longer hears from.
    fn refused(&mut self, prefix: String, response: &WatchResponse) -> StoreError {
        self.ended = true;
        StoreError::WatchCanceled {
            endpoint: self.endpoint.clone(),
            prefix,
            reason: response.cancel_reason().to_string(),
        }
    }

    async fn ask_progress(&mut self) -> Result<(), StoreError> {
        self.progress_asked = Some(Instant::now());
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
        Operation::Watch {
            prefix: self.merge.first_prefix().unwrap_or_default().to_string(),
            from_revision: self.merge.delivered + 1,
        }
    }

    fn ended_error(&self) -> StoreError {
        StoreError::WatchEnded {
            endpoint: self.endpoint.clone(),
        }
    }
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

/// The merge of the watchers' events into revision order, apart from the stream
/// so that it can be tested without a store.
struct Merge {
    watchers: BTreeMap<i64, Watcher>,
    /// Changes not yet released: revision -> key -> change (a key once per
    /// revision even when overlapping prefixes both report it).
    pending: BTreeMap<i64, BTreeMap<String, Change>>,
    /// Every revision up to this one was released (changes or progress).
    delivered: i64,
    ready: VecDeque<WatchEvent>,
}

struct Watcher {
    prefix: String,
    /// This watcher has sent everything it has up to here.
    watermark: i64,
}

impl Merge {
    fn new(from_revision: i64) -> Merge {
        Merge {
            watchers: BTreeMap::new(),
            pending: BTreeMap::new(),
            delivered: from_revision - 1,
            ready: VecDeque::new(),
        }
    }

    fn add(&mut self, id: i64, prefix: String, from_revision: i64) {
        self.watchers.insert(
            id,
            Watcher {
                prefix,
                watermark: from_revision - 1,
            },
        );
    }

    /// Forgets a watcher and its waiting changes (those no remaining prefix
    /// covers); what waited only for it is released.
    fn remove(&mut self, id: i64) {
        let Some(gone) = self.watchers.remove(&id) else {
            return;
        };
        let still_watched = |key: &str| self.watchers.values().any(|w| key.starts_with(&w.prefix));
        for changes in self.pending.values_mut() {
            changes.retain(|key, _| !key.starts_with(&gone.prefix) || still_watched(key));
        }
        self.pending.retain(|_, changes| !changes.is_empty());
        self.release();
    }

    fn events(&mut self, id: i64, changes: impl Iterator<Item = Change>) {
        let Some(watcher) = self.watchers.get_mut(&id) else {
            return;
        };
        for change in changes {
            watcher.watermark = watcher.watermark.max(change.mod_revision);
            self.pending
                .entry(change.mod_revision)
                .or_default()
                .entry(change.key.clone())
                .or_insert(change);
        }
        self.release();
    }

    /// A progress notification: for one watcher, or (`None`) for all.
    fn progress(&mut self, id: Option<i64>, revision: i64) {
        for (_, watcher) in self
            .watchers
            .iter_mut()
            .filter(|(w, _)| id.is_none_or(|id| **w == id))
        {
            watcher.watermark = watcher.watermark.max(revision);
        }
        self.release();
    }

    fn compacted(&mut self, prefix: String, compact_revision: i64) {
        self.ready.push_back(WatchEvent::Compacted {
            prefix,
            compact_revision,
        });
    }

    /// Releases every waiting revision that all watchers have passed, in order,
    /// then progress up to the lowest watermark if that is further.
    fn release(&mut self) {
        let Some(safe) = self.watchers.values().map(|w| w.watermark).min() else {
            return;
        };
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() > safe {
                break;
            }
            let (revision, changes) = entry.remove_entry();
            self.ready.push_back(WatchEvent::Changes {
                revision,
                changes: changes.into_values().collect(),
            });
            self.delivered = revision;
        }
        if safe > self.delivered {
            self.ready
                .push_back(WatchEvent::Progress { revision: safe });
            self.delivered = safe;
        }
    }

    /// Changes are held back for a watcher that has not caught up.
    fn waiting(&self) -> bool {
        !self.pending.is_empty()
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

    fn first_prefix(&self) -> Option<&str> {
        self.watchers.values().next().map(|w| w.prefix.as_str())
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

    fn drain(m: &mut Merge) -> Vec<WatchEvent> {
        m.ready.drain(..).collect()
    }

    fn changes(revision: i64, keys: &[&str]) -> WatchEvent {
        WatchEvent::Changes {
            revision,
            changes: keys.iter().map(|k| put(k, revision)).collect(),
        }
    }

    fn two_watchers(from: i64) -> Merge {
        let mut m = Merge::new(from);
        m.add(1, "/a/".into(), from);
        m.add(2, "/b/".into(), from);
        m
    }

    #[test]
    fn a_catching_up_watcher_holds_back_later_revisions() {
        let mut m = two_watchers(10);
        // Watcher 1 is live at 15 while watcher 2 still sends its backlog.
        m.events(1, [put("/a/x", 15)].into_iter());
        assert_eq!(drain(&mut m), []);
        m.events(2, [put("/b/y", 12)].into_iter());
        assert_eq!(drain(&mut m), [changes(12, &["/b/y"])]);
        m.progress(Some(2), 20);
        assert_eq!(drain(&mut m), [changes(15, &["/a/x"])]);
        // Watcher 1's watermark (15) now bounds the progress.
        m.progress(Some(1), 20);
        assert_eq!(drain(&mut m), [WatchEvent::Progress { revision: 20 }]);
        assert_eq!(m.delivered, 20);
    }

    #[test]
    fn one_transaction_over_two_prefixes_is_one_event() {
        let mut m = two_watchers(1);
        m.events(1, [put("/a/x", 7)].into_iter());
        m.events(2, [put("/b/y", 7), put("/b/z", 7)].into_iter());
        assert_eq!(drain(&mut m), [changes(7, &["/a/x", "/b/y", "/b/z"])]);
    }

    #[test]
    fn a_single_watcher_releases_at_once() {
        let mut m = Merge::new(1);
        m.add(1, "/a/".into(), 1);
        m.events(1, [put("/a/x", 3), put("/a/y", 4)].into_iter());
        assert_eq!(
            drain(&mut m),
            [changes(3, &["/a/x"]), changes(4, &["/a/y"])]
        );
        m.progress(Some(1), 4);
        assert_eq!(drain(&mut m), []);
    }

    #[test]
    fn stream_progress_moves_every_watermark() {
        let mut m = two_watchers(1);
        m.events(1, [put("/a/x", 5)].into_iter());
        m.progress(None, 9);
        assert_eq!(
            drain(&mut m),
            [changes(5, &["/a/x"]), WatchEvent::Progress { revision: 9 }]
        );
    }

    #[test]
    fn overlapping_prefixes_report_a_key_once() {
        let mut m = Merge::new(1);
        m.add(1, "/a/".into(), 1);
        m.add(2, "/a/b/".into(), 1);
        m.events(1, [put("/a/b/k", 3)].into_iter());
        m.events(2, [put("/a/b/k", 3)].into_iter());
        assert_eq!(drain(&mut m), [changes(3, &["/a/b/k"])]);
    }

    #[test]
    fn removing_a_prefix_drops_its_waiting_changes() {
        let mut m = two_watchers(1);
        m.events(1, [put("/a/x", 6)].into_iter());
        m.remove(1);
        assert_eq!(drain(&mut m), []);
        m.progress(Some(2), 9);
        assert_eq!(drain(&mut m), [WatchEvent::Progress { revision: 9 }]);
        assert_eq!(m.id_of("/a/"), None);
    }

    #[test]
    fn removing_the_laggard_releases_what_waited_for_it() {
        let mut m = two_watchers(1);
        m.events(2, [put("/b/y", 4)].into_iter());
        assert_eq!(drain(&mut m), []);
        m.remove(1);
        assert_eq!(drain(&mut m), [changes(4, &["/b/y"])]);
    }

    #[test]
    fn an_added_watcher_starts_at_its_own_revision() {
        let mut m = Merge::new(1);
        m.add(1, "/a/".into(), 1);
        m.progress(Some(1), 10);
        assert_eq!(drain(&mut m), [WatchEvent::Progress { revision: 10 }]);
        // Snapshot of /b/ at 12, watched from 13: holds nothing below 13 back.
        m.add(2, "/b/".into(), 13);
        m.events(1, [put("/a/x", 11)].into_iter());
        assert_eq!(drain(&mut m), [changes(11, &["/a/x"])]);
        m.events(2, [put("/b/y", 14)].into_iter());
        assert_eq!(drain(&mut m), []);
        m.progress(Some(1), 14);
        assert_eq!(drain(&mut m), [changes(14, &["/b/y"])]);
    }
}
