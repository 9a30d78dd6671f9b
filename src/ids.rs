//! Typed identifiers. Each is an index into an arena owned by one component
//! (requests by the cluster, workers by the cluster), so they are dense and
//! cheap to copy.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl $name {
            /// The arena index this id stands for.
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A request, numbered in generation order from 0 within a run.
    RequestId,
    "req"
);
id_type!(
    /// A worker (one vLLM-like engine instance), numbered from 0 in creation order.
    WorkerId,
    "w"
);
id_type!(
    /// A workload stage, numbered from 0 in configuration order.
    StageId,
    "stage"
);
