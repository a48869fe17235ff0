//! A tonic channel to a CSI driver on a Unix socket (bare path or `unix://` URL), for tests.

use std::path::Path;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::config::socket_path;

/// Connects to the CSI driver at `endpoint`. The URI given to tonic is a placeholder: the
/// connector dials the socket.
pub async fn connect(endpoint: impl AsRef<Path>) -> Result<Channel, tonic::transport::Error> {
    let path = socket_path(&endpoint.as_ref().to_string_lossy());
    Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}
