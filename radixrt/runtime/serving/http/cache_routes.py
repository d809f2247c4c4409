"""GET /cache_tree (the radix tree as JSON) and GET /dashboard (one page that draws it, with live
figures).

The dashboard is static files from this package plus plotly's own bundled `plotly.min.js`, served
from the installed plotly package: no build step, and nothing is fetched from the network. The page
itself carries no data, so it is served without a key; the data it reads needs the admin key
(/cache_tree is an admin route, /get_server_info shows others a reduced view: auth_levels.py), and
the page asks for it.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse

from radixrt.runtime.cache_tree_text import check_view_limits
from radixrt.runtime.core.cache_view import DEFAULT_MAX_DEPTH, DEFAULT_MAX_NODES
from radixrt.runtime.serving.http.protocol import APIError

DASHBOARD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard")
# the page and its assets: public (see the module docstring)
PUBLIC_PATHS = frozenset({"/dashboard", "/dashboard/dashboard.js", "/dashboard/plotly.min.js"})
_ASSET_CACHE = {"Cache-Control": "max-age=3600"}


def plotly_js_path() -> str | None:
    """plotly's bundled JavaScript, or None when plotly is not installed."""
    try:
        import plotly
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")
    return path if os.path.isfile(path) else None


def _int_param(request: Request, name: str, default: int) -> Any:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return raw  # check_view_limits names the field


def add_cache_routes(app: FastAPI, tm: Any) -> None:
    @app.get("/cache_tree")
    async def cache_tree(request: Request) -> dict[str, Any]:
        for key in request.query_params:
            if key not in ("max_depth", "max_nodes"):
                raise APIError(
                    f"unknown query parameter {key!r} (expected max_depth, max_nodes)", param=key
                )
        max_depth = _int_param(request, "max_depth", DEFAULT_MAX_DEPTH)
        max_nodes = _int_param(request, "max_nodes", DEFAULT_MAX_NODES)
        try:
            check_view_limits(max_depth, max_nodes)
        except ValueError as e:
            raise APIError(str(e), param=str(e).split()[0]) from None
        return await tm.cache_tree(max_depth, max_nodes)

    @app.get("/dashboard")
    async def dashboard() -> HTMLResponse:
        with open(os.path.join(DASHBOARD_DIR, "index.html"), encoding="utf-8") as f:
            return HTMLResponse(f.read())

    @app.get("/dashboard/dashboard.js")
    async def dashboard_js() -> FileResponse:
        return FileResponse(
            os.path.join(DASHBOARD_DIR, "dashboard.js"), media_type="text/javascript"
        )

    @app.get("/dashboard/plotly.min.js")
    async def plotly_js() -> FileResponse:
        path = plotly_js_path()
        if path is None:
            raise APIError(
                "the dashboard needs plotly's bundled JavaScript: pip install plotly",
                501,
                "server_error",
                code="plotly_missing",
            )
        return FileResponse(path, media_type="text/javascript", headers=_ASSET_CACHE)
