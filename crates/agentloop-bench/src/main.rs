//! The agentloop benchmark harness (DESIGN §10): each figure runs its baseline and
//! agentloop in the same process and run, and reports the ratio. Absolute times are
//! noise; the ratios are the figures.
//!
//! Usage: `cargo run --release -p agentloop-bench -- <figure>`, where `<figure>` is
//! `b1` … `b10`, `b3f` (B3 on fjall) or `all`; `soak` runs
//! the main job for five minutes (its binary built first); `codec` runs the (non-figure) measurement
//! behind the payload encoding.

use std::process::ExitCode;

mod b1;
mod b10;
mod b11;
mod b12;
mod b13;
mod b2;
mod b3;
mod b4;
mod b5;
mod b6;
mod b7;
mod b8;
mod b9;
mod c1;
mod c2;
mod c3;
mod codec_choice;
mod harness;
mod raw;
mod report;
mod soak;
mod tempdir;

/// The figures, in the order `all` runs them.
const FIGURES: &[&str] = &[
    "b1", "b2", "b3", "b3f", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11", "b12", "b13", "c1",
    "c2", "c3",
];

fn usage() -> String {
    format!(
        "usage: agentloop-bench <figure>\n  figures: {} | all\n  soak (5 minutes of the main job; not in `all`)\n  diagnostics: codec",
        FIGURES.join(" | ")
    )
}

async fn run_figure(id: &str) {
    match id {
        "b1" => b1::run().await,
        "b2" => b2::run().await,
        "b3" => b3::run().await,
        "b3f" => b3::run_fjall().await,
        "b4" => b4::run().await,
        "b5" => b5::run().await,
        "b6" => b6::run().await,
        "b7" => b7::run().await,
        "b8" => b8::run().await,
        "b9" => b9::run().await,
        "b10" => b10::run().await,
        "b11" => b11::run().await,
        "b12" => b12::run().await,
        "b13" => b13::run().await,
        "c1" => c1::run().await,
        "c2" => c2::run().await,
        "c3" => c3::run().await,
        other => unreachable!("figure {other} is listed but not dispatched"),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let figures: Vec<&str> = match args.as_slice() {
        [one] if one == "all" => FIGURES.to_vec(),
        // C1's doomed node, started by `c1` itself.
        [node, url, name, n] if node == "c1-node" => {
            let n = n.parse().unwrap_or(1_000);
            c1::node_main(url, name, n).await;
            return ExitCode::SUCCESS;
        }
        [one] if one == "codec" => {
            codec_choice::run().await;
            return ExitCode::SUCCESS;
        }
        // Five minutes of the real main job: run on its own, not by `all`.
        [one] if one == "soak" => {
            soak::run().await;
            return ExitCode::SUCCESS;
        }
        [one] if FIGURES.contains(&one.as_str()) => vec![one.as_str()],
        [one] if one == "-h" || one == "--help" => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    for (i, id) in figures.iter().enumerate() {
        if i > 0 {
            println!();
        }
        run_figure(id).await;
    }
    ExitCode::SUCCESS
}
