//! Which master holds which hash slot, so that the Redis Cluster backend can group a batch by
//! node: the slot of a key, and the slot map read from `CLUSTER SLOTS`.

use redis::Value;

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16_384;

/// The hash slot of `key`, as every node computes it: CRC16 (XMODEM) of the key's hash tag
/// (the text between its first `{` and the next `}`, when not empty), else of the whole key,
/// modulo 16384.
pub(super) fn slot_of(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % SLOTS
}

/// The master of every slot, as one node saw it when asked.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    /// Index into `masters` of each slot's master; `None` for a slot nobody serves.
    owner: Vec<Option<u16>>,
    /// Each master's `host:port`.
    masters: Vec<String>,
    /// Each master's lowest slot.
    first: Vec<u16>,
}

/// A `CLUSTER SLOTS` reply of another shape than Redis documents, with the part at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum BadSlots {
    /// The reply is not an array.
    #[error("CLUSTER SLOTS: not an array: {0:?}")]
    NotArray(Value),
    /// A range is not `[start, end, node, ...]` within the 16,384 slots.
    #[error("CLUSTER SLOTS: bad range {0}")]
    Range(String),
    /// A node is not `[host, port, ...]`.
    #[error("CLUSTER SLOTS: bad node {0:?}")]
    Node(Vec<Value>),
    /// A host is not a string.
    #[error("CLUSTER SLOTS: bad host {0:?}")]
    Host(Value),
}

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply: `[[start, end, [host, port, ...], replicas...], ...]`.
    pub(super) fn parse(reply: &Value) -> Result<SlotMap, BadSlots> {
        let Value::Array(ranges) = reply else {
            return Err(BadSlots::NotArray(reply.clone()));
        };
        let mut map = SlotMap {
            owner: vec![None; usize::from(SLOTS)],
            masters: Vec::new(),
            first: Vec::new(),
        };
        for range in ranges {
            let (start, end, master) = match range {
                Value::Array(fields) if fields.len() >= 3 => (&fields[0], &fields[1], &fields[2]),
                other => return Err(BadSlots::Range(format!("{other:?}"))),
            };
            let (Value::Int(start), Value::Int(end), Value::Array(node)) = (start, end, master)
            else {
                return Err(BadSlots::Range(format!("{range:?}")));
            };
            let address = match node.as_slice() {
                [host, Value::Int(port), ..] => format!("{}:{port}", text(host)?),
                other => return Err(BadSlots::Node(other.to_vec())),
            };
            let (start, end) = (*start, *end);
            if !(0 <= start && start <= end && end < i64::from(SLOTS)) {
                return Err(BadSlots::Range(format!("{start}-{end}")));
            }
            let index = match map.masters.iter().position(|m| *m == address) {
                Some(index) => {
                    map.first[index] = map.first[index].min(start as u16);
                    index
                }
                None => {
                    map.masters.push(address);
                    map.first.push(start as u16);
                    map.masters.len() - 1
                }
            };
            for slot in start..=end {
                map.owner[slot as usize] = Some(index as u16);
            }
        }
        Ok(map)
    }

    /// The master of `slot`, as an index into [`SlotMap::masters`].
    pub(super) fn owner(&self, slot: u16) -> Option<usize> {
        self.owner
            .get(usize::from(slot))
            .copied()
            .flatten()
            .map(usize::from)
    }

    /// Every master's `host:port`.
    pub(super) fn masters(&self) -> &[String] {
        &self.masters
    }

    /// The lowest slot that `master` (an index into [`SlotMap::masters`]) holds.
    pub(super) fn first_slot(&self, master: usize) -> u16 {
        self.first[master]
    }
}

fn text(value: &Value) -> Result<String, BadSlots> {
    match value {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Ok(text.clone()),
        other => Err(BadSlots::Host(other.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // CRC16/XMODEM's check value is 0x31C3 for "123456789"; Redis gives "foo" slot 12182.
        assert_eq!(slot_of(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"fg:{foo}"), 12182, "the hash tag decides");
        assert_eq!(
            slot_of(b"x{}foo"),
            slot_of(b"x{}foo"),
            "an empty tag hashes all"
        );
        assert_ne!(slot_of(b"x{}foo"), slot_of(b""));
    }

    #[test]
    fn a_cluster_slots_reply_maps_every_range_to_its_master() {
        let node = |port| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |start, end, port| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                node(port),
                node(port + 1),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 99, 7000),
            range(100, 16_000, 7002),
            range(16_001, 16_383, 7000),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        assert_eq!(map.masters(), ["127.0.0.1:7000", "127.0.0.1:7002"]);
        assert_eq!(map.owner(0), Some(0));
        assert_eq!(map.owner(100), Some(1));
        assert_eq!(map.owner(16_383), Some(0));
        assert_eq!((map.first_slot(0), map.first_slot(1)), (0, 100));
        let partial = SlotMap::parse(&Value::Array(vec![range(5, 5, 7000)])).unwrap();
        assert_eq!((partial.owner(4), partial.owner(5)), (None, Some(0)));
        assert!(SlotMap::parse(&Value::Array(vec![range(9, 16_384, 7000)])).is_err());
        assert!(SlotMap::parse(&Value::Nil).is_err());
    }
}
