//! Selection rules: which layers of a stack a machine gets.
//!
//! A rule is a predicate over a [`Machine`]: its role (`control-plane` or `worker`), its GPU
//! vendors, whether it has hardware virtualization and whether it booted with UEFI firmware,
//! combined with `all(..)`, `any(..)` and `not(..)`. The base layer has no rule: every machine
//! gets it. The same code answers the question in the builder (`ingot inspect`) and in the writer.
//!
//! A rule has two forms:
//!
//! - **text**, used in manifests and tables:
//!   `role == control-plane`, `gpu == nvidia`, `virt`, `uefi`, `all(gpu == nvidia, virt)`,
//!   `any(role == worker, not(uefi))`. `role != worker` is shorthand for `not(role == worker)`.
//! - **JSON**, used in the stack descriptor: `{"role":"control-plane"}`, `{"gpu":"nvidia"}`,
//!   `"virt"`, `"uefi"`, `{"all":[..]}`, `{"any":[..]}`, `{"not":..}`.
//!
//! [`Rule`]'s serde implementation is the JSON form; [`TextRule`] wraps a rule whose serde form is
//! the text (for TOML).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a node does in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Runs the Kubernetes control plane (and etcd).
    ControlPlane,
    /// Runs workloads only.
    Worker,
}

impl Role {
    /// Every role, in display order.
    pub const ALL: [Role; 2] = [Role::ControlPlane, Role::Worker];

    /// The name used in rules, manifests and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::ControlPlane => "control-plane",
            Role::Worker => "worker",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = RuleError;
    fn from_str(s: &str) -> Result<Self, RuleError> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| RuleError::UnknownValue {
                what: "role",
                value: s.to_owned(),
                expected: "control-plane, worker",
            })
    }
}

/// A GPU vendor a layer can be selected for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuVendor {
    /// NVIDIA (PCI vendor 0x10de).
    Nvidia,
}

impl GpuVendor {
    /// Every vendor, in display order.
    pub const ALL: [GpuVendor; 1] = [GpuVendor::Nvidia];

    /// The name used in rules, manifests and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuVendor::Nvidia => "nvidia",
        }
    }
}

impl fmt::Display for GpuVendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GpuVendor {
    type Err = RuleError;
    fn from_str(s: &str) -> Result<Self, RuleError> {
        GpuVendor::ALL
            .into_iter()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| RuleError::UnknownValue {
                what: "gpu vendor",
                value: s.to_owned(),
                expected: "nvidia",
            })
    }
}

/// What the selection rules look at: the facts about one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// The node's role.
    pub role: Role,
    /// GPU vendors present (a machine may have none, or several).
    #[serde(default)]
    pub gpus: Vec<GpuVendor>,
    /// Hardware virtualization available (vmx/svm and /dev/kvm).
    #[serde(default)]
    pub virt: bool,
    /// Booted with UEFI firmware.
    #[serde(default)]
    pub uefi: bool,
}

impl Machine {
    /// A machine of `role` with no GPU, no virtualization and no UEFI.
    pub fn new(role: Role) -> Self {
        Machine {
            role,
            gpus: Vec::new(),
            virt: false,
            uefi: false,
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "role={}", self.role)?;
        for g in &self.gpus {
            write!(f, " gpu={g}")?;
        }
        if self.virt {
            f.write_str(" virt")?;
        }
        if self.uefi {
            f.write_str(" uefi")?;
        }
        Ok(())
    }
}

/// A selection rule. Its serde form is the JSON form (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The machine has this role.
    Role(Role),
    /// The machine has a GPU of this vendor.
    Gpu(GpuVendor),
    /// The machine has hardware virtualization.
    Virt,
    /// The machine booted with UEFI firmware.
    Uefi,
    /// Every rule holds (true when empty).
    All(Vec<Rule>),
    /// At least one rule holds (false when empty).
    Any(Vec<Rule>),
    /// The rule does not hold.
    Not(Box<Rule>),
}

/// Deepest nesting a rule may have; guards the parsers' recursion against hostile input.
pub const MAX_DEPTH: usize = 32;

impl Rule {
    /// Whether `machine` satisfies the rule.
    pub fn matches(&self, machine: &Machine) -> bool {
        match self {
            Rule::Role(r) => machine.role == *r,
            Rule::Gpu(g) => machine.gpus.contains(g),
            Rule::Virt => machine.virt,
            Rule::Uefi => machine.uefi,
            Rule::All(rules) => rules.iter().all(|r| r.matches(machine)),
            Rule::Any(rules) => rules.iter().any(|r| r.matches(machine)),
            Rule::Not(rule) => !rule.matches(machine),
        }
    }

    /// How deeply the rule nests (a predicate is 1).
    pub fn depth(&self) -> usize {
        match self {
            Rule::Role(_) | Rule::Gpu(_) | Rule::Virt | Rule::Uefi => 1,
            Rule::All(rules) | Rule::Any(rules) => {
                1 + rules.iter().map(Rule::depth).max().unwrap_or(0)
            }
            Rule::Not(rule) => 1 + rule.depth(),
        }
    }
}

/// Whether a layer with rule `when` goes to `machine`: a layer without a rule (the base layer)
/// goes to every machine.
pub fn selects(when: Option<&Rule>, machine: &Machine) -> bool {
    when.is_none_or(|rule| rule.matches(machine))
}

/// Why a rule's text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// A name that is not a known role or vendor.
    #[error("unknown {what} `{value}` (expected one of: {expected})")]
    UnknownValue {
        /// What kind of value.
        what: &'static str,
        /// The value given.
        value: String,
        /// The accepted values.
        expected: &'static str,
    },
    /// The text does not follow the grammar.
    #[error("rule `{text}`: {reason} at column {column}")]
    Syntax {
        /// The whole rule text.
        text: String,
        /// 1-based column (in characters) where the problem is.
        column: usize,
        /// What was expected or found.
        reason: String,
    },
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("rule nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

impl fmt::Display for Rule {
    /// The text form; parsing it gives back the same rule.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Role(r) => write!(f, "role == {r}"),
            Rule::Gpu(g) => write!(f, "gpu == {g}"),
            Rule::Virt => f.write_str("virt"),
            Rule::Uefi => f.write_str("uefi"),
            Rule::All(rules) | Rule::Any(rules) => {
                f.write_str(if matches!(self, Rule::All(_)) {
                    "all("
                } else {
                    "any("
                })?;
                for (i, r) in rules.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{r}")?;
                }
                f.write_str(")")
            }
            Rule::Not(rule) => write!(f, "not({rule})"),
        }
    }
}

impl FromStr for Rule {
    type Err = RuleError;
    fn from_str(text: &str) -> Result<Self, RuleError> {
        let mut p = Parser {
            text,
            chars: text.char_indices().collect(),
            pos: 0,
        };
        let rule = p.rule(0)?;
        p.skip_ws();
        if p.pos < p.chars.len() {
            return Err(p.error("unexpected text after the rule"));
        }
        Ok(rule)
    }
}

/// Recursive-descent parser for the text form.
struct Parser<'a> {
    text: &'a str,
    chars: Vec<(usize, char)>,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, reason: &str) -> RuleError {
        RuleError::Syntax {
            text: self.text.to_owned(),
            column: self.pos + 1,
            reason: reason.to_owned(),
        }
    }

    fn skip_ws(&mut self) {
        while self.pos < self.chars.len() && self.chars[self.pos].1.is_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).map(|&(_, c)| c)
    }

    /// A word: letters, digits, `-`, `_`. Non-ASCII letters are taken into the word too (no
    /// name has one, so such a word is unknown), so that the message names the whole word.
    fn word(&mut self) -> Result<&str, RuleError> {
        self.skip_ws();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                self.pos += 1;
            } else {
                break;
            }
        }
        if start == self.pos {
            return Err(self.error("expected a name"));
        }
        let from = self.chars[start].0;
        let to = self
            .chars
            .get(self.pos)
            .map_or(self.text.len(), |&(i, _)| i);
        Ok(&self.text[from..to])
    }

    fn expect(&mut self, c: char) -> Result<(), RuleError> {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected `{c}`")))
        }
    }

    /// `==` or `!=`; returns true for `==`.
    fn comparison(&mut self) -> Result<bool, RuleError> {
        self.skip_ws();
        let two: String = self.chars[self.pos..]
            .iter()
            .take(2)
            .map(|&(_, c)| c)
            .collect();
        match two.as_str() {
            "==" => {
                self.pos += 2;
                Ok(true)
            }
            "!=" => {
                self.pos += 2;
                Ok(false)
            }
            _ => Err(self.error("expected `==` or `!=`")),
        }
    }

    fn rule(&mut self, depth: usize) -> Result<Rule, RuleError> {
        if depth >= MAX_DEPTH {
            return Err(RuleError::TooDeep);
        }
        let start = self.pos;
        let word = self.word()?.to_owned();
        let rule = match word.as_str() {
            "role" | "gpu" => {
                let eq = self.comparison()?;
                let value_pos = self.pos;
                let value = self.word()?.to_owned();
                let pred = if word == "role" {
                    Rule::Role(value.parse().map_err(|e| self.at(value_pos, e))?)
                } else {
                    Rule::Gpu(value.parse().map_err(|e| self.at(value_pos, e))?)
                };
                if eq {
                    pred
                } else {
                    Rule::Not(Box::new(pred))
                }
            }
            "virt" => Rule::Virt,
            "uefi" => Rule::Uefi,
            "all" | "any" => {
                self.expect('(')?;
                let mut rules = Vec::new();
                self.skip_ws();
                if self.peek() != Some(')') {
                    loop {
                        rules.push(self.rule(depth + 1)?);
                        self.skip_ws();
                        if self.peek() == Some(',') {
                            self.pos += 1;
                        } else {
                            break;
                        }
                    }
                }
                self.expect(')')?;
                if word == "all" {
                    Rule::All(rules)
                } else {
                    Rule::Any(rules)
                }
            }
            "not" => {
                self.expect('(')?;
                let inner = self.rule(depth + 1)?;
                self.expect(')')?;
                Rule::Not(Box::new(inner))
            }
            _ => {
                self.pos = start;
                self.skip_ws();
                return Err(self.error(&format!(
                    "unknown predicate `{word}` (expected role, gpu, virt, uefi, all, any, not)"
                )));
            }
        };
        Ok(rule)
    }

    /// Turn a value error into a syntax error pointing at the value.
    fn at(&self, value_pos: usize, err: RuleError) -> RuleError {
        let mut pos = value_pos;
        while pos < self.chars.len() && self.chars[pos].1.is_whitespace() {
            pos += 1;
        }
        RuleError::Syntax {
            text: self.text.to_owned(),
            column: pos + 1,
            reason: err.to_string(),
        }
    }
}

/// A rule whose serde form is the text form (`"all(gpu == nvidia, virt)"`), for manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRule(pub Rule);

impl Serialize for TextRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TextRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map(TextRule).map_err(serde::de::Error::custom)
    }
}

/// Check a rule parsed from JSON (serde does not bound its recursion by our limit).
pub fn check_depth(rule: &Rule) -> Result<(), RuleError> {
    if rule.depth() > MAX_DEPTH {
        Err(RuleError::TooDeep)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(role: Role, gpu: bool, virt: bool, uefi: bool) -> Machine {
        Machine {
            role,
            gpus: if gpu { vec![GpuVendor::Nvidia] } else { vec![] },
            virt,
            uefi,
        }
    }

    #[test]
    fn text_round_trips() {
        for text in [
            "role == control-plane",
            "role == worker",
            "gpu == nvidia",
            "virt",
            "uefi",
            "all(gpu == nvidia, virt)",
            "any(role == worker, not(uefi))",
            "all()",
            "any(all(virt, uefi), not(gpu == nvidia))",
        ] {
            let rule: Rule = text.parse().unwrap();
            assert_eq!(rule.to_string(), text);
            let again: Rule = rule.to_string().parse().unwrap();
            assert_eq!(again, rule);
        }
    }

    #[test]
    fn whitespace_and_not_equal() {
        let rule: Rule = "  all( gpu==nvidia ,virt )  ".parse().unwrap();
        assert_eq!(
            rule,
            Rule::All(vec![Rule::Gpu(GpuVendor::Nvidia), Rule::Virt])
        );
        let rule: Rule = "role != worker".parse().unwrap();
        assert_eq!(rule, Rule::Not(Box::new(Rule::Role(Role::Worker))));
    }

    #[test]
    fn json_form() {
        let rule: Rule = "all(role == control-plane, gpu == nvidia, virt, not(uefi))"
            .parse()
            .unwrap();
        let json = serde_json::to_string(&rule).unwrap();
        assert_eq!(
            json,
            r#"{"all":[{"role":"control-plane"},{"gpu":"nvidia"},"virt",{"not":"uefi"}]}"#
        );
        let back: Rule = serde_json::from_str(&json).unwrap();
        assert_eq!(back, rule);
        assert!(serde_json::from_str::<Rule>(r#"{"role":"boss"}"#).is_err());
        assert!(serde_json::from_str::<Rule>(r#""gpu""#).is_err());
    }

    #[test]
    fn errors_name_the_problem() {
        let cases = [
            ("role == boss", "unknown role `boss`", 9),
            ("role == contról-plane", "unknown role `contról-plane`", 9),
            ("gpu == amd", "unknown gpu vendor `amd`", 8),
            ("role = worker", "expected `==` or `!=`", 6),
            ("all(virt, uefi", "expected `)`", 15),
            ("virt uefi", "unexpected text after the rule", 6),
            ("kvm", "unknown predicate `kvm`", 1),
            ("", "expected a name", 1),
            ("not virt", "expected `(`", 5),
        ];
        for (text, want, want_col) in cases {
            match text.parse::<Rule>() {
                Err(RuleError::Syntax { reason, column, .. }) => {
                    assert!(reason.contains(want), "{text}: {reason}");
                    assert_eq!(column, want_col, "{text}: {reason}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "not(".repeat(100) + "virt" + &")".repeat(100);
        assert_eq!(deep.parse::<Rule>(), Err(RuleError::TooDeep));
        let ok = "not(".repeat(10) + "virt" + &")".repeat(10);
        assert!(ok.parse::<Rule>().is_ok());
    }

    #[test]
    fn selection_table() {
        let cp: Rule = "role == control-plane".parse().unwrap();
        let gpu: Rule = "gpu == nvidia".parse().unwrap();
        let kata: Rule = "all(virt, uefi)".parse().unwrap();
        let cases = [
            (
                machine(Role::ControlPlane, false, false, true),
                [true, true, false, false],
            ),
            (
                machine(Role::Worker, true, false, true),
                [true, false, true, false],
            ),
            (
                machine(Role::Worker, true, true, true),
                [true, false, true, true],
            ),
            (
                machine(Role::Worker, false, true, false),
                [true, false, false, false],
            ),
        ];
        for (m, want) in cases {
            let got = [
                selects(None, &m),
                selects(Some(&cp), &m),
                selects(Some(&gpu), &m),
                selects(Some(&kata), &m),
            ];
            assert_eq!(got, want, "{m}");
        }
        assert!(Rule::All(vec![]).matches(&Machine::new(Role::Worker)));
        assert!(!Rule::Any(vec![]).matches(&Machine::new(Role::Worker)));
    }

    #[test]
    fn text_rule_in_toml() {
        #[derive(Deserialize)]
        struct Doc {
            when: TextRule,
        }
        let doc: Doc = toml::from_str(r#"when = "any(role == worker, virt)""#).unwrap();
        assert_eq!(
            doc.when.0,
            Rule::Any(vec![Rule::Role(Role::Worker), Rule::Virt])
        );
        let err = toml::from_str::<Doc>(r#"when = "role == boss""#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("unknown role `boss`"), "{err}");
    }
}
