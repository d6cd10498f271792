//! Percentiles of a run's figures and the SLOs they are judged by (`p95(v2v)<1200ms`).

use std::collections::BTreeMap;

use serde::Serialize;

/// One metric's distribution, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Values.
    pub n: usize,
}

impl Distribution {
    /// The distribution of `values` (in any order); `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        // Nearest rank: the smallest value with at least q of the values at or below it.
        let at = |q: f64| {
            let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
            sorted[rank.min(sorted.len()) - 1]
        };
        Some(Self {
            p50: at(0.50),
            p90: at(0.90),
            p95: at(0.95),
            p99: at(0.99),
            max: sorted[sorted.len() - 1],
            n: sorted.len(),
        })
    }

    fn statistic(&self, name: &str) -> Option<f64> {
        Some(match name {
            "p50" => self.p50,
            "p90" => self.p90,
            "p95" => self.p95,
            "p99" => self.p99,
            "max" => self.max,
            _ => return None,
        })
    }
}

/// A service-level objective: `STAT(METRIC) < LIMIT` with the limit in ms or s, or
/// `error_rate < N%`.
#[derive(Debug, Clone, PartialEq)]
pub struct Slo {
    /// As written.
    pub text: String,
    /// `p50`…`max`, or `error_rate`.
    statistic: String,
    /// The metric (`v2v`, `first_audio`, `connect`); empty for the error rate.
    metric: String,
    /// Milliseconds, or a fraction for the error rate.
    limit: f64,
}

/// An SLO's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The SLO as written.
    pub slo: String,
    /// The measured value (ms, or a fraction); none when the metric has no data.
    pub value: Option<f64>,
    /// Whether it held.
    pub pass: bool,
}

impl Slo {
    /// Reads `p95(v2v)<1200ms`, `p99(connect)<2s`, `error_rate<1%`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let bad = || {
            format!(
                "--slo {text:?}: write STAT(METRIC)<LIMIT, as p95(v2v)<1200ms or p99(connect)<2s, \
                 or error_rate<1%"
            )
        };
        let (left, right) = compact.split_once('<').ok_or_else(bad)?;
        if left == "error_rate" {
            let percent: f64 = right
                .strip_suffix('%')
                .and_then(|n| n.parse().ok())
                .ok_or_else(bad)?;
            return Ok(Self {
                text: text.to_owned(),
                statistic: left.to_owned(),
                metric: String::new(),
                limit: percent / 100.0,
            });
        }
        let (statistic, metric) = left
            .strip_suffix(')')
            .and_then(|l| l.split_once('('))
            .ok_or_else(bad)?;
        if !["p50", "p90", "p95", "p99", "max"].contains(&statistic) {
            return Err(bad());
        }
        let limit = if let Some(ms) = right.strip_suffix("ms") {
            ms.parse::<f64>().map_err(|_| bad())?
        } else if let Some(s) = right.strip_suffix('s') {
            s.parse::<f64>().map_err(|_| bad())? * 1000.0
        } else {
            return Err(bad());
        };
        Ok(Self {
            text: text.to_owned(),
            statistic: statistic.to_owned(),
            metric: metric.to_owned(),
            limit,
        })
    }

    /// The metric it reads (empty for the error rate).
    pub fn metric(&self) -> &str {
        &self.metric
    }

    /// Judges the run: a metric with no data fails.
    pub fn judge(
        &self,
        metrics: &BTreeMap<String, Option<Distribution>>,
        error_rate: f64,
    ) -> Verdict {
        let value = if self.statistic == "error_rate" {
            Some(error_rate)
        } else {
            metrics
                .get(&self.metric)
                .copied()
                .flatten()
                .and_then(|d| d.statistic(&self.statistic))
        };
        Verdict {
            slo: self.text.clone(),
            value,
            pass: value.is_some_and(|v| v < self.limit),
        }
    }
}

/// User plus system CPU seconds of this process, all threads (from /proc; 0 elsewhere).
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / CLOCK_TICKS
}

/// The kernel's clock ticks per second for /proc times: 100 on every Linux in use.
const CLOCK_TICKS: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let d = Distribution::of(&values).expect("data");
        assert_eq!(
            (d.p50, d.p90, d.p95, d.p99, d.max, d.n),
            (50.0, 90.0, 95.0, 99.0, 100.0, 100)
        );
        let one = Distribution::of(&[7.0]).expect("data");
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert_eq!(Distribution::of(&[]), None);
    }

    #[test]
    fn slos_read_both_units_and_a_metric_with_no_data_fails() {
        let mut metrics = BTreeMap::new();
        metrics.insert("v2v".to_owned(), Distribution::of(&[800.0, 900.0, 1_000.0]));
        metrics.insert("first_audio".to_owned(), None);
        let pass = Slo::parse("p95(v2v) < 1.2s")
            .expect("valid")
            .judge(&metrics, 0.0);
        assert!(pass.pass && pass.value == Some(1_000.0));
        let fail = Slo::parse("p50(v2v)<900ms")
            .expect("valid")
            .judge(&metrics, 0.0);
        assert!(!fail.pass);
        let empty = Slo::parse("p95(first_audio)<5s")
            .expect("valid")
            .judge(&metrics, 0.0);
        assert!(!empty.pass && empty.value.is_none());
        let errors = Slo::parse("error_rate<1%").expect("valid");
        assert!(errors.judge(&metrics, 0.005).pass);
        assert!(!errors.judge(&metrics, 0.02).pass);
        for bad in ["p95(v2v)", "p42(v2v)<1s", "p95(v2v)<fast", "error_rate<1"] {
            assert!(Slo::parse(bad).is_err(), "{bad}");
        }
    }
}
