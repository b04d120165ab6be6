//! `ferrite`: run Hugging Face checkpoints (directories or GGUF files) from the command line,
//! serve them over an OpenAI-compatible HTTP API, and inspect the model matrix.

mod bench;
mod default_model;
mod generate;
mod hub;
mod matrix;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "ferrite", version, about = "LLM inference and serving engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate text for one prompt, streamed to stdout.
    Generate(generate::GenerateArgs),
    /// Serve a model over the OpenAI-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Benchmark an OpenAI-compatible server (ours or another) and print JSON.
    Bench(Box<bench::BenchArgs>),
    /// Print the model matrix (docs/model-matrix.md is generated from it).
    Matrix(matrix::MatrixArgs),
    /// Print the path of the default model (SmolLM2-135M-Instruct), downloading it on first use.
    DefaultModel,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(serve::expand_short_aliases(std::env::args()));
    // FERRITE_LOG (a tracing filter) wins over `serve --log-level`.
    let default_filter = match &cli.command {
        Command::Serve(args) => args.log_filter(),
        _ => "warn,ferrite=info".to_owned(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERRITE_LOG").unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        // Escape codes only where a terminal reads them, not in files and log collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Matrix(args) => matrix::run(args),
        Command::Bench(args) => bench::run(*args),
        Command::DefaultModel => default_model::resolve().map(|p| println!("{}", p.display())),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
