//! component-base's stability levels and meta metrics (`registered_metrics_total` and the three
//! zero counters next to it).
//!
//! Upstream counts every component-base registration in the binary, most of them apiserver
//! families it links but never fills; we count ours only: the families that mirror a
//! component-base one, registered through [`Registrar`] with its level. Plain families (the
//! provisioner library's `controller_*`, the process collector, our own `csi_provisioner_*`) are
//! not counted, as upstream does not count plain client_golang ones.

use prometheus_client::collector::Collector;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Metric, Registry};

use super::Labels;

/// component-base's stability level of a family; its help starts with `[LEVEL] `.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stability {
    Alpha,
    Beta,
}

impl Stability {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Alpha => "ALPHA",
            Self::Beta => "BETA",
        }
    }
}

/// The meta families; [`MetaMetrics::default`] is attached to no registry.
#[derive(Debug, Clone, Default)]
pub(crate) struct MetaMetrics {
    /// By `stability_level` and `deprecated_version` (always empty).
    registered: Family<Labels<2>, Counter>,
}

impl MetaMetrics {
    /// Registers the four meta families (they count themselves, as in component-base).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let meta = Self::default();
        let mut registrar = Registrar::new(registry, &meta);
        registrar.register(
            Stability::Beta,
            "registered_metrics",
            "The count of registered metrics broken by stability level and deprecation version.",
            meta.registered.clone(),
        );
        // We never disable or hide a metric, nor enforce cardinality: these stay 0, served
        // because dashboards built for upstream may query them.
        for (stability, name, help) in [
            (
                Stability::Beta,
                "disabled_metrics",
                "The count of disabled metrics.",
            ),
            (
                Stability::Beta,
                "hidden_metrics",
                "The count of hidden metrics.",
            ),
            (
                Stability::Alpha,
                "cardinality_enforcement_unexpected_categorizations",
                "The count of unexpected categorizations during cardinality enforcement.",
            ),
        ] {
            registrar.register(stability, name, help, Counter::<u64>::default());
        }
        meta
    }

    /// Counts `count` registrations at `stability`.
    pub(crate) fn count(&self, stability: Stability, count: u64) {
        let labels = [
            ("stability_level", stability.as_str().to_owned()),
            ("deprecated_version", String::new()),
        ];
        self.registered.get_or_create(&labels).inc_by(count);
    }
}

/// Registers families with a stability level: prefixes their help and counts them.
#[derive(Debug)]
pub(crate) struct Registrar<'a> {
    registry: &'a mut Registry,
    meta: &'a MetaMetrics,
}

impl<'a> Registrar<'a> {
    pub(crate) fn new(registry: &'a mut Registry, meta: &'a MetaMetrics) -> Self {
        Self { registry, meta }
    }

    /// Registers one family; `help` is given without the level prefix.
    pub(crate) fn register(
        &mut self,
        stability: Stability,
        name: &str,
        help: &str,
        metric: impl Metric,
    ) {
        self.registry
            .register(name, format!("[{}] {help}", stability.as_str()), metric);
        self.meta.count(stability, 1);
    }

    /// Registers a collector writing `families` families of `stability` (it writes their help).
    pub(crate) fn register_collector(
        &mut self,
        stability: Stability,
        families: u64,
        collector: Box<dyn Collector>,
    ) {
        self.registry.register_collector(collector);
        self.meta.count(stability, families);
    }
}

#[cfg(test)]
#[path = "meta_tests.rs"]
mod tests;
