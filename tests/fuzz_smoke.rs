//! Every fuzz target on its seeds (`fuzz/seeds/TARGET/`) and on a few thousand mutations of
//! them, as a test: a parser that panics on outside input fails here before a fuzzer is run.
//! `scripts/fuzz.sh TARGET SECONDS` runs one target under libFuzzer, coverage-guided.

use std::path::Path;

/// Mutations tried per target.
const MUTATIONS: usize = 3_000;

/// A small, seeded generator: the same mutations every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that matter to the formats: JSON, SSE, TOML and the message separator.
const INTERESTING: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"\\u0000",
    b"\n\n",
    b"\r\n",
    b"data: ",
    b"\xff",
    b"null",
    b"-1",
    b"1e999",
    b"18446744073709551616",
    b"\"\"",
    b"true",
    b"=",
    b"[[tool]]",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let end = (at + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            2 => {
                let piece = INTERESTING[rng.below(INTERESTING.len())];
                out.splice(at..at, piece.iter().copied());
            }
            3 => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let to = (from + rng.below(64)).min(other.len());
                    out.splice(at..at, other[from..to].iter().copied());
                }
            }
            4 => out.truncate(at),
            _ => {
                let byte = rng.next() as u8;
                out.insert(at, byte);
            }
        }
    }
    out
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| std::fs::read(entry.expect("an entry").path()).expect("a seed"))
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "{target} has no seeds");
    seeds
}

#[test]
fn every_target_takes_its_seeds_and_their_mutations_without_panicking() {
    for (name, target) in voxide::fuzz::TARGETS {
        let seeds = seeds(name);
        let mut rng = Rng(0x5eed_f00d ^ name.len() as u64);
        let mut inputs = seeds.clone();
        inputs.push(Vec::new());
        for i in 0..MUTATIONS {
            let base = &seeds[i % seeds.len()];
            inputs.push(mutate(&mut rng, &seeds, base));
        }
        for input in inputs {
            let outcome = std::panic::catch_unwind(|| target(&input));
            assert!(
                outcome.is_ok(),
                "{name} panicked on {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}

#[test]
fn every_target_has_seeds_and_every_seed_folder_a_target() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut folders: Vec<String> = std::fs::read_dir(dir)
        .expect("fuzz/seeds")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    folders.sort();
    let mut targets: Vec<String> = voxide::fuzz::TARGETS
        .iter()
        .map(|(n, _)| (*n).to_owned())
        .collect();
    targets.sort();
    assert_eq!(folders, targets);
}
