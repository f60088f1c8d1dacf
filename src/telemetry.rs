//! Logging setup: tracing-subscriber with `RUST_LOG` filtering, text or JSON lines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
pub use tracing_subscriber::filter::LevelFilter;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Installs the global subscriber. The filter comes from `RUST_LOG` when it is set and not
/// empty (an unparsable one falls back to `info`, so a typo never silences the logs);
/// otherwise every target logs at `level`.
pub fn init(format: LogFormat, level: LevelFilter) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => {
            EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"))
        }
        _ => EnvFilter::default().add_directive(level.into()),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .with_ansi(std::io::stdout().is_terminal());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}
