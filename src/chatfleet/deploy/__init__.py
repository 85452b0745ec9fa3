"""Deployment: the one-machine launcher and the Kubernetes manifests (shells, docs/deploy.md)."""
