//! App resources: values the app hands to every tool handler (a database pool, a user record).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A type-keyed set of shared values, cheap to clone.
#[derive(Clone, Default)]
pub struct AppResources(Arc<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl AppResources {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `value`, replacing any earlier value of its type.
    pub fn with<T: Any + Send + Sync>(mut self, value: T) -> Self {
        Arc::make_mut(&mut self.0).insert(TypeId::of::<T>(), Arc::new(value));
        self
    }

    /// The value of type `T`, if the app provided one.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>())?.downcast_ref()
    }
}

impl fmt::Debug for AppResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AppResources({} values)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_found_by_type() {
        struct Db(&'static str);
        let r = AppResources::new().with(Db("pg")).with(7u32);
        assert_eq!(r.get::<Db>().map(|d| d.0), Some("pg"));
        assert_eq!(r.get::<u32>(), Some(&7));
        assert!(r.get::<String>().is_none());
    }
}
