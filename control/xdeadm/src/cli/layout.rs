//! Plain-text layout shared by the renderers: aligned tables under a header row,
//! and any JSON value as indented `key: value` lines (an empty map or list as
//! `none`).

use std::fmt::Write as _;

pub(super) fn table(out: &mut String, head: &[&str], rows: Vec<Vec<String>>) {
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (c, w) in cells.zip(&width) {
            let _ = write!(s, "{c:<w$}  ");
        }
        let _ = writeln!(out, "{}", s.trim_end());
    };
    line(out, &mut head.iter().copied());
    for r in &rows {
        line(out, &mut r.iter().map(String::as_str));
    }
}

/// Prints nested objects as indented `key: value` lines and arrays of objects as
/// numbered entries, so any engine result is readable without a per-type printer.
pub(super) fn render_value(out: &mut String, v: &serde_json::Value, depth: usize) {
    let pad = "  ".repeat(depth);
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if is_empty(v) {
                    // An empty map or list (`tap_queues` with no tap port) would
                    // print as a key with nothing after it.
                    let _ = writeln!(out, "{pad}{k}: none");
                } else if v.is_object()
                    || v.as_array()
                        .is_some_and(|a| a.iter().any(|x| !x.is_string() && !x.is_number()))
                {
                    let _ = writeln!(out, "{pad}{k}:");
                    render_value(out, v, depth + 1);
                } else {
                    let _ = writeln!(out, "{pad}{k}: {}", scalar(v));
                }
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                if v.is_object() || v.is_array() {
                    let _ = writeln!(out, "{pad}[{i}]");
                    render_value(out, v, depth + 1);
                } else {
                    let _ = writeln!(out, "{pad}{}", scalar(v));
                }
            }
        }
        other => {
            let _ = writeln!(out, "{pad}{}", scalar(other));
        }
    }
}

/// An object or array with nothing in it.
fn is_empty(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(m) => m.is_empty(),
        serde_json::Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

pub(super) fn scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        serde_json::Value::Array(a) => a.iter().map(scalar).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}
