"""Rendering the config tree into Kubernetes manifests through Jinja2 templates.

>>> from mpigate.config import load
>>> from mpigate.render import render, write_tree
>>> rendering = render(load("."))           # doctest: +SKIP
>>> write_tree(rendering, "build/deploy")   # doctest: +SKIP

See docs/rendering.md for what is rendered and how to override templates.
"""

from .bundle import Bundle, bundle_key, collect_bundle
from .context import build_context, pod_security_levels, team_context
from .diff import ObjectChange, baseline_objects, diff_objects, render_at_ref, rendering_objects
from .errors import RenderError, RenderProblem
from .manifests import ObjectKey, canonical, dump_documents, dump_object, object_key
from .renderer import MARKER_FILE, RenderedObject, Rendering, render
from .templates import Templates, builtin_template_dir, search_path
from .tree import WriteStats, read_objects, write_tree

__all__ = [
    "MARKER_FILE",
    "Bundle",
    "ObjectChange",
    "ObjectKey",
    "RenderError",
    "RenderProblem",
    "RenderedObject",
    "Rendering",
    "Templates",
    "WriteStats",
    "baseline_objects",
    "build_context",
    "builtin_template_dir",
    "bundle_key",
    "canonical",
    "collect_bundle",
    "diff_objects",
    "dump_documents",
    "dump_object",
    "object_key",
    "pod_security_levels",
    "read_objects",
    "render",
    "render_at_ref",
    "rendering_objects",
    "search_path",
    "team_context",
    "write_tree",
]
