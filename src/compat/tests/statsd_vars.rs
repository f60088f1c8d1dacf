//! The stats variables onto the StatsD flags.

use std::time::Duration;

use super::*;
use crate::compat::statsd_vars::STATSD_OFF_NOTICE;
use crate::statsd::{Flavor, Protocol, StatsdSettings};

fn statsd(vars: Vars) -> Option<StatsdSettings> {
    mapped(vars).0.statsd.settings().expect("valid settings")
}

#[test]
fn statsd_setting_ids_name_the_serve_arguments() {
    let command = Cli::command();
    let serve = command.find_subcommand("serve").unwrap();
    for flag in [
        "--statsd-addr",
        "--statsd-protocol",
        "--statsd-flavor",
        "--statsd-flush-interval",
        "--statsd-tags",
    ] {
        let id = setting(flag).id();
        let arg = serve
            .get_arguments()
            .find(|arg| arg.get_id() == id.as_str());
        assert_eq!(arg.and_then(|arg| arg.get_long()), Some(&flag[2..]));
    }
}

#[test]
fn use_statsd_sends_plain_statsd_over_tcp_to_the_named_server() {
    let settings = statsd(&[
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "statsd.monitoring"),
        ("STATSD_PORT", "9125"),
        ("EXTRA_TAGS", "cluster:eu1,team:edge"),
        ("STATS_FLUSH_INTERVAL", "2s"),
    ])
    .expect("on");
    assert_eq!(settings.addr, "statsd.monitoring:9125");
    assert_eq!(settings.protocol, Protocol::Tcp);
    assert_eq!(settings.flavor, Flavor::Statsd);
    assert_eq!(settings.flush_interval, Duration::from_secs(2));
    let tags: Vec<String> = settings.tags.iter().map(ToString::to_string).collect();
    assert_eq!(tags, ["cluster:eu1", "team:edge"]);
    // The reference's defaults: localhost:8125, every 10 s.
    let settings = statsd(&[("USE_STATSD", "true")]).expect("on");
    assert_eq!(settings.addr, "localhost:8125");
    assert_eq!(settings.flush_interval, Duration::from_secs(10));
    let settings = statsd(&[("USE_STATSD", "1"), ("STATSD_HOST", "::1")]).expect("on");
    assert_eq!(settings.addr, "[::1]:8125");
}

#[test]
fn use_dog_statsd_sends_dogstatsd_over_udp() {
    let settings = statsd(&[
        ("USE_STATSD", "false"),
        ("USE_DOG_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("GOSTATS_FLUSH_INTERVAL_SECONDS", "3"),
    ])
    .expect("on");
    assert_eq!(settings.addr, "127.0.0.1:8125");
    assert_eq!(settings.protocol, Protocol::Udp);
    assert_eq!(settings.flavor, Flavor::Dogstatsd);
    assert_eq!(settings.flush_interval, Duration::from_secs(3));
}

#[test]
fn unset_use_statsd_sends_only_when_a_server_is_named() {
    assert!(statsd(&[("STATSD_HOST", "statsd")]).is_some());
    assert!(statsd(&[("STATSD_PORT", "8125")]).is_some());
    assert_eq!(
        statsd(&[("USE_STATSD", "false"), ("STATSD_HOST", "statsd")]),
        None
    );
    // A reference deployment that never named StatsD: off, and said so once.
    let (args, report) = mapped(&[("REDIS_URL", "redis:6379"), ("EXTRA_TAGS", "a:b")]);
    assert_eq!(args.statsd.settings().unwrap(), None);
    assert_eq!(report.notices, [STATSD_OFF_NOTICE]);
    // No notice where the reference would not have sent StatsD either, or floodgate decides.
    for vars in [
        &[("REDIS_URL", "redis:6379"), ("USE_STATSD", "false")][..],
        &[("REDIS_URL", "redis:6379"), ("USE_PROMETHEUS", "true")][..],
        &[("REDIS_URL", "redis:6379"), ("DISABLE_STATS", "true")][..],
        &[("EXTRA_TAGS", "a:b")][..],
    ] {
        assert!(mapped(vars).1.notices.is_empty(), "{vars:?}");
    }
    let (_, report) = run(&["--statsd-addr", "s:1"], &[("REDIS_URL", "r:6379")]).unwrap();
    assert!(report.notices.is_empty());
}

#[test]
fn disable_stats_wins_over_every_switch() {
    let vars = [("DISABLE_STATS", "true"), ("USE_STATSD", "true")];
    assert_eq!(statsd(&vars), None);
    let (args, report) = run(&["--statsd-addr", "s:1"], &vars).unwrap();
    assert!(args.statsd.statsd_addr.is_some());
    assert!(
        report
            .overridden
            .contains(&("DISABLE_STATS", "--statsd-addr"))
    );
}

#[test]
fn flags_win_over_the_stats_variables() {
    let (args, report) = run(
        &[
            "--statsd-addr",
            "collector:8125",
            "--statsd-flush-interval",
            "1s",
        ],
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "other"),
            ("STATS_FLUSH_INTERVAL", "not-a-duration"),
        ],
    )
    .unwrap();
    let settings = args.statsd.settings().unwrap().unwrap();
    assert_eq!(settings.addr, "collector:8125");
    assert_eq!(settings.flush_interval, Duration::from_secs(1));
    assert!(
        report
            .overridden
            .contains(&("STATSD_HOST", "--statsd-addr"))
    );
    assert!(
        report
            .overridden
            .contains(&("STATS_FLUSH_INTERVAL", "--statsd-flush-interval"))
    );
}

#[test]
fn unusable_stats_values_stop_startup_naming_the_variable() {
    for (vars, variable) in [
        (&[("USE_STATSD", "yes")][..], "USE_STATSD"),
        (&[("USE_DOG_STATSD", "true")][..], "USE_DOG_STATSD"),
        (
            &[("USE_STATSD", "true"), ("STATSD_PORT", "0")][..],
            "STATSD_PORT",
        ),
        (
            &[("USE_STATSD", "true"), ("EXTRA_TAGS", "novalue")][..],
            "EXTRA_TAGS",
        ),
        (
            &[("USE_STATSD", "true"), ("STATS_FLUSH_INTERVAL", "0")][..],
            "STATS_FLUSH_INTERVAL",
        ),
        (&[("DISABLE_STATS", "sometimes")][..], "DISABLE_STATS"),
    ] {
        let vars: Vec<_> = vars.to_vec();
        let vars = if variable == "USE_DOG_STATSD" {
            // The reference's USE_STATSD defaults to true: both on is its own fatal error.
            [vars, vec![("USE_STATSD", "true")]].concat()
        } else {
            vars
        };
        assert_eq!(error(&vars).variable, variable, "{vars:?}");
    }
}

#[test]
fn both_flush_interval_variables_keep_the_reference_one() {
    let (args, report) = mapped(&[
        ("USE_STATSD", "true"),
        ("STATS_FLUSH_INTERVAL", "500ms"),
        ("GOSTATS_FLUSH_INTERVAL_SECONDS", "5"),
    ]);
    let settings = args.statsd.settings().unwrap().unwrap();
    assert_eq!(settings.flush_interval, Duration::from_millis(500));
    assert_eq!(warned(&report), ["GOSTATS_FLUSH_INTERVAL_SECONDS"]);
}
