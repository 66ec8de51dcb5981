//! The caching allocator: its behaviour, its invariants (against a shadow model, and on every
//! configuration), faults from the backend, parked blocks, external memory and the figures it
//! reads. One test binary for the area.

#[path = "../common/configs.rs"]
mod common_configs;

mod allocator;
mod external;
mod faults;
mod invariants;
mod parking;
mod reads;
mod shadow_model;
