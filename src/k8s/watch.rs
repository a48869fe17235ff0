//! Watches and reflector stores the controllers read from (lean caches, scoped selectors, indexes).
