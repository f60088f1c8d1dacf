//! Writes the seed corpora of the fuzz targets (`fuzz/`), one directory per target:
//!
//! - `config_file`: every domain file of `config/`, `fuzz/rules/` and `tests/fixtures/`;
//! - `config_dir`: every fixture directory and pairs of the example files, as the target
//!   reads a directory (two files joined by a NUL byte);
//! - `json_body` and `request`: valid requests (overrides, costs, wildcards, nesting) as
//!   proto3 JSON and, encoded, as protobuf;
//! - `reference_env`: reference environments in the target's `NAME=VALUE` line format;
//! - `xds_resources`: encoded `RateLimitConfig` resources (nested, every unit, the flags),
//!   alone and several in one response, separated by a NUL byte as the target splits them.
//!
//! Run from the repository root: `cargo run --example fuzz_seeds -- fuzz/corpus`.
//! Existing files are overwritten, and inputs the fuzzer added are kept.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use floodgate::admin::parse_json_request;
use floodgate::proto::rls_conf::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;

/// Valid `/json` bodies: every rule shape of `config/` and `fuzz/rules/`.
const REQUESTS: &[&str] = &[
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"path","value":"/login"}]}],"hitsAddend":1}"#,
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.7"}]},{"entries":[{"key":"path","value":"/api/users/42"}]}]}"#,
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"},{"key":"path","value":"/export"}]},{"entries":[{"key":"user","value":"alice"},{"key":"tier","value":"vip"}]}]}"#,
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"path","value":"/static/app.js"}],"hitsAddend":"3"},{"entries":[{"key":"path","value":"/healthz"}]}]}"#,
    r#"{"domain":"algorithms","descriptors":[{"entries":[{"key":"algorithm","value":"fixed_window"}]},{"entries":[{"key":"algorithm","value":"gcra"}]},{"entries":[{"key":"algorithm","value":"leaky_bucket"}]},{"entries":[{"key":"algorithm","value":"sliding_window"}]},{"entries":[{"key":"algorithm","value":"sliding_log"}]}],"hitsAddend":2}"#,
    r#"{"domain":"reference","descriptors":[{"entries":[{"key":"key1","value":"value1"},{"key":"subkey1","value":"x"}]},{"entries":[{"key":"client_id","value":"trial"}]},{"entries":[{"key":"tenant","value":"team-a"}]}]}"#,
    r#"{"domain":"reference","descriptors":[{"entries":[{"key":"quota","value":"free"}]},{"entries":[{"key":"quota","value":"paid"}]},{"entries":[{"key":"quota","value":"other"}]}]}"#,
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.8"}],"limit":{"requestsPerUnit":2,"unit":"SECOND"}}]}"#,
    r#"{"domain":"fuzz","descriptors":[{"entries":[{"key":"fw","value":"1"}]},{"entries":[{"key":"tb","value":"1"}]},{"entries":[{"key":"sw","value":"1"}]},{"entries":[{"key":"sl","value":"1"}]}],"hitsAddend":2}"#,
    r#"{"domain":"fuzz","descriptors":[{"entries":[{"key":"zero","value":"1"}]},{"entries":[{"key":"free","value":"1"}]},{"entries":[{"key":"s","value":"1"}],"hitsAddend":"5"},{"entries":[{"key":"q","value":"1"}]}]}"#,
    r#"{"domain":"fuzz","descriptors":[{"entries":[{"key":"w","value":"abc"}]},{"entries":[{"key":"u","value":"bob"},{"key":"p","value":"1"}]},{"entries":[{"key":"u","value":"bob"},{"key":"vip","value":"1"}]}]}"#,
    r#"{"domain":"fuzz","descriptors":[{"entries":[{"key":"fw","value":"2"}],"hitsAddend":"0"},{"entries":[{"key":"tb","value":"2"}],"limit":{"requestsPerUnit":1,"unit":"YEAR"}}]}"#,
];

/// Reference environments: the variables the mapping reads, valid and invalid values, and
/// flags given next to them.
const ENVIRONMENTS: &[&str] = &[
    "REDIS_URL=localhost:6379\nREDIS_AUTH=user:pass\nREDIS_TLS=true\nREDIS_POOL_SIZE=8\n",
    "REDIS_TYPE=cluster\nREDIS_URL=a:1,b:2,c:3\nREDIS_SOCKET_TYPE=tcp\n",
    "REDIS_SOCKET_TYPE=unix\nREDIS_URL=/run/redis.sock\nREDIS_AUTH=secret\n",
    "BACKEND_TYPE=memcache\nMEMCACHE_HOST_PORT=a:11211\n",
    "REDIS_TYPE=sentinel\nREDIS_URL=master,s1:26379\n",
    "HOST=127.0.0.1\nPORT=8080\nGRPC_HOST=::1\nGRPC_PORT=8081\nDEBUG_PORT=6070\n",
    "RUNTIME_ROOT=/srv\nRUNTIME_SUBDIRECTORY=rl\nRUNTIME_APPDIRECTORY=config\nRUNTIME_WATCH_ROOT=false\n",
    "LOG_LEVEL=debug\nLOG_FORMAT=json\nSHADOW_MODE=true\nLOCAL_CACHE_SIZE_IN_BYTES=1048576\n",
    "LIMIT_RESPONSE_HEADERS_ENABLED=true\nLIMIT_LIMIT_HEADER=X-Limit\nCACHE_KEY_PREFIX=rl_\n",
    "USE_STATSD=true\nSTATSD_HOST=localhost\nNEAR_LIMIT_RATIO=0.9\nEXPIRATION_JITTER_MAX_SECONDS=300\n",
    "--backend=memory\n--redis-url=redis://127.0.0.1:6379\nREDIS_URL=other:6379\nREDIS_AUTH=x\nPORT=9\n",
    "--grpc-addr=127.0.0.1:1\nGRPC_PORT=notaport\nREDIS_PERSECOND=true\nREDIS_PERSECOND_URL=p:1\n",
];

fn main() -> io::Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/corpus".into()),
    );
    let yaml_dirs = yaml_dirs(&[
        Path::new("config"),
        Path::new("fuzz/rules"),
        Path::new("tests/fixtures"),
    ])?;

    let config_file = target_dir(&out, "config_file")?;
    let config_dir = target_dir(&out, "config_dir")?;
    let mut all_files = Vec::new();
    for (dir, files) in &yaml_dirs {
        for file in files {
            fs::copy(file, config_file.join(seed_name(file)))?;
        }
        let pair = join_pair(files.first(), files.get(1))?;
        fs::write(config_dir.join(seed_name(dir)), pair)?;
        all_files.extend(files.iter().cloned());
    }
    // Valid files in pairs, so the directory target starts from valid directories too.
    for pair in all_files.windows(2) {
        let name = format!("{}+{}", seed_name(&pair[0]), seed_name(&pair[1]));
        fs::write(
            config_dir.join(name),
            join_pair(Some(&pair[0]), Some(&pair[1]))?,
        )?;
    }

    let json_body = target_dir(&out, "json_body")?;
    let request = target_dir(&out, "request")?;
    for (i, body) in REQUESTS.iter().enumerate() {
        let parsed = parse_json_request(body.as_bytes())
            .map_err(|error| io::Error::other(format!("request {i}: {error}")))?;
        fs::write(json_body.join(format!("request-{i:02}.json")), body)?;
        fs::write(
            request.join(format!("request-{i:02}.pb")),
            parsed.encode_to_vec(),
        )?;
    }

    let reference_env = target_dir(&out, "reference_env")?;
    for (i, environment) in ENVIRONMENTS.iter().enumerate() {
        fs::write(reference_env.join(format!("env-{i:02}.txt")), environment)?;
    }
    let xds_resources = target_dir(&out, "xds_resources")?;
    let configs = xds_configs();
    for (i, config) in configs.iter().enumerate() {
        fs::write(
            xds_resources.join(format!("config-{i:02}.pb")),
            config.encode_to_vec(),
        )?;
    }
    let joined: Vec<u8> = configs
        .iter()
        .map(Message::encode_to_vec)
        .collect::<Vec<_>>()
        .join(&0u8);
    fs::write(xds_resources.join("configs-all.pb"), joined)?;
    println!("seeds written under {}", out.display());
    Ok(())
}

/// `RateLimitConfig` resources as a control plane sends them: each unit, nesting, and the
/// descriptor flags.
fn xds_configs() -> Vec<RateLimitConfig> {
    let limited =
        |key: &str, value: &str, unit: RateLimitUnit, requests: u32| RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: requests,
                ..Default::default()
            }),
            ..Default::default()
        };
    let units = [
        RateLimitUnit::Second,
        RateLimitUnit::Minute,
        RateLimitUnit::Hour,
        RateLimitUnit::Day,
        RateLimitUnit::Week,
        RateLimitUnit::Month,
        RateLimitUnit::Year,
    ];
    let mut configs: Vec<RateLimitConfig> = units
        .iter()
        .enumerate()
        .map(|(i, unit)| RateLimitConfig {
            name: format!("unit-{i}"),
            domain: format!("domain-{i}"),
            descriptors: vec![limited("path", "/login", *unit, 10 + i as u32)],
        })
        .collect();
    let mut parent = RateLimitDescriptor {
        key: "user".into(),
        value: "alice".into(),
        shadow_mode: true,
        ..Default::default()
    };
    let mut child = limited("path", "", RateLimitUnit::Minute, 3);
    child.quota_mode = true;
    child.detailed_metric = true;
    parent.descriptors.push(child);
    let mut unlimited = limited("tier", "vip", RateLimitUnit::Second, 0);
    if let Some(policy) = unlimited.rate_limit.as_mut() {
        policy.unlimited = true;
    }
    configs.push(RateLimitConfig {
        name: "nested".into(),
        domain: "gateway".into(),
        descriptors: vec![
            parent,
            unlimited,
            limited("remote_address", "", RateLimitUnit::Hour, 100),
        ],
    });
    configs
}

/// `out/target`, created.
fn target_dir(out: &Path, target: &str) -> io::Result<PathBuf> {
    let dir = out.join(target);
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Every directory under `roots` holding YAML files, with its files sorted.
fn yaml_dirs(roots: &[&Path]) -> io::Result<Vec<(PathBuf, Vec<PathBuf>)>> {
    let mut found = Vec::new();
    let mut pending: Vec<PathBuf> = roots.iter().map(|root| root.to_path_buf()).collect();
    while let Some(dir) = pending.pop() {
        let mut files = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
            {
                files.push(path);
            }
        }
        files.sort();
        if !files.is_empty() {
            found.push((dir, files));
        }
    }
    found.sort();
    Ok(found)
}

/// Two files as the `config_dir` target reads them: joined by one NUL byte.
fn join_pair(first: Option<&PathBuf>, second: Option<&PathBuf>) -> io::Result<Vec<u8>> {
    let mut bytes = match first {
        Some(path) => fs::read(path)?,
        None => Vec::new(),
    };
    if let Some(path) = second {
        bytes.push(0);
        bytes.extend(fs::read(path)?);
    }
    Ok(bytes)
}

/// A flat file name for a seed taken from `path`.
fn seed_name(path: &Path) -> String {
    path.to_string_lossy().replace(['/', '\\'], "_")
}
