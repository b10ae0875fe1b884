//! Allowlists whose entries each name a rule: a function that brings Istio's result and ours to
//! common ground for one deliberate difference (it may change either side). A difference is
//! explained when the listed rules, applied in the list's order, make the two equal. The suites
//! whose outcomes are whole states (the installer's files, the agent's facets) use these, and
//! run their cases one after another through [`Suite::run`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::suite;

/// A rule: given the case, changes Istio's outcome and ours.
pub type Rule<C, T> = fn(&C, &mut T, &mut T);

/// One allowlist entry and its rule.
pub struct Entry<C, T> {
    pub id: String,
    rule: Rule<C, T>,
}

/// The entries of `tests/differential/<file>`, checked as [`suite::allowlist`] does; each
/// entry's `rule` must be one of `rules` (name, function).
pub fn load<C, T>(file: &str, rules: &[(&str, Rule<C, T>)]) -> Vec<Entry<C, T>> {
    let mut entries = Vec::new();
    for (id, e) in suite::allowlist(file) {
        let name = e["rule"].as_str();
        let name = name.unwrap_or_else(|| panic!("{file} entry {id}: no rule"));
        let rule = rules.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
        let rule = rule.unwrap_or_else(|| panic!("{file} entry {id}: unknown rule {name:?}"));
        entries.push(Entry { id, rule });
    }
    entries
}

/// Both outcomes with every entry's rule applied in order, except the entry at `skip`.
pub fn apply<C, T: Clone>(
    entries: &[Entry<C, T>],
    skip: Option<usize>,
    case: &C,
    istio: &T,
    ours: &T,
) -> (T, T) {
    let (mut a, mut b) = (istio.clone(), ours.clone());
    for (i, e) in entries.iter().enumerate() {
        if Some(i) != skip {
            (e.rule)(case, &mut a, &mut b);
        }
    }
    (a, b)
}

/// The ids of the entries that explain `ours != istio` (only those the case needs: an entry
/// whose rule can be left out is not counted); None when the rules together do not.
pub fn explain<C, T: Clone + PartialEq>(
    entries: &[Entry<C, T>],
    case: &C,
    istio: &T,
    ours: &T,
) -> Option<Vec<String>> {
    if istio == ours {
        return Some(Vec::new());
    }
    let equal = |skip| {
        let (a, b) = apply(entries, skip, case, istio, ours);
        a == b
    };
    if !equal(None) {
        return None;
    }
    Some(
        (0..entries.len())
            .filter(|i| !equal(Some(*i)))
            .map(|i| entries[i].id.clone())
            .collect(),
    )
}

/// A rule-list suite's run: its name, its allowlist, the seed and the number of cases.
pub struct Suite<'a, C, T> {
    pub name: &'a str,
    pub entries: &'a [Entry<C, T>],
    pub seed: u64,
    pub cases: u64,
    /// Whether an entry no case needed fails the run (a run too short or partial cannot say).
    pub check_stale: bool,
}

/// ISTIO_DIFF_SEED, else `seed`; the variable `count`, else `cases`.
pub fn seed_and_cases(seed: u64, count: &str, cases: u64) -> (u64, u64) {
    let var = |name: &str| std::env::var(name).ok().and_then(|s| s.parse().ok());
    (
        var("ISTIO_DIFF_SEED").unwrap_or(seed),
        var(count).unwrap_or(cases),
    )
}

impl<C, T: Clone + PartialEq> Suite<'_, C, T> {
    /// Runs `cases` (index, case) one after another, Istio's side (`run(case, true)`) then ours,
    /// comparing what `compared` takes of each outcome. The first difference no entries explain
    /// is shrunk (`shrink`) and fails the test with `report`'s text (index, case, Istio's, ours);
    /// with ISTIO_DIFF_KEEP_GOING each is printed unshrunk and the test fails at the end. Then,
    /// with `check_stale`, an entry no case needed fails it.
    pub fn run<O>(
        &self,
        cases: impl Iterator<Item = (u64, C)>,
        mut run: impl FnMut(&C, bool) -> O,
        compared: impl Fn(&O) -> &T,
        mut shrink: impl FnMut(C, (O, O)) -> (C, (O, O)),
        report: impl Fn(u64, &C, &O, &O) -> String,
    ) {
        eprintln!(
            "{}: seed {} (ISTIO_DIFF_SEED={} reproduces), {} cases",
            self.name, self.seed, self.seed, self.cases
        );
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        let keep_going = std::env::var_os("ISTIO_DIFF_KEEP_GOING").is_some();
        let (start, mut unexplained) = (Instant::now(), 0);
        let (mut t_istio, mut t_ours) = (Duration::ZERO, Duration::ZERO);
        for (i, case) in cases {
            let t = Instant::now();
            let istio = run(&case, true);
            t_istio += t.elapsed();
            let t = Instant::now();
            let ours = run(&case, false);
            t_ours += t.elapsed();
            if let Some(ids) = explain(self.entries, &case, compared(&istio), compared(&ours)) {
                for id in ids {
                    *used.entry(id).or_default() += 1;
                }
                continue;
            }
            if keep_going {
                eprintln!("{}", report(i, &case, &istio, &ours));
                unexplained += 1;
                continue;
            }
            let (case, (istio, ours)) = shrink(case, (istio, ours));
            panic!("{}", report(i, &case, &istio, &ours));
        }
        eprintln!(
            "{}: {} cases in {:?} (istio {t_istio:?}, ours {t_ours:?}); allowlist used: {used:?}",
            self.name,
            self.cases,
            start.elapsed()
        );
        assert_eq!(unexplained, 0, "unexplained differences (reported above)");
        let stale: Vec<&str> = self
            .entries
            .iter()
            .filter(|e| !used.contains_key(&e.id))
            .map(|e| e.id.as_str())
            .collect();
        assert!(
            !self.check_stale || stale.is_empty(),
            "allowlist entries no case needed (remove them, or the behaviour came back): {stale:?}"
        );
    }
}
