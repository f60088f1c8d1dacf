//! The `floodgate` binary: parses the command line, runs one command, maps it to an exit code.
//!
//! Exit codes: 0 success (including a graceful shutdown); 1 `check-config` found errors, or
//! the service could not start (invalid rules, an invalid backend setting, port in use; an
//! unreachable Redis is not one: the service starts NOT_SERVING and keeps connecting), or a
//! `bench` run failed; 2 usage errors (clap, an invalid `--redis-url`, a reference service
//! variable floodgate cannot use, or invalid `bench` options).

use std::process::ExitCode;

/// mimalloc: the gRPC path allocates many small, short-lived buffers per call, where it is
/// measurably faster than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{CommandFactory, FromArgMatches};
use floodgate::cli::{self, Cli, Command, ServeArgs};
use floodgate::compat::{self, ProcessEnvironment, Report};
use floodgate::otel::Tracing;
use floodgate::server::Server;
use floodgate::telemetry::LevelFilter;
use floodgate::{config, shutdown, telemetry};

/// Scheduler ticks between two looks at the runtime's global queue (Tokio's default: 61).
/// Under load a worker's local queue (256 tasks) overflows into the global one, and a task
/// caught there waited behind 60 local tasks per step: a connection's task caught there
/// stalled all of its calls. At 2,048 calls in flight on one core answers came in two
/// groups (p50 2.5 ms, p90 40 ms, p99 100 ms); every other tick keeps tasks close to their
/// order of arrival (p99 at 512 in flight: 24 ms -> 5 ms, at the same decisions/s). The
/// load generator's callers are woken the same way, by their connections' tasks.
const GLOBAL_QUEUE_INTERVAL: u32 = 2;

/// The async runtime of both commands (the service and `floodgate bench`).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .global_queue_interval(GLOBAL_QUEUE_INTERVAL)
        .enable_all()
        .build()
}

/// Turns transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` is set
/// (mimalloc then decides, as it documents).
///
/// With them, the first touch of each fresh 2 MiB of heap zeroes the whole page inside one
/// allocation. On a VM that took over 10 ms a page, a stall of every call on that worker: a
/// fresh replica (and the load generator) answered with a p99 of 60-220 ms over its first
/// seconds, against 1.8-3.9 ms with small pages, whose zeroing is spread over many calls.
fn small_pages_only() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // Fails only on kernels before 3.15, which keep their huge pages.
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
}

fn main() -> ExitCode {
    small_pages_only();
    // Matches first: their value sources tell which serve settings were given, so that the
    // reference service's variables fill in only the others.
    let matches = Cli::command().get_matches_from(cli::with_default_command(std::env::args_os()));
    let command = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli.into_command(),
        Err(error) => error.format(&mut Cli::command()).exit(),
    };
    match command {
        Command::Serve(mut args) => {
            if let Err(error) = args.check() {
                eprintln!("floodgate: invalid --redis-url: {error}");
                return ExitCode::from(2);
            }
            let matches = cli::serve_matches(&matches);
            let applied = compat::apply(&mut args, matches, &ProcessEnvironment)
                .map_err(|error| error.to_string())
                .and_then(|report| {
                    args.check_plaintext()
                        .map(|()| report)
                        .map_err(|error| error.to_string())
                });
            match applied {
                Ok(report) => serve(&args, &report),
                Err(error) => {
                    eprintln!("floodgate: {error}");
                    ExitCode::from(2)
                }
            }
        }
        Command::CheckConfig { dir } => check_config(&dir),
        Command::Bench(args) => bench(&args),
    }
}

/// Prints every error of `dir` to stderr, one per line, or a summary to stdout.
fn check_config(dir: &std::path::Path) -> ExitCode {
    match config::load_dir(dir) {
        Ok(loaded) => {
            println!(
                "OK: {} domains, {} rules",
                loaded.domains.len(),
                loaded.rule_count()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one load test; prints its JSON summary on stdout. Exit 2 on bad options, 1 if the
/// run could not start or finish.
fn bench(args: &floodgate::bench::BenchArgs) -> ExitCode {
    if let Err(error) = args.check() {
        eprintln!("floodgate bench: {error}");
        return ExitCode::from(2);
    }
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("floodgate bench: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let line = if args.rlqs {
        runtime
            .block_on(floodgate::bench::quota::run(args))
            .map(|summary| serde_json::to_string(&summary))
    } else {
        runtime
            .block_on(floodgate::bench::run(args))
            .map(|summary| serde_json::to_string(&summary))
    };
    // A summary is plain data: it always serializes.
    let line = line.map(|json| json.expect("a bench summary serializes"));
    match line {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("floodgate bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the service until SIGTERM or SIGINT; exit 1 if it cannot start or fails. Spans
/// still queued are exported before the process exits.
fn serve(args: &ServeArgs, reference: &Report) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("floodgate: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let settings = args.settings();
    // The exporter runs on the runtime, and its layer must be part of the subscriber.
    let tracing = match settings.as_ref().ok().and_then(|s| s.tracing.as_ref()) {
        Some(tracing) => {
            let _context = runtime.enter();
            Tracing::start(tracing).map(Some)
        }
        None => Ok(None),
    };
    let (tracing, tracing_error) = match tracing {
        Ok(tracing) => (tracing, None),
        Err(error) => (None, Some(error)),
    };
    telemetry::init(
        args.log_format.into(),
        reference.log_level.unwrap_or(LevelFilter::INFO),
        tracing.as_ref(),
    );
    reference.log();
    let settings = match settings {
        Ok(settings) => settings,
        Err(error) => {
            tracing::error!(%error, "invalid settings");
            eprintln!("floodgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(error) = tracing_error {
        tracing::error!(%error, "cannot start tracing");
        eprintln!("floodgate: {error}");
        return ExitCode::FAILURE;
    }
    tracing::info!(version = cli::VERSION, ?settings, "starting floodgate");
    let result = runtime.block_on(async {
        let mut stop = Box::pin(shutdown::signal());
        // Binding can wait long (for the first xDS rules): a signal meanwhile stops it.
        let server = tokio::select! {
            bound = Server::bind(settings) => bound?,
            () = &mut stop => {
                tracing::info!("stopped before serving");
                return Ok(());
            }
        };
        server.serve(stop).await
    });
    if let Some(tracing) = tracing {
        tracing.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "floodgate stopped");
            eprintln!("floodgate: {error}");
            ExitCode::FAILURE
        }
    }
}
