//! Every row of the one-to-one table, against the flag it stands in for.

use super::*;
use crate::compat::table::{Convert, Gate, ROWS, Row};

/// Variables that open `gate`, so that its rows apply.
fn opening(gate: Gate) -> Vars<'static> {
    match gate {
        Gate::Always => &[],
        Gate::GrpcTls => &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/gate/cert.pem"),
            ("GRPC_SERVER_TLS_KEY", "/gate/key.pem"),
        ],
        Gate::Redis => &[("REDIS_URL", "redis:6379")],
        Gate::Tracing => &[("TRACING_ENABLED", "true")],
        Gate::Statsd => &[("USE_STATSD", "true")],
    }
}

/// A value of `row`'s variable, and the flag arguments after the flag that mean the same.
fn sample(row: &Row) -> (&'static str, &'static [&'static str]) {
    match row.convert {
        Convert::Text(_) | Convert::OptionalText(_) | Convert::Secret(_) => {
            ("name:value", &["name:value"])
        }
        Convert::File(_) => ("/sample/file.pem", &["/sample/file.pem"]),
        // The flag is a switch without a value.
        Convert::Bool(_) => ("True", &[]),
        Convert::Duration(_) => ("1m30s", &["90s"]),
        Convert::Millis(_) => ("1.5s", &["1500ms"]),
        Convert::Other(_) => match row.variable {
            "LOG_FORMAT" => ("JSON", &["json"]),
            "LIMIT_RESPONSE_HEADERS_ENABLED" => ("1", &["legacy"]),
            "LOCAL_CACHE_SIZE_IN_BYTES" => ("2099", &["20"]),
            // The variable also brings the reference's default server.
            "CONFIG_TYPE" => ("grpc_xds_sotw", &["xds", "--xds-server", "localhost:18000"]),
            "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES" => ("4096", &["4096"]),
            "TRACING_EXPORTER_PROTOCOL" => ("GRPC", &["grpc"]),
            "TRACING_SAMPLING_RATE" => ("0.25", &["0.25"]),
            "EXTRA_TAGS" => ("a:b,,c:d", &["a:b,c:d"]),
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT" => ("true", &["reject"]),
            other => panic!("no sample for {other}"),
        },
    }
}

#[test]
fn each_row_sets_its_flag_as_the_flag_itself_would() {
    for row in &ROWS {
        let (value, flag_values) = sample(row);
        let flag = [&[row.setting.flag][..], flag_values].concat();
        let opening = opening(row.gate);
        let with_variable = [opening, &[(row.variable, value)]].concat();
        let (by_variable, report) = mapped(&with_variable);
        let (by_flag, _) = run(&flag, opening).unwrap_or_else(|e| panic!("{flag:?}: {e}"));
        assert_eq!(
            format!("{by_variable:?}"),
            format!("{by_flag:?}"),
            "{}",
            row.variable
        );
        let applied = (row.variable, row.setting.flag);
        assert!(report.applied.contains(&applied), "{report:?}");
        // Given the flag, the variable is not even parsed.
        let unparsed = [opening, &[(row.variable, "\u{1}")]].concat();
        let (given, report) = run(&flag, &unparsed).unwrap_or_else(|e| panic!("{flag:?}: {e}"));
        assert_eq!(
            format!("{given:?}"),
            format!("{by_flag:?}"),
            "{}",
            row.variable
        );
        assert!(report.overridden.contains(&applied), "{report:?}");
    }
}

#[test]
fn a_closed_gate_applies_none_of_its_rows() {
    let (untouched, _) = run(&[], &[]).unwrap();
    for row in ROWS.iter().filter(|row| row.gate != Gate::Always) {
        let (value, _) = sample(row);
        let (args, report) = mapped(&[(row.variable, value)]);
        assert_eq!(
            format!("{args:?}"),
            format!("{untouched:?}"),
            "{}",
            row.variable
        );
        assert!(!report.applied.iter().any(|(name, _)| *name == row.variable));
    }
}
