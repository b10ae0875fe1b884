//! The verdict of a suite that runs its cases in parallel (the rule tool's and the plugin's):
//! the unexplained cases, a few re-run and shrunk, and the allowlist entries no case needed.

/// How a suite that runs its cases in parallel states its verdict.
pub struct Verdict<'a> {
    /// Whose tool ours is held to ("Istio", "Istio's plugin").
    pub against: &'a str,
    /// The allowlist as messages name it.
    pub list: &'a str,
    /// How many unexplained cases are re-run, shrunk and shown, and the variable that sets it.
    pub show: (usize, &'a str),
    pub seed: u64,
    pub count: u64,
    /// Whether an entry that explained no case fails the run (a short run cannot say).
    pub stale_check: bool,
}

impl Verdict<'_> {
    /// Prints how many cases each entry of `hits` (id, cases it explained) explained, then fails
    /// the test when a case differed unexplained or, with `stale_check`, an entry explained none.
    /// `failures` are (index, Istio's outcome, ours), in the order the workers found them; the
    /// first by index are shown, each re-run and shrunk to its report by `shrunk`, or, where it
    /// did not fail again (None), shown as first seen by `seen`.
    pub fn assert<O>(
        &self,
        mut failures: Vec<(u64, O, O)>,
        hits: &[(&str, usize)],
        mut shrunk: impl FnMut(u64) -> Option<String>,
        seen: impl Fn(u64, &O, &O) -> String,
    ) {
        for (id, n) in hits {
            eprintln!("  allowlisted {id:<32} {n} cases");
        }
        failures.sort_unstable_by_key(|f| f.0);
        let (show, show_var) = self.show;
        let mut problems = Vec::new();
        for (index, istio, ours) in failures.iter().take(show) {
            problems.push(shrunk(*index).unwrap_or_else(|| {
                let first = seen(*index, istio, ours);
                format!("(flaky: the difference did not happen again on a re-run; as first seen:)\n{first}")
            }));
        }
        if failures.len() > show {
            let more: Vec<u64> = failures[show..failures.len().min(show + 16)]
                .iter()
                .map(|f| f.0)
                .collect();
            problems.push(format!(
                "... and {} more failing cases (indices {more:?}...; {show_var}=n shrinks and shows n)",
                failures.len() - show
            ));
        }
        if self.stale_check {
            for (id, _) in hits.iter().filter(|(_, n)| *n == 0) {
                problems.push(format!(
                    "{} entry {id} explained no case of {}: the difference no longer occurs; remove the entry",
                    self.list, self.count
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "{} of {} cases differ from {} without an allowlist entry (seed {}):\n\n{}",
            failures.len(),
            self.count,
            self.against,
            self.seed,
            problems.join("\n")
        );
    }
}
