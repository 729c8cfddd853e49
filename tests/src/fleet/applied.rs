//! When a sled applied what: the "fleet batch applied" lines its daemon logs at
//! debug level (`overlayd::controller::fleet=debug`, which [`super::FleetRack`]
//! turns on), each with the number of changes, whether it was a full read, the
//! batch's revision, and the time it was logged (after the batch was applied).
//! The writer's clock is the same host clock, so "applied − committed" is a
//! latency without polling the sleds.

use crate::{Error, Result};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What the daemon logs after applying a batch.
pub const BATCH_APPLIED: &str = "fleet batch applied";

/// One applied batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    /// When the line was logged: the batch had been applied.
    pub at: SystemTime,
    pub changes: usize,
    pub full_read: bool,
    /// The highest position the batch moves a prefix to.
    pub revision: i64,
}

/// Every batch a daemon's `log` says it applied, in order.
pub fn batches(log: &str) -> Vec<Batch> {
    log.lines()
        .filter(|l| l.contains(BATCH_APPLIED))
        .filter_map(batch)
        .collect()
}

/// `2026-12-02T05:23:11.167024Z DEBUG overlayd::controller::fleet: fleet batch
/// applied changes=1 full_read=false revision=5`.
fn batch(line: &str) -> Option<Batch> {
    let at = rfc3339(line.split_whitespace().next()?)?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
    };
    Some(Batch {
        at,
        changes: field("changes")?.parse().ok()?,
        full_read: field("full_read")?.parse().ok()?,
        revision: field("revision")?.parse().ok()?,
    })
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` (UTC, as tracing's default timer writes it).
fn rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(str::parse::<u64>);
    let (h, min, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Nanoseconds from the fraction's first nine digits.
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let nanos: u32 = digits.parse().ok()?;
    let days = u64::try_from(days_from_civil(y, m, day)).ok()?;
    let secs = days * 86_400 + h * 3600 + min * 60 + sec;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Days from 1970-01-01 to the proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// When each write of `writes` (its number of changes and its revision, in
/// commit order) was applied, from the `batches` of one sled logged at or after
/// `since`: the changes of the batches that are not full reads add up, in order,
/// to the writes' (each write's changes are events of prefixes that only these
/// writes change; each of them changed a key, so each is one event). Fails if the
/// counts do not add up (a change missing, or one applied twice), if a batch
/// holding a write's last change is below its revision, or if a full read came
/// in between (nothing can be attributed then).
pub fn applied_at(
    writes: &[(usize, i64)],
    batches: &[Batch],
    since: SystemTime,
) -> Result<Vec<SystemTime>> {
    let batches: Vec<&Batch> = batches
        .iter()
        .filter(|b| b.at >= since && b.changes > 0)
        .collect();
    if let Some(b) = batches.iter().find(|b| b.full_read) {
        return Err(Error::new(format!("a full read came in between: {b:?}")));
    }
    let mut out = Vec::with_capacity(writes.len());
    let mut it = batches.iter();
    // Changes of the current batch not yet attributed.
    let mut left = 0;
    let mut current: Option<&Batch> = None;
    for (i, &(changes, revision)) in writes.iter().enumerate() {
        let mut need = changes;
        while need > 0 {
            if left == 0 {
                let b = it.next().ok_or_else(|| {
                    Error::new(format!(
                        "write {i} (revision {revision}) is in no batch: {} batches \
                         of {} changes for {} writes of {} changes",
                        batches.len(),
                        batches.iter().map(|b| b.changes).sum::<usize>(),
                        writes.len(),
                        writes.iter().map(|w| w.0).sum::<usize>()
                    ))
                })?;
                left = b.changes;
                current = Some(b);
            }
            let take = need.min(left);
            need -= take;
            left -= take;
        }
        let b = current.ok_or_else(|| Error::new(format!("write {i} has no changes")))?;
        if b.revision < revision {
            return Err(Error::new(format!(
                "write {i} (revision {revision}) counted in a batch of revision {}: {b:?}",
                b.revision
            )));
        }
        out.push(b.at);
    }
    let extra: usize = left + it.map(|b| b.changes).sum::<usize>();
    if extra > 0 {
        return Err(Error::new(format!(
            "{extra} changes applied beyond the {} writes",
            writes.len()
        )));
    }
    Ok(out)
}

/// A sample of durations, for reports: min, median, p90, p99, max.
#[derive(Clone, Debug)]
pub struct Distribution {
    sorted: Vec<f64>,
}

impl Distribution {
    /// Seconds; negative values allowed (a clock read after the event).
    pub fn new(mut seconds: Vec<f64>) -> Distribution {
        seconds.sort_by(f64::total_cmp);
        Distribution { sorted: seconds }
    }

    /// `after − before` of each pair, in seconds.
    pub fn between(pairs: impl IntoIterator<Item = (SystemTime, SystemTime)>) -> Distribution {
        Distribution::new(
            pairs
                .into_iter()
                .map(|(before, after)| match after.duration_since(before) {
                    Ok(d) => d.as_secs_f64(),
                    Err(e) => -e.duration().as_secs_f64(),
                })
                .collect(),
        )
    }

    /// Every value, sorted, in seconds.
    pub fn seconds(&self) -> &[f64] {
        &self.sorted
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `q` quantile (0.0 to 1.0; nearest rank), in seconds; NaN when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.sorted.is_empty() {
            return f64::NAN;
        }
        let rank = (q * self.sorted.len() as f64).ceil() as usize;
        self.sorted[rank.clamp(1, self.sorted.len()) - 1]
    }

    pub fn max(&self) -> f64 {
        self.quantile(1.0)
    }
}

impl fmt::Display for Distribution {
    /// `n=800 min 3.1 ms, median 5.2 ms, p90 9.0 ms, p99 20.3 ms, max 31.0 ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |q: f64| self.quantile(q) * 1000.0;
        write!(
            f,
            "n={} min {:.1} ms, median {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.len(),
            ms(0.0),
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(1.0)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
2026-12-02T05:23:11.167024Z  INFO overlayd::fleet::watcher: fleet store connected endpoint=\"x\" revision=1
2026-12-02T05:23:11.200000Z DEBUG overlayd::controller::fleet: fleet batch applied changes=4 full_read=true revision=5
2026-12-02T05:23:12.000000Z DEBUG overlayd::controller::fleet: fleet batch applied changes=0 full_read=false revision=6
2026-12-02T05:23:12.500000Z DEBUG overlayd::controller::fleet: fleet batch applied changes=1 full_read=false revision=7
2026-12-02T05:23:12.700000Z DEBUG overlayd::controller::fleet: fleet batch applied changes=3 full_read=false revision=11
";

    fn at(s: &str) -> SystemTime {
        rfc3339(s).unwrap()
    }

    #[test]
    fn timestamps_are_utc_seconds_since_the_epoch() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(UNIX_EPOCH));
        assert_eq!(
            rfc3339("2000-03-01T00:00:01.5Z"),
            Some(UNIX_EPOCH + Duration::from_millis(951_868_801_500))
        );
        assert_eq!(
            at("2026-12-02T05:23:11.167024Z")
                .duration_since(UNIX_EPOCH)
                .unwrap(),
            Duration::new(1_796_188_991, 167_024_000)
        );
        assert_eq!(rfc3339("2026-12-02 05:23:11Z"), None);
    }

    #[test]
    fn batches_are_read_and_writes_attributed_in_order() {
        let b = batches(LOG);
        assert_eq!(b.len(), 4);
        assert_eq!(
            b[0],
            Batch {
                at: at("2026-12-02T05:23:11.2Z"),
                changes: 4,
                full_read: true,
                revision: 5
            }
        );
        let since = at("2026-12-02T05:23:11.5Z");
        let applied = applied_at(&[(1, 7), (1, 9), (2, 11)], &b, since).unwrap();
        assert_eq!(
            applied,
            [
                at("2026-12-02T05:23:12.5Z"),
                at("2026-12-02T05:23:12.7Z"),
                at("2026-12-02T05:23:12.7Z")
            ]
        );
        // One change too many, one too few, a revision above its batch's.
        assert!(applied_at(&[(1, 7), (1, 9)], &b, since).is_err());
        assert!(applied_at(&[(1, 7), (1, 9), (3, 11)], &b, since).is_err());
        assert!(applied_at(&[(1, 8), (3, 11)], &b, since).is_err());
        // A full read in the window.
        assert!(applied_at(&[(4, 5)], &b, UNIX_EPOCH).is_err());
    }

    #[test]
    fn distributions_use_nearest_ranks() {
        let d = Distribution::new((1..=100).rev().map(f64::from).collect());
        assert_eq!(
            (d.quantile(0.0), d.quantile(0.5), d.quantile(0.99), d.max()),
            (1.0, 50.0, 99.0, 100.0)
        );
        let t = UNIX_EPOCH + Duration::from_secs(10);
        let d = Distribution::between([(t, t + Duration::from_millis(5)), (t, UNIX_EPOCH)]);
        assert_eq!((d.quantile(0.0), d.max()), (-10.0, 0.005));
        assert!(Distribution::new(vec![]).quantile(0.5).is_nan());
    }
}
