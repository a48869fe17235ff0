//! Running the selected checks in order: skip when the driver lacks what a check needs, clean
//! up after every check (a failed cleanup fails the check), print one line per check and the
//! summary, and return the report.

use std::io::Write;

use crate::checks::{self, Check};
use crate::context::{Ctx, Failure};
use crate::options::Options;

/// How a check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The driver follows the rule.
    Pass,
    /// The driver breaks the rule (or the check could not finish), and why.
    Fail(String),
    /// The check does not apply to this driver, and why.
    Skip(String),
}

/// Results in run order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// (check name, outcome).
    pub results: Vec<(String, Outcome)>,
}

impl Report {
    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.results.iter().filter(|(_, o)| f(o)).count()
    }

    /// Checks that passed.
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Pass))
    }

    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Fail(_)))
    }

    /// Checks that were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skip(_)))
    }

    /// The outcome of check `name`, if it ran.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.results.iter().find(|(n, _)| n == name).map(|(_, o)| o)
    }

    /// No check failed.
    pub fn success(&self) -> bool {
        self.failed() == 0
    }

    /// `N passed, N failed, N skipped`.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no check matches --focus/--skip; list the names with --list")]
    NothingSelected,
    #[error("{0}; is the driver running and is --csi-address its socket?")]
    Connect(String),
    #[error("cannot write the results: {0}")]
    Output(#[from] std::io::Error),
}

/// The checks the options select, in run order.
pub fn selected(opts: &Options) -> Vec<Check> {
    checks::all()
        .into_iter()
        .filter(|c| opts.selects(c.name))
        .collect()
}

/// Writes `name<TAB>description` for every check.
pub fn list(out: &mut dyn Write) -> std::io::Result<()> {
    for c in checks::all() {
        writeln!(out, "{}\t{}", c.name, c.about)?;
    }
    Ok(())
}

/// One result line: `PASS name`, `FAIL name: why`, `SKIP name: why`.
pub fn line(name: &str, outcome: &Outcome) -> String {
    let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    match outcome {
        Outcome::Pass => format!("PASS {name}"),
        Outcome::Fail(why) => format!("FAIL {name}: {}", one_line(why)),
        Outcome::Skip(why) => format!("SKIP {name}: {}", one_line(why)),
    }
}

/// Connects to the driver, runs the selected checks and writes one line per check and the
/// summary line to `out`.
pub async fn run(opts: Options, out: &mut dyn Write) -> Result<Report, RunError> {
    let checks = selected(&opts);
    if checks.is_empty() {
        return Err(RunError::NothingSelected);
    }
    let ctx = Ctx::new(opts).await.map_err(RunError::Connect)?;
    let mut report = Report::default();
    for check in checks {
        let outcome = run_one(&ctx, &check).await;
        writeln!(out, "{}", line(check.name, &outcome))?;
        out.flush()?;
        report.results.push((check.name.to_owned(), outcome));
    }
    writeln!(out, "{}", report.summary())?;
    Ok(report)
}

async fn run_one(ctx: &Ctx, check: &Check) -> Outcome {
    let outcome = match check.skip_reason(ctx) {
        Some(why) => Outcome::Skip(why),
        None => match check.run(ctx).await {
            Ok(()) => Outcome::Pass,
            Err(Failure::Fail(why)) => Outcome::Fail(why),
            Err(Failure::Skip(why)) => Outcome::Skip(why),
        },
    };
    let leftovers = ctx.cleanup().await;
    if leftovers.is_empty() {
        return outcome;
    }
    let cleanup = format!(
        "cleanup failed, these may be left on the driver: {}",
        leftovers.join("; ")
    );
    match outcome {
        Outcome::Fail(why) => Outcome::Fail(format!("{why}; {cleanup}")),
        _ => Outcome::Fail(cleanup),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_have_the_documented_shape_and_stay_on_one_line() {
        assert_eq!(
            line("identity/probe", &Outcome::Pass),
            "PASS identity/probe"
        );
        assert_eq!(
            line("a/b", &Outcome::Fail("got\nNOT_FOUND".into())),
            "FAIL a/b: got NOT_FOUND"
        );
        assert_eq!(
            line("a/b", &Outcome::Skip("no LIST_VOLUMES".into())),
            "SKIP a/b: no LIST_VOLUMES"
        );
    }

    #[test]
    fn the_summary_counts_each_outcome() {
        let r = Report {
            results: vec![
                ("a".into(), Outcome::Pass),
                ("b".into(), Outcome::Fail("x".into())),
                ("c".into(), Outcome::Skip("y".into())),
                ("d".into(), Outcome::Pass),
            ],
        };
        assert_eq!(r.summary(), "2 passed, 1 failed, 1 skipped");
        assert!(!r.success());
    }
}
