//! `--help` and docs/operating.md say the same thing. The parsers are read in
//! process (clap's `Command` of `xdeadm` and of `overlayd`), the docs from the
//! tables of their "Command reference" section, whose convention that section
//! states: one row per `xdeadm` verb with its arguments and flags (`--flag=DEFAULT`
//! for a flag with a default), one row per `overlayd` flag with its default. A
//! verb, argument, flag or default that is in one and not the other fails, naming
//! it; so does a `--flag` anywhere else in the page that neither program takes
//! (unless it is another tool's), and a log filter example whose target is no
//! module of the daemon.

use api::testing::stated_default;
use clap::{Arg, ArgAction, Command, CommandFactory};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn operating_md() -> String {
    std::fs::read_to_string(repo().join("docs/operating.md")).expect("docs/operating.md")
}

/// The command reference section: from its heading to the next `## ` heading.
fn reference(doc: &str) -> &str {
    let start = doc
        .find("\n## Command reference\n")
        .expect("docs/operating.md has a \"## Command reference\" section");
    let rest = &doc[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

/// The rows of the markdown table whose header row is `head` (cells trimmed).
fn table_rows(section: &str, head: &str) -> Vec<Vec<String>> {
    let mut lines = section.lines().skip_while(|l| l.trim() != head);
    assert!(
        lines.next().is_some(),
        "no table headed {head:?} in the command reference"
    );
    lines
        .skip(1) // the |---| row
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The `code spans` of a table cell, in order.
fn spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A flag as written in the docs: `-w/--write`, `--mtu`; its default, if any, after `=`.
fn split_flag(span: &str) -> (String, Option<String>) {
    match span.split_once('=') {
        Some((f, d)) => (f.to_string(), Some(d.to_string())),
        None => (span.to_string(), None),
    }
}

/// How the docs spell an option: `-w/--write`, `--mtu`.
fn flag_name(a: &Arg) -> String {
    let long = a.get_long().map(|l| format!("--{l}"));
    match (a.get_short(), long) {
        (Some(s), Some(l)) => format!("-{s}/{l}"),
        (Some(s), None) => format!("-{s}"),
        (None, Some(l)) => l,
        // Not an option clap builds; named by its id so that a difference shows it.
        (None, None) => a.get_id().to_string(),
    }
}

/// The default an option's help text states ([`stated_default`]).
fn help_default(a: &Arg) -> Option<String> {
    let help = [a.get_help(), a.get_long_help()]
        .into_iter()
        .flatten()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    stated_default(&help).map(str::to_string)
}

/// An option's default: clap's own (not the `false` of a switch), else the one its
/// help text states.
fn default_of(a: &Arg) -> Option<String> {
    let switch = matches!(
        a.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    );
    let clap: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !switch && !clap.is_empty() {
        return Some(clap.join(","));
    }
    help_default(a)
}

/// What a command takes: its positional arguments as the docs write them
/// (`PORT`, `[CLASS]`, `ENDPOINTS...`) and its options with their defaults.
#[derive(Debug, Default, PartialEq, Eq)]
struct Takes {
    positionals: Vec<String>,
    flags: BTreeMap<String, Option<String>>,
}

fn is_own(a: &Arg) -> bool {
    !a.is_hide_set() && !a.is_global_set() && !["help", "version"].contains(&a.get_id().as_str())
}

fn takes(c: &Command) -> Takes {
    let mut t = Takes::default();
    for a in c.get_arguments().filter(|a| is_own(a)) {
        if a.is_positional() {
            let name = match a.get_value_names() {
                Some(n) if !n.is_empty() => n
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => a.get_id().as_str().to_uppercase(),
            };
            let many = matches!(a.get_action(), ArgAction::Append);
            let name = if many { format!("{name}...") } else { name };
            t.positionals.push(if a.is_required_set() {
                name
            } else {
                format!("[{name}]")
            });
        } else {
            t.flags.insert(flag_name(a), default_of(a));
        }
    }
    t
}

/// Every command a user can run, by its words after the program name (`ra
/// listen`, `fleet set-v2p`): those without subcommands, and those with
/// subcommands that take something of their own (`ra PORT`).
fn verbs(c: &Command, prefix: &str, out: &mut BTreeMap<String, Takes>) {
    for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("{prefix}{}", sub.get_name());
        let t = takes(sub);
        let has_subs = sub.get_subcommands().any(|s| s.get_name() != "help");
        if !has_subs || !t.positionals.is_empty() || !t.flags.is_empty() {
            out.insert(name.clone(), t);
        }
        verbs(sub, &format!("{name} "), out);
    }
}

/// The parsers' side: every verb, and (as `xdeadm`) the options every verb takes.
fn xdeadm_verbs() -> BTreeMap<String, Takes> {
    let cli = xdeadm::cli::grammar::Cli::command();
    let mut out = BTreeMap::new();
    let mut global = Takes::default();
    for a in cli
        .get_arguments()
        .filter(|a| a.is_global_set() && !a.is_hide_set())
    {
        global.flags.insert(flag_name(a), default_of(a));
    }
    out.insert("xdeadm".to_string(), global);
    verbs(&cli, "", &mut out);
    out
}

/// The docs' side: the table headed `| verb | arguments | flags |`.
fn documented_verbs(doc: &str) -> BTreeMap<String, Takes> {
    let mut out = BTreeMap::new();
    for row in table_rows(reference(doc), "| verb | arguments | flags |") {
        let [verb, args, flags] = &row[..] else {
            panic!("a verb row has three cells: {row:?}");
        };
        let verb = spans(verb).concat();
        let t = Takes {
            positionals: spans(args),
            flags: spans(flags).iter().map(|f| split_flag(f)).collect(),
        };
        assert!(
            out.insert(verb.clone(), t).is_none(),
            "verb {verb} documented twice"
        );
    }
    out
}

/// Where the two sides differ, one line each.
fn differences(
    code: &BTreeMap<String, Takes>,
    docs: &BTreeMap<String, Takes>,
    code_name: &str,
) -> Vec<String> {
    let mut d = Vec::new();
    for (verb, t) in code {
        let Some(dt) = docs.get(verb) else {
            d.push(format!("{verb}: in {code_name}, not documented"));
            continue;
        };
        if t.positionals != dt.positionals {
            d.push(format!(
                "{verb}: {code_name} takes arguments {:?}, the docs say {:?}",
                t.positionals, dt.positionals
            ));
        }
        for (flag, default) in &t.flags {
            match dt.flags.get(flag) {
                None => d.push(format!("{verb}: {flag} is not documented")),
                Some(dd) if dd != default => d.push(format!(
                    "{verb} {flag}: default {default:?} in {code_name}, {dd:?} in the docs"
                )),
                Some(_) => {}
            }
        }
        for flag in dt.flags.keys().filter(|f| !t.flags.contains_key(*f)) {
            d.push(format!(
                "{verb}: {flag} is documented but {code_name} has no such flag"
            ));
        }
    }
    for verb in docs.keys().filter(|v| !code.contains_key(*v)) {
        d.push(format!(
            "{verb}: documented but {code_name} has no such verb"
        ));
    }
    d
}

/// A row for the docs, printed when they differ, so that fixing them is a paste.
fn row(verb: &str, t: &Takes) -> String {
    let code = |s: &String| format!("`{s}`");
    let args: Vec<String> = t.positionals.iter().map(code).collect();
    let flags: Vec<String> = t
        .flags
        .iter()
        .map(|(f, d)| match d {
            Some(d) => format!("`{f}={d}`"),
            None => format!("`{f}`"),
        })
        .collect();
    format!("| `{verb}` | {} | {} |", args.join(" "), flags.join(", "))
}

#[test]
fn every_xdeadm_verb_flag_and_default_is_documented_as_it_is() {
    let code = xdeadm_verbs();
    let docs = documented_verbs(&operating_md());
    let d = differences(&code, &docs, "xdeadm");
    let rows: Vec<String> = code.iter().map(|(v, t)| row(v, t)).collect();
    assert!(
        d.is_empty(),
        "docs/operating.md's command reference and `xdeadm --help` differ:\n{}\n\nthe rows as xdeadm has them:\n{}",
        d.join("\n"),
        rows.join("\n")
    );
}

/// `overlayd`'s flags: the table headed `| overlayd flag | default |`.
#[test]
fn every_overlayd_flag_and_default_is_documented_as_it_is() {
    let cli = overlayd::config::DaemonArgs::command();
    let mut code = BTreeMap::new();
    code.insert("overlayd".to_string(), takes(&cli));
    let mut flags = BTreeMap::new();
    for row in table_rows(reference(&operating_md()), "| overlayd flag | default |") {
        let [flag, default] = &row[..] else {
            panic!("an overlayd row has two cells: {row:?}");
        };
        let default = spans(default).first().cloned();
        assert!(
            flags.insert(spans(flag).concat(), default).is_none(),
            "{row:?} twice"
        );
    }
    let mut docs = BTreeMap::new();
    docs.insert(
        "overlayd".to_string(),
        Takes {
            positionals: Vec::new(),
            flags,
        },
    );
    let d = differences(&code, &docs, "overlayd");
    let rows: Vec<String> = code["overlayd"]
        .flags
        .iter()
        .map(|(f, d)| {
            format!(
                "| `{f}` | {} |",
                d.as_ref().map_or("-".into(), |d| format!("`{d}`"))
            )
        })
        .collect();
    assert!(
        d.is_empty(),
        "docs/operating.md's command reference and `overlayd --help` differ:\n{}\n\nthe rows as overlayd has them:\n{}",
        d.join("\n"),
        rows.join("\n")
    );
}

/// Long options of other programs that the page shows in their commands.
const OTHER_TOOLS: &[(&str, &str)] = &[
    ("--now", "systemctl enable --now"),
    (
        "--max-txn-ops",
        "etcd's limit on operations per transaction",
    ),
    (
        "--private-mac",
        "opteadm create-xde, which xdeadm does not take",
    ),
    (
        "--src-underlay-addr",
        "opteadm create-xde, which xdeadm does not take",
    ),
    (
        "--bsvc-addr",
        "opteadm create-xde, which xdeadm does not take",
    ),
    (
        "--bsvc-vni",
        "opteadm create-xde, which xdeadm does not take",
    ),
    (
        "--no-huge",
        "dpdk-testpmd's, the DPDK guest of the vhost-user section",
    ),
    ("--help", "clap's, every verb has it"),
    ("--flag", "the command reference's convention"),
    ("--long", "the command reference's convention"),
];

/// Every `--flag` the page names, in prose or examples, is one of `xdeadm`'s or
/// `overlayd`'s (or another tool's, listed above): a renamed flag cannot linger in
/// the text.
#[test]
fn every_flag_the_page_names_exists() {
    let mut known: BTreeSet<String> = OTHER_TOOLS.iter().map(|(f, _)| f.to_string()).collect();
    let longs = |t: &Takes| {
        t.flags
            .keys()
            .map(|f| f.rsplit('/').next().unwrap_or(f).to_string())
            .collect::<Vec<_>>()
    };
    for t in xdeadm_verbs().values() {
        known.extend(longs(t));
    }
    known.extend(longs(&takes(&overlayd::config::DaemonArgs::command())));
    // opteadm's own spellings that xdeadm takes (docs: "opteadm command lines").
    known.extend(
        [
            "--port",
            "--dir",
            "--hosts",
            "--protocol",
            "--private-mac",
            "--host-domain",
            "--dns-servers",
        ]
        .map(String::from),
    );
    let doc = operating_md();
    let mut unknown = BTreeSet::new();
    for (i, _) in doc.match_indices("--") {
        let before = doc[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '-') {
            continue;
        }
        let name: String = doc[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            continue;
        }
        let flag = format!("--{}", name.trim_end_matches('-'));
        if !known.contains(&flag) {
            unknown.insert(flag);
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/operating.md names flags neither xdeadm nor overlayd takes: {unknown:?}"
    );
}

/// The `overlayd::...` log targets that `overlayd --help` and the page give as
/// examples are modules of the daemon (a filter naming no target matches nothing,
/// silently).
#[test]
fn log_filter_examples_name_real_targets() {
    let cli = overlayd::config::DaemonArgs::command();
    let help = cli
        .get_arguments()
        .find(|a| a.get_long() == Some("log-level"))
        .and_then(|a| a.get_help().map(ToString::to_string))
        .expect("overlayd has --log-level with a help text");
    let doc = operating_md();
    let mut targets = BTreeSet::new();
    for text in [help.as_str(), doc.as_str()] {
        for (i, _) in text.match_indices("overlayd::") {
            let t: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            targets.insert(t.trim_end_matches(':').to_string());
        }
    }
    assert!(
        help.contains("overlayd::"),
        "--log-level's help gives a target example: {help}"
    );
    let src = repo().join("control/overlayd/src");
    for t in &targets {
        let path = t.trim_start_matches("overlayd::").replace("::", "/");
        let exists = [format!("{path}.rs"), format!("{path}/mod.rs")]
            .iter()
            .any(|p| src.join(p).is_file());
        assert!(
            exists,
            "log target {t} is no module of overlayd (no {path}.rs)"
        );
    }
}
