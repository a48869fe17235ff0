//! Kubernetes client construction (--kubeconfig / --master / in-cluster) with the --kube-api-qps/--kube-api-burst token bucket.
