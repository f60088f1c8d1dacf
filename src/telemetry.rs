//! Logging setup: tracing-subscriber with `RUST_LOG` filtering, text or JSON lines, and the
//! OpenTelemetry layer when tracing is on ([`crate::otel`]).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
pub use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use crate::otel::{self, Tracing};

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
///
/// With `tracing`, the OpenTelemetry layer is added beside the log output, each with its own
/// filter: the exported spans do not depend on the log level and never appear in the logs.
/// Without it the subscriber is the plain log output, so tracing costs nothing when off.
pub fn init(format: LogFormat, level: LevelFilter, tracing: Option<&Tracing>) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => {
            EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"))
        }
        _ => EnvFilter::default().add_directive(level.into()),
    };
    let ansi = std::io::stdout().is_terminal();
    let result = match tracing {
        None => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stdout)
                .with_ansi(ansi);
            match format {
                LogFormat::Text => builder.try_init(),
                LogFormat::Json => builder.json().try_init(),
            }
        }
        Some(tracing) => {
            let spans_off = format!("{}=off", otel::TARGET)
                .parse()
                .expect("a valid directive");
            let logs = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stdout)
                .with_ansi(ansi);
            let logs = match format {
                LogFormat::Text => logs.boxed(),
                LogFormat::Json => logs.json().boxed(),
            };
            Registry::default()
                .with(logs.with_filter(filter.add_directive(spans_off)))
                .with(tracing.layer())
                .try_init()
                .map_err(Into::into)
        }
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}
