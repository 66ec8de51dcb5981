//! The allocator configurations every property test runs under.

use proptest::prelude::*;
use vramscope::config::AllocatorConfig;

/// The default, no fragmentation limit, PyTorch's split and rounding options, a fixed limit
/// without page release, and views of the range's pages.
pub fn configs() -> impl Strategy<Value = AllocatorConfig> {
    prop_oneof![
        Just(AllocatorConfig::default()),
        Just(AllocatorConfig::parse("fragmentation_limit:off").unwrap()),
        Just(AllocatorConfig::parse("max_split_size_mb:40,roundup_power2_divisions:4").unwrap()),
        Just(AllocatorConfig::parse("fragmentation_limit:1.0,release_pages:false").unwrap()),
        Just(AllocatorConfig::parse("alias_pages:True").unwrap()),
    ]
}
