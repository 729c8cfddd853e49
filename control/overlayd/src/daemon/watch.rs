//! The underlay links followed at run time, on the daemon's main thread: an MTU
//! change reaches every engine at once (segment sizes, MTU budget, Packet Too
//! Big), and a link deleted and re-created, or whose rx queue count changed, gets
//! its program and sockets attached again, the workers' sockets replaced between
//! their rounds. A link going down or losing carrier (and coming back) is
//! logged and counted here once; the workers' next-hop resolvers move the flows
//! (`underlay::neighbours`).

use crate::config::{DaemonConfig, UnderlayGso};
use crate::underlay::pathwatch::LinkPaths;
use crate::underlay::queues::UnderlayQueues;
use crate::underlay::{rx_queue_count, LinkFacts, Underlay, UnderlayError, FRAME_OVERHEAD};
use crate::util::Backoff;
use crate::worker::Datapath;
use crate::workers::Workers;
use dpio::netlink::{Event, Events, Group, LinkInfo, Netlink};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why the program and sockets must be attached again, if they must: a configured
/// link appeared, went, was re-created (another ifindex) or changed its queue
/// count, or its MTU outgrew the transmit slots. `now` and `attached` hold each
/// configured link (named in `names`) as the kernel has it and as it was attached
/// (`None`: absent). An MTU change within the slots needs no re-attach (the
/// engines are told, [`UnderlayWatch`]).
fn reattach_reason(
    names: &[String],
    now: &[Option<LinkFacts>],
    attached: &[Option<LinkFacts>],
    max_tx_frame: usize,
) -> Option<String> {
    names
        .iter()
        .zip(now.iter().zip(attached))
        .find_map(|(name, (now, attached))| match (now, attached) {
            (None, None) => None,
            (Some(_), None) => Some(format!("{name} is there")),
            (None, Some(_)) => Some(format!("{name} is gone")),
            (Some(n), Some(a)) if n.ifindex != a.ifindex => Some(format!(
                "{name} was re-created (ifindex {} now {})",
                a.ifindex, n.ifindex
            )),
            (Some(n), Some(a)) if n.queues != a.queues => Some(format!(
                "{name} has {} rx queues, {} were attached",
                n.queues, a.queues
            )),
            (Some(n), Some(_)) if n.mtu as usize + FRAME_OVERHEAD > max_tx_frame => Some(format!(
                "{name}'s MTU {} outgrew the {max_tx_frame}-byte transmit slots",
                n.mtu
            )),
            (Some(_), Some(_)) => None,
        })
}

/// Whether an underlay link carries traffic (up, with carrier) and how often
/// that changed: when it does not, the next hops through it are out of use and
/// its flows leave by the other links.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LinkUse {
    in_use: bool,
    changes: u64,
}

/// Records that link `name` is (or is not) `in_use` now; a change from what was
/// known is counted and logged once.
fn note_use(uses: &Mutex<BTreeMap<String, LinkUse>>, name: &str, in_use: bool) {
    let mut uses = uses.lock().unwrap_or_else(PoisonError::into_inner);
    let known = uses.get(name).copied();
    if known.is_some_and(|u| u.in_use == in_use) {
        return;
    }
    let changes = known.map_or(0, |u| u.changes + 1);
    uses.insert(name.to_string(), LinkUse { in_use, changes });
    match (known, in_use) {
        (_, false) => tracing::warn!(
            iface = %name, changes,
            "underlay link down or without carrier: its next hops are out of use, \
             its flows move to the other links"
        ),
        (Some(_), true) => tracing::info!(
            iface = %name, changes,
            "underlay link back: its next hops are in use again"
        ),
        (None, true) => {}
    }
}

/// Adds each link's [`LinkUse`] to `stats`' `underlay` entries (by name).
fn add_link_use(links: &mut Value, uses: &BTreeMap<String, LinkUse>) {
    for link in links.as_array_mut().into_iter().flatten() {
        let u = link["name"].as_str().and_then(|n| uses.get(n)).copied();
        if let (Value::Object(l), Some(u)) = (link, u) {
            l.insert("in_use".into(), u.in_use.into());
            l.insert("in_use_changes".into(), u.changes.into());
        }
    }
}

/// Adds each link's path-watch counts (`paths_down`, `path_down_events`) to
/// `stats`' `underlay` entries (by name): zeros for a link none of whose paths
/// went out of use.
fn add_link_paths(links: &mut Value, paths: &BTreeMap<String, LinkPaths>) {
    for link in links.as_array_mut().into_iter().flatten() {
        let p = link["name"]
            .as_str()
            .and_then(|n| paths.get(n))
            .copied()
            .unwrap_or_default();
        if let Value::Object(l) = link {
            l.insert("paths_down".into(), p.paths_down.into());
            l.insert("path_down_events".into(), p.path_down_events.into());
        }
    }
}

/// How often the links are read again without a notification: drivers do not all
/// announce a change of their channel (queue) count over rtnetlink.
const RECHECK: Duration = Duration::from_secs(5);

/// How soon a failed re-attach is tried again (binding a queue that was just
/// released can fail with EBUSY for ~100 ms), and the longest wait between tries.
const REATTACH_FIRST: Duration = Duration::from_millis(200);

const REATTACH_MAX: Duration = Duration::from_secs(5);

/// Follows the underlay links at run time, on the main thread (between API
/// requests), through rtnetlink link notifications and a re-read every
/// [`RECHECK`].
pub struct UnderlayWatch {
    cfg: DaemonConfig,
    workers: usize,
    /// Shared with the `stats` of the links (also read on the main thread).
    underlay: Arc<Mutex<Underlay>>,
    events: Events,
    nl: Netlink,
    got: Vec<Event>,
    next_check: Instant,
    /// A re-attach that failed: when it is tried again, and the waits after.
    retry: Option<(Instant, Backoff)>,
    /// The MTU last given to the engines.
    engine_mtu: u32,
    /// Each configured link's use, shared with `stats`.
    uses: Arc<Mutex<BTreeMap<String, LinkUse>>>,
}

impl UnderlayWatch {
    /// Starts following `underlay` (opened by [`Underlay::open`], its sockets
    /// handed to `workers` workers whose engines plan with `engine_mtu`).
    pub fn start(
        cfg: &DaemonConfig,
        workers: usize,
        underlay: Underlay,
        engine_mtu: u32,
    ) -> Result<UnderlayWatch, UnderlayError> {
        // The engines were configured with the transmit path found at start; a
        // re-attach must give them the same, or fail and retry (never a silent
        // switch that would leave super-frames without a tap).
        let mut cfg = cfg.clone();
        cfg.underlay_gso = if underlay.tunnel_gso() {
            UnderlayGso::On
        } else {
            UnderlayGso::Off
        };
        let mut watch = UnderlayWatch {
            cfg,
            workers,
            underlay: Arc::new(Mutex::new(underlay)),
            events: Events::subscribe(&[Group::Link]).map_err(UnderlayError::Notifications)?,
            nl: Netlink::open().map_err(UnderlayError::Notifications)?,
            got: Vec::new(),
            next_check: Instant::now() + RECHECK,
            retry: None,
            engine_mtu,
            uses: Arc::default(),
        };
        // Each link's use as it is at start: what later changes are told from.
        watch.read_links();
        Ok(watch)
    }

    /// The underlay MTU the engines plan with now.
    pub fn mtu(&self) -> u32 {
        self.engine_mtu
    }

    /// The links' facts and XDP counters, for `stats`, with the path watch's
    /// counts per link when it runs (`paths`).
    pub fn stats(
        &self,
        paths: Option<Arc<Mutex<BTreeMap<String, LinkPaths>>>>,
    ) -> impl FnMut() -> serde_json::Value {
        let (underlay, uses) = (self.underlay.clone(), self.uses.clone());
        move || {
            let mut u = underlay.lock().unwrap_or_else(PoisonError::into_inner);
            let mut links = serde_json::to_value(u.stats()).unwrap_or_default();
            add_link_use(
                &mut links,
                &uses.lock().unwrap_or_else(PoisonError::into_inner),
            );
            if let Some(p) = &paths {
                add_link_paths(
                    &mut links,
                    &p.lock().unwrap_or_else(PoisonError::into_inner),
                );
            }
            links
        }
    }

    /// Notices link changes since the last call and applies them: the engines
    /// follow the MTU; the program and sockets are attached again when a link
    /// went, came back or changed its queues. Cheap when nothing happened (one
    /// non-blocking read).
    pub fn poll(&mut self, workers: &Workers<Datapath>) {
        let now = Instant::now();
        let due = now >= self.next_check || self.retry.is_some_and(|(at, _)| now >= at);
        if !(self.announced() || due) {
            return;
        }
        self.next_check = now + RECHECK;
        let Some(facts) = self.read_links() else {
            return;
        };
        let why = {
            let u = self.underlay.lock().unwrap_or_else(PoisonError::into_inner);
            let names = &self.cfg.underlay;
            let attached: Vec<_> = names.iter().map(|n| u.attached(n)).collect();
            reattach_reason(names, &facts, &attached, u.max_tx_frame)
                .or_else(|| self.retry.map(|_| "the last re-attach failed".to_string()))
        };
        if let Some(why) = why {
            self.reattach(workers, &why, now);
        }
        self.follow_mtu(workers, &facts);
    }

    /// Whether a notification concerns an underlay link (or some were lost).
    fn announced(&mut self) -> bool {
        self.got.clear();
        if let Err(e) = self.events.drain(&mut self.got) {
            tracing::warn!(error = %e, "underlay link notifications");
            return true;
        }
        let names = &self.cfg.underlay;
        self.got.iter().any(|e| match e {
            Event::Link { info, .. } => names.contains(&info.name),
            _ => true,
        })
    }

    /// The configured links as the kernel has them now (`None`: absent), or
    /// `None` when they cannot be read (tried again at the next notification or
    /// re-check).
    fn read_links(&mut self) -> Option<Vec<Option<LinkFacts>>> {
        let mut out = Vec::new();
        for name in &self.cfg.underlay {
            let link = match self.nl.link_by_name(name) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    note_use(&self.uses, name, false);
                    out.push(None);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(iface = %name, error = %e, "underlay link not readable");
                    return None;
                }
            };
            note_use(&self.uses, name, link.up && link.carrier);
            // A link being deleted has no queues left to list: as good as absent.
            out.push(rx_queue_count(name).ok().map(|queues| LinkFacts {
                ifindex: link.ifindex,
                mtu: link.mtu,
                queues,
            }));
        }
        Some(out)
    }

    /// Replaces the program and every worker's sockets. The workers close their
    /// sockets first (underlay frames are counted `underlay_tx_no_link` in the
    /// meantime), so the old program is detached and a queue rebound only once
    /// nothing uses it. A failure is retried on a back-off.
    fn reattach(&mut self, workers: &Workers<Datapath>, why: &str, now: Instant) {
        tracing::warn!(why, "underlay changed: re-attaching XDP and AF_XDP sockets");
        for w in 0..workers.count() {
            let r = workers.call(w, |dp: &mut Datapath| {
                dp.replace_underlay(UnderlayQueues::default())
            });
            if let Err(e) = r.and_then(|r| r) {
                tracing::error!(worker = w, error = %e, "underlay sockets not released");
            }
        }
        let underlay = self.underlay.clone();
        let mut u = underlay.lock().unwrap_or_else(PoisonError::into_inner);
        *u = Underlay::empty();
        let opened = self
            .present_links()
            .and_then(|links| Underlay::attach(&self.cfg, links, self.workers));
        let mut new = match opened {
            Ok(new) => new,
            Err(e) => {
                let mut backoff = self
                    .retry
                    .map_or(Backoff::new(REATTACH_FIRST, REATTACH_MAX), |(_, b)| b);
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_in = ?wait, "underlay not re-attached");
                self.retry = Some((now + wait, backoff));
                return;
            }
        };
        self.retry = None;
        for (w, queues) in new.take_queues(self.workers).into_iter().enumerate() {
            let r = workers.call(w, move |dp: &mut Datapath| dp.replace_underlay(queues));
            if let Err(e) = r.and_then(|r| r) {
                tracing::error!(worker = w, error = %e, "underlay sockets not taken over");
            }
        }
        *u = new;
    }

    /// The configured links that exist now (one deleted is left out until it is
    /// back).
    fn present_links(&mut self) -> Result<Vec<LinkInfo>, UnderlayError> {
        let mut links = Vec::new();
        for name in &self.cfg.underlay {
            match self.nl.link_by_name(name) {
                Ok(l) => links.push(l),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::warn!(iface = %name, "underlay interface is gone; left out until it is back");
                }
                Err(error) => {
                    return Err(UnderlayError::Link {
                        iface: name.clone(),
                        error,
                    })
                }
            }
        }
        Ok(links)
    }

    /// Gives the engines the smallest MTU of the links there are, when it changed,
    /// and names the ports that no longer fit (`xdeadm mtu PORT` shows why).
    fn follow_mtu(&mut self, workers: &Workers<Datapath>, facts: &[Option<LinkFacts>]) {
        let Some(mtu) = facts.iter().flatten().map(|f| f.mtu).min() else {
            return;
        };
        if mtu == self.engine_mtu {
            return;
        }
        let Ok(engine_mtu) = u16::try_from(mtu) else {
            tracing::error!(mtu, "underlay MTU is above 65535: not applied");
            return;
        };
        tracing::info!(from = self.engine_mtu, to = mtu, "underlay MTU changed");
        self.engine_mtu = mtu;
        let mut too_big = Vec::new();
        for w in 0..workers.count() {
            match workers.call(w, move |dp: &mut Datapath| dp.set_underlay_mtu(engine_mtu)) {
                Ok(Ok(ports)) => too_big.extend(ports),
                Ok(Err(e)) | Err(e) => {
                    tracing::error!(worker = w, error = %e, "underlay MTU not applied");
                }
            }
        }
        if !too_big.is_empty() {
            tracing::warn!(
                underlay_mtu = mtu, ports = ?too_big,
                "ports whose MTU no longer fits the underlay: their large packets get \
                 Packet Too Big (see `xdeadm mtu PORT`)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: usize = 9000 + FRAME_OVERHEAD;

    fn facts(ifindex: u32, mtu: u32, queues: u32) -> Option<LinkFacts> {
        Some(LinkFacts {
            ifindex,
            mtu,
            queues,
        })
    }

    /// Re-attach when a link goes, comes back, is re-created or changes its
    /// queues, or when its MTU outgrows the slots; not for an MTU change that
    /// fits, and not for a link that stays away.
    #[test]
    fn reattach_reason_names_the_change() {
        let names = ["ul0".to_string(), "ul1".to_string()];
        let attached = [facts(2, 9000, 1), None];
        let why = |now: &[Option<LinkFacts>]| reattach_reason(&names, now, &attached, SLOT);
        assert_eq!(why(&[facts(2, 9000, 1), None]), None);
        assert_eq!(why(&[facts(2, 4000, 1), None]), None, "a smaller MTU fits");
        assert_eq!(why(&[None, None]).as_deref(), Some("ul0 is gone"));
        assert_eq!(
            why(&[facts(5, 9000, 1), None]).as_deref(),
            Some("ul0 was re-created (ifindex 2 now 5)")
        );
        assert_eq!(
            why(&[facts(2, 9000, 2), None]).as_deref(),
            Some("ul0 has 2 rx queues, 1 were attached")
        );
        assert_eq!(
            why(&[facts(2, 9100, 1), None]).as_deref(),
            Some("ul0's MTU 9100 outgrew the 9018-byte transmit slots")
        );
        assert_eq!(
            why(&[facts(2, 9000, 1), facts(3, 9000, 1)]).as_deref(),
            Some("ul1 is there")
        );
    }

    /// A link's use is counted only when it changes (the first look is no
    /// change), and `stats` shows it with the link's facts.
    #[test]
    fn link_use_counts_changes_and_shows_in_stats() {
        let uses = Mutex::new(BTreeMap::new());
        note_use(&uses, "ul0", true);
        note_use(&uses, "ul1", false);
        note_use(&uses, "ul0", true);
        note_use(&uses, "ul0", false);
        note_use(&uses, "ul0", true);
        let uses = uses.into_inner().unwrap();
        assert_eq!(
            uses["ul0"],
            LinkUse {
                in_use: true,
                changes: 2
            }
        );
        assert_eq!(
            uses["ul1"],
            LinkUse {
                in_use: false,
                changes: 0
            }
        );
        let mut links = serde_json::json!([{"name": "ul0"}, {"name": "ul1"}, {"name": "x"}]);
        add_link_use(&mut links, &uses);
        assert_eq!(links[0]["in_use_changes"], 2);
        assert_eq!(links[1]["in_use"], false);
        assert!(links[2].get("in_use").is_none(), "a link never seen");
        let paths = BTreeMap::from([(
            "ul1".to_string(),
            LinkPaths {
                paths_down: 1,
                path_down_events: 3,
            },
        )]);
        add_link_paths(&mut links, &paths);
        assert_eq!(links[1]["paths_down"], 1);
        assert_eq!(links[1]["path_down_events"], 3);
        assert_eq!(links[0]["paths_down"], 0, "a link without paths down");
    }
}
