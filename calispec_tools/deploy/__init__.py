"""Deployment helpers: Ray actors and config, Kubernetes manifests."""
