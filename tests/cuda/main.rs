//! The CUDA backend on a real device (feature `cuda-backend`); each test says why it skips
//! where there is no driver or device.

mod cuda;
