//! The flags of one budget across regions (docs/regions.md).

use clap::Args;

use super::{FlagError, GoDuration};
use crate::backend::{BackendSettings, RedisOptions};
use crate::duration;
use crate::limiter::regions::RegionSettings;

/// Default `--lease-period`.
pub const DEFAULT_LEASE_PERIOD: &str = "1s";

/// Regions: this replica's, the others' Redis, and how often leases move.
#[derive(Debug, Clone, Args)]
pub struct RegionArgs {
    /// This replica's region; with it, rules with `scope: global` share one budget across
    /// the regions named by --peer-region.
    #[arg(long, env = "FLOODGATE_REGION", value_name = "NAME")]
    pub region: Option<String>,
    /// Another region and its Redis: `NAME=URL` (the backend's kind; a Redis Cluster as
    /// comma-separated seed URLs). Repeatable; in the variable, separated by spaces.
    #[arg(
        long = "peer-region",
        env = "FLOODGATE_PEER_REGION",
        value_name = "NAME=URL",
        value_delimiter = ' '
    )]
    pub peer_regions: Vec<String>,
    /// How often each region publishes its demand and moves its leases.
    #[arg(long, env = "FLOODGATE_LEASE_PERIOD", value_name = "DURATION",
          default_value = DEFAULT_LEASE_PERIOD, value_parser = duration::parse_positive)]
    pub lease_period: GoDuration,
    /// A domain whose every rule is global (rules from xDS carry no `scope`). Repeatable.
    #[arg(
        long = "global-domain",
        env = "FLOODGATE_GLOBAL_DOMAIN",
        value_name = "DOMAIN",
        value_delimiter = ' '
    )]
    pub global_domains: Vec<String>,
}

impl RegionArgs {
    /// The region settings, each peer reached as `main` is (same kind, options), with a
    /// bound of at least a period on its calls: a peer is far away.
    ///
    /// # Errors
    /// A peer without `NAME=`, a name twice, peers without a region, or regions on the
    /// memory backend.
    pub fn settings(&self, main: &BackendSettings) -> Result<Option<RegionSettings>, FlagError> {
        let Some(name) = self.region.clone() else {
            if self.peer_regions.is_empty() && self.global_domains.is_empty() {
                return Ok(None);
            }
            return Err(needs("--peer-region and --global-domain", "--region NAME"));
        };
        let mut peers = Vec::new();
        for peer in &self.peer_regions {
            let Some((peer_name, url)) = peer
                .split_once('=')
                .filter(|(n, u)| !n.is_empty() && !u.is_empty())
            else {
                return Err(needs("--peer-region", "the form NAME=URL"));
            };
            if peer_name == name || peers.iter().any(|(known, _)| known == peer_name) {
                return Err(needs("--peer-region", "a name of its own for each region"));
            }
            peers.push((
                peer_name.to_owned(),
                peer_backend(main, url, self.lease_period.0)?,
            ));
        }
        Ok(Some(RegionSettings {
            name,
            peers,
            period: self.lease_period.0,
            global_domains: self.global_domains.clone(),
        }))
    }
}

fn needs(flag: &str, what: &str) -> FlagError {
    FlagError::Needs {
        flag: flag.to_owned(),
        needs: what.to_owned(),
    }
}

/// The backend of a peer region at `url`, of `main`'s kind.
fn peer_backend(
    main: &BackendSettings,
    url: &str,
    period: std::time::Duration,
) -> Result<BackendSettings, FlagError> {
    let far = |options: &RedisOptions| RedisOptions {
        timeout: options.timeout.max(period),
        ..options.clone()
    };
    match main {
        BackendSettings::Redis { options, .. } | BackendSettings::Sentinel { options, .. } => {
            Ok(BackendSettings::Redis {
                url: url.to_owned(),
                options: far(options),
            })
        }
        BackendSettings::Cluster { options, .. } => Ok(BackendSettings::Cluster {
            urls: url.split(',').map(str::to_owned).collect(),
            options: far(options),
        }),
        BackendSettings::PerSecond { main, .. } => peer_backend(main, url, period),
        BackendSettings::Memory { .. } => Err(needs(
            "--region",
            "a Redis backend (each region keeps its leases in its own Redis)",
        )),
    }
}
