//! Arbitrary bytes as the resources of one xDS response: split into `RateLimitConfig`
//! resources (and one of another type) and converted into rules as the xDS client converts
//! them. Never a panic, whatever the nesting; a converted set converts again to the same
//! rules (the conversion is deterministic, so an unchanged snapshot is seen as unchanged).
#![no_main]

use floodgate::xds::convert::{TYPE_URL, domains};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A zero byte separates resources; a resource starting with 0xff gets another type.
    let resources: Vec<pbjson_types::Any> = data
        .split(|byte| *byte == 0)
        .take(16)
        .map(|bytes| pbjson_types::Any {
            type_url: if bytes.first() == Some(&0xff) {
                "type.googleapis.com/other".to_owned()
            } else {
                TYPE_URL.to_owned()
            },
            value: bytes.to_vec().into(),
        })
        .collect();
    if let Ok(first) = domains(&resources) {
        let again = domains(&resources).expect("the same resources convert again");
        assert_eq!(first, again, "conversion is not deterministic");
    }
});
