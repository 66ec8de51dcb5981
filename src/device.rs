//! The process-wide default allocator per device.

use crate::alloc::{AllocatorConfig, CachingAllocator};
use crate::backend::{Backend, HostBackend, SimBackend};
use crate::error::{Error, InvalidRequest, Result};
use crate::sync::Mutex;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// Environment variable choosing the default backend: `host`, `sim` or `cuda`.
pub const BACKEND_ENV: &str = "VRAMSCOPE_BACKEND";
/// Environment variable setting the capacity of the default device, e.g. `8GiB`: of the host
/// or sim backend, and on CUDA the most the allocator may reserve (a smaller GPU, seen from a
/// larger one: [`AllocatorConfig::limit_to_capacity`]).
pub const CAPACITY_ENV: &str = "VRAMSCOPE_CAPACITY";
/// Capacity of the default host device when [`CAPACITY_ENV`] is unset.
pub const DEFAULT_HOST_CAPACITY: u64 = 16 << 30;
/// Capacity of the default sim device when [`CAPACITY_ENV`] is unset.
pub const DEFAULT_SIM_CAPACITY: u64 = 80 << 30;

static DEVICES: OnceLock<Mutex<BTreeMap<usize, CachingAllocator>>> = OnceLock::new();

/// Parses a byte size with an optional unit: `1024`, `512 KiB`, `8GiB`, `2 GB`, `1.5MiB` (see
/// [`units::parse_byte_size`](crate::units::parse_byte_size), which this wraps in an error
/// naming the text).
pub fn parse_bytes(s: &str) -> Result<u64> {
    crate::units::parse_byte_size(s).map_err(|error| InvalidRequest::ByteSize { text: s.into(), error }.into())
}

/// Builds the backend [`device`] would use, from the environment, and the configuration: on
/// CUDA, `VRAMSCOPE_CAPACITY` limits what the allocator may reserve (the host and sim backends
/// take it as their capacity).
fn default_backend(index: usize, config: &mut AllocatorConfig) -> Result<Arc<dyn Backend>> {
    let _ = (index, &config);
    let kind = crate::error::env_text(BACKEND_ENV)?.unwrap_or_default();
    let capacity = match crate::error::env_text(CAPACITY_ENV)? {
        Some(s) => {
            let c = parse_bytes(&s).map_err(|e| Error::Config { key: CAPACITY_ENV.into(), message: e.to_string() })?;
            // Below one page no segment fits: every allocation would fail, each error claiming
            // free memory it could not give. Refused at once instead.
            let page = crate::backend::DEFAULT_PAGE_SIZE;
            if c < page {
                return Err(Error::Config {
                    key: CAPACITY_ENV.into(),
                    message: format!(
                        "{} is less than the smallest segment, {}: give at least {}",
                        crate::error::fmt_bytes(c),
                        crate::error::fmt_bytes(page),
                        crate::error::fmt_bytes(page)
                    ),
                });
            }
            Some(c)
        }
        None => None,
    };
    #[cfg(feature = "cuda-backend")]
    let cuda = |b: crate::backend::CudaBackend, config: &mut AllocatorConfig| -> Result<Arc<dyn Backend>> {
        if let Some(c) = capacity {
            config.limit_to_capacity(c, b.total_memory()).map_err(|e| match e {
                Error::Config { message, .. } => Error::Config { key: CAPACITY_ENV.into(), message },
                e => e,
            })?;
        }
        Ok(Arc::new(b))
    };
    match kind.trim().to_ascii_lowercase().as_str() {
        #[cfg(feature = "cuda-backend")]
        "cuda" => cuda(crate::backend::CudaBackend::new(index)?, config),
        // Without a choice: the CUDA device where the feature is on and one is present.
        #[cfg(feature = "cuda-backend")]
        "" => match crate::backend::CudaBackend::new(index) {
            Ok(b) => cuda(b, config),
            Err(_) => Ok(Arc::new(HostBackend::new(capacity.unwrap_or(DEFAULT_HOST_CAPACITY)))),
        },
        #[cfg(not(feature = "cuda-backend"))]
        "" => Ok(Arc::new(HostBackend::new(capacity.unwrap_or(DEFAULT_HOST_CAPACITY)))),
        "host" => Ok(Arc::new(HostBackend::new(capacity.unwrap_or(DEFAULT_HOST_CAPACITY)))),
        "sim" => Ok(Arc::new(SimBackend::new(capacity.unwrap_or(DEFAULT_SIM_CAPACITY)))),
        other => Err(Error::Config {
            key: BACKEND_ENV.into(),
            message: format!("unknown backend `{other}`; accepted: host, sim, and cuda with the `cuda` feature"),
        }),
    }
}

/// The process-wide allocator of device `index`, created on first use.
///
/// The backend is the one named by `VRAMSCOPE_BACKEND` (`host`, `sim`, `cuda`); unset, it is
/// the CUDA device `index` where the `cuda` feature is on and a device is present, else the host
/// backend (16 GiB unless `VRAMSCOPE_CAPACITY` says otherwise; on CUDA, `VRAMSCOPE_CAPACITY`
/// is the most the allocator may reserve). The configuration comes from
/// `VRAMSCOPE_ALLOC_CONF`. Every call for the same index returns a handle to the same allocator.
///
/// Errors when the environment holds a malformed setting.
pub fn try_device(index: usize) -> Result<CachingAllocator> {
    let map = DEVICES.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut map = map.lock();
    if let Some(a) = map.get(&index) {
        return Ok(a.clone());
    }
    let mut config = AllocatorConfig::from_env()?;
    let backend = default_backend(index, &mut config)?;
    let alloc = CachingAllocator::for_device(backend, index, config)?;
    map.insert(index, alloc.clone());
    Ok(alloc)
}

/// Like [`try_device`], for tests and examples: panics with the configuration error's message
/// if the environment holds a malformed setting.
///
/// ```
/// let alloc = vramscope::device(0);
/// let s = alloc.default_stream();
/// let x = alloc.alloc::<u8>(&s, 100).unwrap();
/// assert!(vramscope::device(0).memory_allocated() >= 512);
/// # drop(x);
/// ```
pub fn device(index: usize) -> CachingAllocator {
    match try_device(index) {
        Ok(a) => a,
        Err(e) => panic!("vramscope::device({index}): {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_bytes(" 2 GB ").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("1.5MiB").unwrap(), 3 << 19);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse_bytes("1e30TiB").is_err());
    }
}
