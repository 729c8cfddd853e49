//! Reading `xdeadm --json stats` as flat `path.to.counter = value` pairs, so tests
//! name the counters they check without depending on the nesting of the output.

use crate::{Error, Result};
use serde_json::Value;

/// Guest GSO buffers the datapath segmented for the underlay (tunneled TSO).
pub const TSO_BUFFERS: &str = "tso_buffers_in";
/// Underlay segments those buffers were cut into.
pub const TSO_SEGMENTS: &str = "tso_segments_out";

/// Flattens a JSON document into (dotted path, number) pairs; non-numbers are skipped.
pub fn flatten(v: &Value) -> Vec<(String, u64)> {
    fn walk(v: &Value, path: &str, out: &mut Vec<(String, u64)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(v, &p, out);
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(v, &format!("{path}[{i}]"), out);
                }
            }
            Value::Number(n) => {
                if let Some(n) = n.as_u64() {
                    out.push((path.to_string(), n));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, "", &mut out);
    out
}

/// Parses `xdeadm --json` output and flattens it.
pub fn parse(json: &str) -> Result<Vec<(String, u64)>> {
    let v: Value = serde_json::from_str(json)
        .map_err(|e| Error::new(format!("stats are not JSON ({e}): {json}")))?;
    Ok(flatten(&v))
}

/// The sum of every counter whose last path element is `name` (a datapath-wide
/// counter may appear once per worker or per port).
pub fn sum(counters: &[(String, u64)], name: &str) -> u64 {
    counters
        .iter()
        .filter(|(p, _)| p.rsplit('.').next() == Some(name))
        .map(|(_, n)| n)
        .sum()
}

/// The value at exactly `path` (e.g. `port_mtu` or `ports[0].tso_buffers_in`).
pub fn get(counters: &[(String, u64)], path: &str) -> Option<u64> {
    counters.iter().find(|(p, _)| p == path).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattens_nested_objects_and_sums_by_leaf_name() {
        let c = parse(r#"{"a":{"tso_in":3,"x":"s"},"ports":[{"tso_in":4}],"b":-1}"#).unwrap();
        assert_eq!(
            c,
            vec![
                ("a.tso_in".to_string(), 3),
                ("ports[0].tso_in".to_string(), 4)
            ]
        );
        assert_eq!(sum(&c, "tso_in"), 7);
        assert_eq!(sum(&c, "x"), 0);
        assert_eq!(get(&c, "ports[0].tso_in"), Some(4));
        assert_eq!(get(&c, "tso_in"), None);
        assert!(parse("not json").is_err());
    }
}
