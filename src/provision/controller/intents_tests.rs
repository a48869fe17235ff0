//! Test-only construction of the intent log, for the provisioning shell's tests.

use std::sync::Arc;

use super::{ClaimRecords, Ledger};

impl super::IntentLog {
    /// A log over `ledger` (`None`: claim records only) and the claim records `claims` mirrors.
    pub(crate) fn new(ledger: Option<Ledger>, claims: Arc<ClaimRecords>) -> Self {
        Self { ledger, claims }
    }
}
