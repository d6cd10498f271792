//! The network between a caller and the bot, as the load tester makes it: what becomes of each
//! 20 ms frame the caller sends, seeded so a run can be repeated. The kernel's `netem` does this
//! for a whole interface; here each session has a network of its own.
//!
//! - **Loss**: each frame is lost with probability `loss`; with a mean burst length, losses come
//!   in bursts (a Gilbert model whose bad state loses every frame and lasts `burst` frames on
//!   average, entered often enough that `loss` of the frames are lost in all).
//! - **Jitter**: each frame is delayed by a uniform draw in `[0, jitter]`; frames whose delays
//!   differ by more than 20 ms arrive out of order, as on a real path.
//! - **Reordering**: a frame is held back by a frame and a half, so the next overtakes it.
//! - **Duplication**: a frame is sent twice, the copy a few ms behind.

use std::time::Duration;

use serde::Serialize;

/// How the load tester impairs what a caller sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Impairment {
    /// The share of frames lost, 0 to 1.
    pub loss: f64,
    /// The mean length of a run of losses, in frames; 1 or less: each loss on its own.
    pub burst: f64,
    /// The most a frame is delayed.
    pub jitter: Duration,
    /// The share of frames overtaken by the next, 0 to 1.
    pub reorder: f64,
    /// The share of frames sent twice, 0 to 1.
    pub duplicate: f64,
    /// Seeds every session's network (each its own, from this and its index).
    pub seed: u64,
}

impl Impairment {
    /// Whether it changes anything.
    pub fn is_clean(&self) -> bool {
        self.loss <= 0.0 && self.jitter.is_zero() && self.reorder <= 0.0 && self.duplicate <= 0.0
    }

    /// As the report names it: `3 % loss (bursts of 2), 30 ms jitter`, or `clean`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.loss > 0.0 {
            let mut loss = format!("{} % loss", round(self.loss * 100.0));
            if self.burst > 1.0 {
                loss.push_str(&format!(" (bursts of {})", round(self.burst)));
            }
            parts.push(loss);
        }
        if !self.jitter.is_zero() {
            parts.push(format!("{} ms jitter", self.jitter.as_millis()));
        }
        if self.reorder > 0.0 {
            parts.push(format!("{} % reordered", round(self.reorder * 100.0)));
        }
        if self.duplicate > 0.0 {
            parts.push(format!("{} % duplicated", round(self.duplicate * 100.0)));
        }
        if parts.is_empty() {
            "clean".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// Session `index`'s network.
    pub fn network(&self, index: usize) -> Network {
        Network {
            impairment: *self,
            random: SplitMix(self.seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            in_burst: false,
        }
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// What becomes of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It never arrives.
    Lost,
    /// It arrives after `delay`, and a copy after `copy` if it is duplicated.
    Sent {
        /// How long the network holds it.
        delay: Duration,
        /// When its duplicate goes, if it has one.
        copy: Option<Duration>,
    },
}

/// One session's network.
#[derive(Debug, Clone)]
pub struct Network {
    impairment: Impairment,
    random: SplitMix,
    in_burst: bool,
}

/// A frame's length, which a reordered frame is held back one and a half of.
const FRAME: Duration = Duration::from_millis(20);
/// How far behind its original a duplicate goes.
const COPY_GAP: Duration = Duration::from_millis(3);

impl Network {
    /// What becomes of the next frame.
    pub fn fate(&mut self) -> Fate {
        let i = self.impairment;
        if self.lost() {
            return Fate::Lost;
        }
        let mut delay = i.jitter.mul_f64(self.random.unit());
        if i.reorder > 0.0 && self.random.unit() < i.reorder {
            delay += FRAME + FRAME / 2;
        }
        let copy =
            (i.duplicate > 0.0 && self.random.unit() < i.duplicate).then_some(delay + COPY_GAP);
        Fate::Sent { delay, copy }
    }

    fn lost(&mut self) -> bool {
        let i = self.impairment;
        if i.loss <= 0.0 {
            return false;
        }
        if i.burst <= 1.0 {
            return self.random.unit() < i.loss;
        }
        // Gilbert: leave a burst with 1/burst; enter one so that `loss` of the time is in one.
        let leave = 1.0 / i.burst;
        let enter = (i.loss * leave / (1.0 - i.loss).max(1e-9)).min(1.0);
        let switch = if self.in_burst { leave } else { enter };
        if self.random.unit() < switch {
            self.in_burst = !self.in_burst;
        }
        self.in_burst
    }
}

/// SplitMix64: small, fast and good enough to draw a network from.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fates(impairment: Impairment, n: usize) -> Vec<Fate> {
        let mut network = impairment.network(3);
        (0..n).map(|_| network.fate()).collect()
    }

    fn lost_runs(fates: &[Fate]) -> Vec<usize> {
        let mut runs = Vec::new();
        let mut run = 0;
        for fate in fates {
            if *fate == Fate::Lost {
                run += 1;
            } else if run > 0 {
                runs.push(run);
                run = 0;
            }
        }
        runs
    }

    #[test]
    fn a_clean_network_delivers_every_frame_at_once() {
        let all = fates(Impairment::default(), 1000);
        assert!(all.iter().all(|f| *f
            == Fate::Sent {
                delay: Duration::ZERO,
                copy: None
            }));
        assert!(Impairment::default().is_clean());
        assert_eq!(Impairment::default().describe(), "clean");
    }

    #[test]
    fn random_loss_loses_its_share_one_frame_at_a_time_and_the_seed_repeats_it() {
        let impairment = Impairment {
            loss: 0.03,
            seed: 7,
            ..Impairment::default()
        };
        let all = fates(impairment, 100_000);
        let lost = all.iter().filter(|f| **f == Fate::Lost).count() as f64 / 1e5;
        assert!((0.027..0.033).contains(&lost), "{lost}");
        let runs = lost_runs(&all);
        let mean = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
        assert!(mean < 1.1, "{mean}");
        assert_eq!(all, fates(impairment, 100_000));
        assert_ne!(
            all,
            fates(
                Impairment {
                    seed: 8,
                    ..impairment
                },
                100_000
            )
        );
    }

    #[test]
    fn burst_loss_loses_its_share_in_runs_of_the_mean_length() {
        let impairment = Impairment {
            loss: 0.10,
            burst: 3.0,
            seed: 1,
            ..Impairment::default()
        };
        let all = fates(impairment, 200_000);
        let lost = all.iter().filter(|f| **f == Fate::Lost).count() as f64 / 2e5;
        assert!((0.09..0.11).contains(&lost), "{lost}");
        let runs = lost_runs(&all);
        let mean = runs.iter().sum::<usize>() as f64 / runs.len() as f64;
        assert!((2.7..3.3).contains(&mean), "{mean}");
        assert_eq!(impairment.describe(), "10 % loss (bursts of 3)");
    }

    #[test]
    fn jitter_delays_within_its_bound_and_reordering_holds_a_frame_past_the_next() {
        let impairment = Impairment {
            jitter: Duration::from_millis(30),
            reorder: 0.05,
            duplicate: 0.02,
            seed: 2,
            ..Impairment::default()
        };
        let all = fates(impairment, 10_000);
        let delays: Vec<Duration> = all
            .iter()
            .map(|f| match f {
                Fate::Sent { delay, .. } => *delay,
                Fate::Lost => panic!("no loss asked for"),
            })
            .collect();
        let held = delays.iter().filter(|d| **d >= FRAME + FRAME / 2).count();
        assert!((400..600).contains(&held), "{held}");
        assert!(delays.iter().all(|d| *d < Duration::from_millis(61)));
        let copies = all
            .iter()
            .filter(|f| matches!(f, Fate::Sent { copy: Some(_), .. }))
            .count();
        assert!((150..250).contains(&copies), "{copies}");
        assert_eq!(
            impairment.describe(),
            "30 ms jitter, 5 % reordered, 2 % duplicated"
        );
    }
}
