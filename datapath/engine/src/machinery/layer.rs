//! Layers: a name and two rule tables (inbound, outbound) sorted by priority.
//!
//! A layer answers "which rule decides this flow?". Rules are consulted in priority
//! order (lower first; ties in insertion order) and the first whose predicates all
//! hold wins. Layers are only consulted when the unified flow table misses, so the
//! match counters count *flows* (first packets), not packets.

use crate::machinery::rule::{Direction, Finalized, MatchFields, Predicate, Priority, Rule};
use core::fmt::Display;
use serde::Serialize;

/// A rule's identity inside its layer, stable until the rule is removed.
pub type RuleId = u64;

/// A finalized rule installed in a layer, with its counter.
#[derive(Clone, Debug)]
struct Installed<A> {
    id: RuleId,
    rule: Rule<Finalized, A>,
    hits: u64,
}

/// One direction's rule table.
#[derive(Clone, Debug)]
struct Table<A> {
    rules: Vec<Installed<A>>,
    /// Flows no rule matched (the caller applies the layer's default).
    misses: u64,
    /// Flows this layer denied (by rule or by default), counted by the caller's verdict.
    denied: u64,
    /// Rules with a `Vni` predicate: while there are none, nobody works out a
    /// packet's VPC for this table.
    vni_rules: usize,
}

impl<A> Default for Table<A> {
    fn default() -> Self {
        Table {
            rules: Vec::new(),
            misses: 0,
            denied: 0,
            vni_rules: 0,
        }
    }
}

impl<A> Table<A> {
    fn recount(&mut self) {
        self.vni_rules = self.rules.iter().filter(|r| r.rule.uses_vni()).count();
    }
}

/// A named pair of rule tables.
#[derive(Clone, Debug)]
pub struct Layer<A> {
    name: &'static str,
    inbound: Table<A>,
    outbound: Table<A>,
    next_id: RuleId,
}

impl<A: Clone + Display> Layer<A> {
    pub fn new(name: &'static str) -> Self {
        Layer {
            name,
            inbound: Table::default(),
            outbound: Table::default(),
            next_id: 1,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    fn table(&self, dir: Direction) -> &Table<A> {
        match dir {
            Direction::In => &self.inbound,
            Direction::Out => &self.outbound,
        }
    }

    fn table_mut(&mut self, dir: Direction) -> &mut Table<A> {
        match dir {
            Direction::In => &mut self.inbound,
            Direction::Out => &mut self.outbound,
        }
    }

    /// Installs a rule and returns its id.
    pub fn add(&mut self, dir: Direction, rule: Rule<Finalized, A>) -> RuleId {
        let id = self.next_id;
        self.next_id += 1;
        let t = self.table_mut(dir);
        // After every rule of lower-or-equal priority: ties keep insertion order.
        let at = t
            .rules
            .partition_point(|r| r.rule.priority() <= rule.priority());
        t.vni_rules += usize::from(rule.uses_vni());
        t.rules.insert(at, Installed { id, rule, hits: 0 });
        id
    }

    /// Removes a rule by id; false if the direction holds no such rule.
    pub fn remove(&mut self, dir: Direction, id: RuleId) -> bool {
        let t = self.table_mut(dir);
        let before = t.rules.len();
        t.rules.retain(|r| r.id != id);
        t.recount();
        t.rules.len() != before
    }

    /// Removes every rule of both directions (counters of the layer stay).
    pub fn clear(&mut self) {
        self.inbound.rules.clear();
        self.outbound.rules.clear();
        self.inbound.recount();
        self.outbound.recount();
    }

    /// Whether a rule of direction `dir` matches on the packet's VPC
    /// ([`crate::machinery::rule::Predicate::Vni`]): the caller then fills in
    /// [`MatchFields::vpc_vni`].
    #[inline]
    pub fn uses_vni(&self, dir: Direction) -> bool {
        self.table(dir).vni_rules != 0
    }

    /// The action of the first matching rule, counting nothing (a look ahead).
    pub fn peek(&self, dir: Direction, f: &MatchFields) -> Option<&A> {
        self.table(dir)
            .rules
            .iter()
            .find(|r| r.rule.matches(f))
            .map(|r| r.rule.action())
    }

    /// Removes the rules for which `f` is true; returns how many.
    pub fn remove_where(
        &mut self,
        dir: Direction,
        f: impl Fn(&Rule<Finalized, A>) -> bool,
    ) -> usize {
        let t = self.table_mut(dir);
        let before = t.rules.len();
        t.rules.retain(|r| !f(&r.rule));
        t.recount();
        before - t.rules.len()
    }

    /// The action of the first matching rule, counting the match; `None` if no rule
    /// matched (the caller applies its default).
    pub fn evaluate(&mut self, dir: Direction, f: &MatchFields) -> Option<(RuleId, &A)> {
        let t = self.table_mut(dir);
        match t.rules.iter_mut().find(|r| r.rule.matches(f)) {
            Some(r) => {
                r.hits += 1;
                Some((r.id, r.rule.action()))
            }
            None => {
                t.misses += 1;
                None
            }
        }
    }

    /// Counts a flow this layer denied.
    pub fn count_deny(&mut self, dir: Direction) {
        self.table_mut(dir).denied += 1;
    }

    /// The rules of one direction in evaluation order.
    pub fn rules(&self, dir: Direction) -> impl Iterator<Item = (RuleId, &Rule<Finalized, A>)> {
        self.table(dir).rules.iter().map(|r| (r.id, &r.rule))
    }

    pub fn len(&self, dir: Direction) -> usize {
        self.table(dir).rules.len()
    }

    /// The layer as `dump-layer` shows it. `defaults` names what happens to a flow no
    /// rule matches, per direction (in, out).
    pub fn dump(&self, defaults: (&str, &str)) -> LayerDump {
        let side = |t: &Table<A>, default: &str| TableDump {
            default_action: default.to_string(),
            rules: t
                .rules
                .iter()
                .map(|r| RuleDump {
                    id: r.id,
                    priority: r.rule.priority(),
                    predicates: r.rule.predicates().to_vec(),
                    action: r.rule.action().to_string(),
                    hits: r.hits,
                })
                .collect(),
            no_match: t.misses,
            denied: t.denied,
        };
        LayerDump {
            name: self.name.to_string(),
            inbound: side(&self.inbound, defaults.0),
            outbound: side(&self.outbound, defaults.1),
        }
    }
}

/// One rule in a dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleDump {
    pub id: RuleId,
    pub priority: Priority,
    pub predicates: Vec<Predicate>,
    pub action: String,
    /// Flows this rule decided.
    pub hits: u64,
}

/// One direction of a layer in a dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TableDump {
    /// What happens to a flow no rule matches.
    pub default_action: String,
    pub rules: Vec<RuleDump>,
    /// Flows no rule matched.
    pub no_match: u64,
    /// Flows this layer denied.
    pub denied: u64,
}

/// `dump-layer` output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerDump {
    pub name: String,
    pub inbound: TableDump,
    pub outbound: TableDump,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinery::flow::FlowKey;

    fn f(dst: &str) -> MatchFields {
        MatchFields {
            key: FlowKey {
                vni: 1,
                proto: 6,
                src_ip: "10.0.0.1".parse().unwrap(),
                dst_ip: dst.parse().unwrap(),
                src_port: 1,
                dst_port: 2,
                icmp_type: 0,
                icmp_code: 0,
            },
            icmp_type: None,
            vpc_vni: None,
        }
    }

    fn rule(prio: Priority, dst: &str, action: &'static str) -> Rule<Finalized, &'static str> {
        Rule::new(prio, action)
            .matching(Predicate::DstIp(dst.parse().unwrap()))
            .finalize()
            .unwrap()
    }

    #[test]
    fn lowest_priority_value_wins_and_ties_keep_order() {
        let mut l = Layer::new("test");
        l.add(Direction::Out, rule(50, "0.0.0.0/0", "wide"));
        let narrow = l.add(Direction::Out, rule(10, "10.0.0.0/8", "narrow"));
        l.add(Direction::Out, rule(10, "10.0.0.0/8", "second"));
        assert_eq!(
            l.evaluate(Direction::Out, &f("10.9.9.9")).unwrap(),
            (narrow, &"narrow")
        );
        assert_eq!(
            l.evaluate(Direction::Out, &f("8.8.8.8")).unwrap().1,
            &"wide"
        );
        // The inbound table is separate.
        assert!(l.evaluate(Direction::In, &f("8.8.8.8")).is_none());
        let d = l.dump(("deny", "allow"));
        assert_eq!(d.outbound.rules[0].hits, 1);
        assert_eq!(d.outbound.rules[0].action, "narrow");
        assert_eq!(d.outbound.rules[2].hits, 1);
        assert_eq!(d.inbound.no_match, 1);
        assert!(l.remove(Direction::Out, narrow));
        assert!(!l.remove(Direction::Out, narrow));
        assert_eq!(
            l.evaluate(Direction::Out, &f("10.9.9.9")).unwrap().1,
            &"second"
        );
    }

    /// `uses_vni` follows the rules as they come and go (the outbound path works a
    /// packet's VPC out only while it is true).
    #[test]
    fn vni_rules_are_counted_per_direction() {
        let vni = |prio| {
            Rule::new(prio, "vpc")
                .matching(Predicate::Vni(10))
                .finalize()
                .unwrap()
        };
        let mut l = Layer::new("test");
        assert!(!l.uses_vni(Direction::Out));
        let a = l.add(Direction::Out, vni(1));
        let b = l.add(Direction::Out, vni(2));
        l.add(Direction::Out, rule(3, "10.0.0.0/8", "plain"));
        assert!(l.uses_vni(Direction::Out) && !l.uses_vni(Direction::In));
        assert!(l.remove(Direction::Out, a));
        assert!(l.uses_vni(Direction::Out), "one is left");
        assert!(l.remove(Direction::Out, b));
        assert!(!l.uses_vni(Direction::Out));
        l.add(Direction::In, vni(1));
        assert!(l.uses_vni(Direction::In));
        assert_eq!(
            l.remove_where(Direction::In, super::super::rule::Rule::uses_vni),
            1,
            "removed by predicate"
        );
        assert!(!l.uses_vni(Direction::In));
        l.add(Direction::In, vni(1));
        l.clear();
        assert!(!l.uses_vni(Direction::In));
        // A look ahead counts nothing.
        let mut f = f("10.1.1.1");
        f.vpc_vni = Some(10);
        l.add(Direction::Out, vni(1));
        assert_eq!(l.peek(Direction::Out, &f), Some(&"vpc"));
        let d = l.dump(("deny", "allow"));
        assert_eq!((d.outbound.rules[0].hits, d.outbound.no_match), (0, 0));
    }
}
