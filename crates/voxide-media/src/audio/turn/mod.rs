//! End-of-turn detection: the Smart Turn model (in `voxide-engines`).

pub use voxide_engines::turn::*;
