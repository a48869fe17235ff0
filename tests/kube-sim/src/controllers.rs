//! Control loops standing in for kube-controller-manager (and the scheduler's volume binding).

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use crate::Inner;
use crate::store::Record;

pub(crate) fn spawn(_inner: Arc<Inner>, mut rx: UnboundedReceiver<Arc<Record>>) -> JoinHandle<()> {
    tokio::spawn(async move { while rx.recv().await.is_some() {} })
}
