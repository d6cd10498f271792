//! The `voxide` command's subcommands: their flags (clap), checked, and what each runs.

pub mod bench;
pub mod bot;
pub mod loadtest;
pub mod local;
pub mod report;
pub mod serve;

/// Prints one line per model of the manifest.
pub fn list_models() {
    use voxide::models::{Installed, Manifest, models_dir};
    let dir = models_dir();
    println!("models folder: {}", dir.display());
    for model in Manifest::builtin().models {
        let state = match model.installed_in(&dir) {
            Installed::Yes => "installed",
            Installed::Missing => "missing (run scripts/setup.sh)",
            Installed::WrongSize => "damaged (delete it and run scripts/setup.sh)",
        };
        println!(
            "{:<16} {:>6.1} MB  {:<10} {}=={} ({})  {}",
            model.name,
            model.size() as f64 / 1e6,
            state,
            model.package,
            model.version,
            model.license,
            model.purpose,
        );
    }
}
