"""Rendering the config tree into Kubernetes manifests through Jinja2 templates."""
