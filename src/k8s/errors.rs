//! Classification of Kubernetes API errors into what a controller should do next.
