//! Arbitrary reference environments through the mapping `serve` applies at startup, fed from
//! a map (the process environment is never touched).
//!
//! Input: lines (lossily decoded, as `ProcessEnvironment` reads values). A line starting with
//! `--` is a serve flag (so precedence over given flags is explored); any other line is
//! `NAME=VALUE` (a line without `=` sets NAME to the empty value). Checked: no panic, and the
//! Redis password never reaches `Debug` of the settings, the report or an error (the target
//! appends a canary to `REDIS_AUTH`, which lands in the password part whatever the input).
#![no_main]

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches};
use floodgate::compat::apply;
use floodgate::cli::{Cli, Command, serve_matches, with_default_command};
use libfuzzer_sys::fuzz_target;

/// Appended to any `REDIS_AUTH` value; must never be shown.
const CANARY: &str = "Zq7fuzzSecretCanary";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut argv = vec![OsString::from("floodgate")];
    let mut env = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with("--") {
            argv.push(OsString::from(line));
        } else {
            let (name, value) = line.split_once('=').unwrap_or((line, ""));
            env.insert(name.to_owned(), value.to_owned());
        }
    }
    if let Some(auth) = env.get_mut("REDIS_AUTH") {
        auth.push_str(CANARY);
    }
    // The canary may only be hidden when the input did not copy it anywhere else.
    let canary_elsewhere = env.iter().any(|(name, value)| {
        name.contains(CANARY) || (name != "REDIS_AUTH" && value.contains(CANARY))
    }) || text.contains(CANARY);

    let Ok(matches) = Cli::command().try_get_matches_from(with_default_command(argv)) else {
        return;
    };
    let Ok(cli) = Cli::from_arg_matches(&matches) else {
        return;
    };
    let Command::Serve(mut args) = cli.into_command() else {
        return;
    };
    let shown = match apply(&mut args, serve_matches(&matches), &env) {
        Ok(report) => {
            let checked = args.check();
            format!("{args:?} {report:?} {checked:?}")
        }
        Err(error) => format!("{error} {error:?}"),
    };
    if !canary_elsewhere {
        assert!(
            !shown.contains(CANARY),
            "the Redis password is shown: {shown}"
        );
    }
});
