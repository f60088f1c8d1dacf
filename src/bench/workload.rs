//! The requests a bench run sends: encoded once up front when they fit in a bounded pool, so
//! the generator spends its share of the machine on the wire rather than on building and
//! encoding messages; encoded per call beyond that bound (a million keys of five
//! descriptors would otherwise hold hundreds of MB).

use prost::Message;
use prost::bytes::Bytes;

use crate::proto::common::RateLimitDescriptor;
use crate::proto::common::rate_limit_descriptor::Entry;
use crate::proto::rls::RateLimitRequest;

/// Most descriptors kept pre-encoded (about 30 bytes each).
const POOL_DESCRIPTORS: u64 = 1_000_000;

/// What one call asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Key number `n` of the spread traffic.
    Key(u64),
    /// The single over-limit descriptor.
    OverLimit,
}

/// The request set of one run.
#[derive(Debug)]
pub struct Workload {
    domain: String,
    key: String,
    keys: u64,
    descriptors: usize,
    over_limit_share: f64,
    over_limit: Bytes,
    /// One buffer holding every spread request back to back, and where each ends.
    pool: Option<(Bytes, Vec<u32>)>,
}

impl Workload {
    /// Builds the request set (and the pool when it fits).
    pub fn new(
        domain: &str,
        key: &str,
        keys: u64,
        descriptors: usize,
        over_limit_key: &str,
        over_limit_share: f64,
    ) -> Workload {
        let mut workload = Workload {
            domain: domain.to_owned(),
            key: key.to_owned(),
            keys: keys.max(1),
            descriptors: descriptors.max(1),
            over_limit_share,
            over_limit: Bytes::from(
                request(domain, vec![descriptor(over_limit_key, "hot".into())]).encode_to_vec(),
            ),
            pool: None,
        };
        if workload.keys.saturating_mul(workload.descriptors as u64) <= POOL_DESCRIPTORS {
            let mut buffer = Vec::new();
            let mut ends = Vec::with_capacity(workload.keys as usize);
            for n in 0..workload.keys {
                workload.encode(n).encode(&mut buffer).expect("Vec grows");
                ends.push(u32::try_from(buffer.len()).expect("pool under 4 GiB"));
            }
            workload.pool = Some((Bytes::from(buffer), ends));
        }
        workload
    }

    /// The value of descriptor `j` of key `n`.
    pub fn value(n: u64, j: usize) -> String {
        if j == 0 {
            n.to_string()
        } else {
            format!("{n}.{j}")
        }
    }

    fn encode(&self, n: u64) -> RateLimitRequest {
        let descriptors = (0..self.descriptors)
            .map(|j| descriptor(&self.key, Workload::value(n, j)))
            .collect();
        request(&self.domain, descriptors)
    }

    /// Chooses what the next call asks, from a uniform random number.
    pub fn pick(&self, random: u64) -> Pick {
        if self.over_limit_share > 0.0 {
            let unit = (random >> 11) as f64 / (1u64 << 53) as f64;
            if unit < self.over_limit_share {
                return Pick::OverLimit;
            }
        }
        Pick::Key(random.rotate_left(17) % self.keys)
    }

    /// The encoded request for `pick`.
    pub fn body(&self, pick: Pick) -> Bytes {
        let n = match pick {
            Pick::OverLimit => return self.over_limit.clone(),
            Pick::Key(n) => n,
        };
        match &self.pool {
            Some((buffer, ends)) => {
                let start = match n {
                    0 => 0,
                    n => ends[n as usize - 1] as usize,
                };
                buffer.slice(start..ends[n as usize] as usize)
            }
            None => Bytes::from(self.encode(n).encode_to_vec()),
        }
    }

    /// Descriptors decided by one answered call.
    pub fn descriptors_of(&self, pick: Pick) -> u64 {
        match pick {
            Pick::OverLimit => 1,
            Pick::Key(_) => self.descriptors as u64,
        }
    }
}

fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value,
        }],
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// xorshift64: a cheap, deterministic spread over the keys, one state per worker.
#[derive(Debug, Clone)]
pub struct Random(u64);

impl Random {
    /// A generator for worker `seed` (any value; zero is avoided).
    pub fn new(seed: u64) -> Random {
        Random((seed.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: Bytes) -> RateLimitRequest {
        RateLimitRequest::decode(body).unwrap()
    }

    #[test]
    fn pooled_and_per_call_requests_are_identical() {
        let pooled = Workload::new("d", "user", 50, 3, "tiny", 0.0);
        assert!(pooled.pool.is_some());
        let mut per_call = Workload::new("d", "user", 50, 3, "tiny", 0.0);
        per_call.pool = None;
        for n in [0, 1, 17, 49] {
            let body = pooled.body(Pick::Key(n));
            assert_eq!(body, per_call.body(Pick::Key(n)));
            let request = decode(body);
            assert_eq!(request.domain, "d");
            let values: Vec<_> = request
                .descriptors
                .iter()
                .map(|d| (d.entries[0].key.as_str(), d.entries[0].value.clone()))
                .collect();
            let n = n.to_string();
            assert_eq!(
                values,
                [
                    ("user", n.clone()),
                    ("user", format!("{n}.1")),
                    ("user", format!("{n}.2"))
                ]
            );
        }
    }

    #[test]
    fn picks_cover_the_keys_and_honour_the_over_limit_share() {
        let workload = Workload::new("d", "user", 10, 1, "tiny", 0.25);
        let mut random = Random::new(7);
        let mut seen = [0u32; 10];
        let mut over = 0;
        for _ in 0..10_000 {
            match workload.pick(random.next_u64()) {
                Pick::Key(n) => seen[n as usize] += 1,
                Pick::OverLimit => over += 1,
            }
        }
        assert!(seen.iter().all(|&count| count > 500), "{seen:?}");
        assert!((2000..3000).contains(&over), "{over}");
        let hot = decode(workload.body(Pick::OverLimit));
        assert_eq!(hot.descriptors[0].entries[0].key, "tiny");
        assert_eq!(hot.descriptors[0].entries[0].value, "hot");
    }
}
