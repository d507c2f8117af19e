"""The dashboard's HTML: one page (static/index.html) whose script reads the
JSON views, a login form that turns a key into a cookie, and the static files.
No build step: the files are served as they are in the repository."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from inferq.producer.gateway.dashboard.access import COOKIE, identify, open_access, viewer
from inferq.producer.gateway.errors import APIError

router = APIRouter()

STATIC = Path(__file__).parent / "static"
_FILES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
# The page runs only its own script and styles, and never in a frame.
_HEADERS = {"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'", "X-Frame-Options": "DENY",
            "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def _login_page(message: str, status: int) -> HTMLResponse:
    html = (STATIC / "login.html").read_text().replace("{{message}}", message)
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


@router.get("/dashboard", include_in_schema=False)
async def page(request: Request):
    try:
        await viewer(request)
    except APIError as e:
        # Refused like every other dashboard route, with a way in for a person.
        return _login_page("Log in with an operator or API key." if e.status == 401 else e.message, e.status)
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=_HEADERS)


@router.get("/dashboard/login", include_in_schema=False)
async def login_form():
    return _login_page("Log in with an operator or API key.", 200)


@router.post("/dashboard/login", include_in_schema=False)
async def login(request: Request):
    form = parse_qs((await request.body()).decode("utf-8", errors="replace"))
    key = (form.get("key") or [""])[0].strip()
    if open_access(request.app):
        return RedirectResponse("/dashboard", status_code=303)
    if not key or identify(request.app, key) is None:
        return _login_page("That key is not valid here.", 401)
    resp = RedirectResponse("/dashboard", status_code=303)
    resp.set_cookie(COOKIE, key, httponly=True, samesite="strict", path="/dashboard",
                    secure=request.url.scheme == "https")
    return resp


@router.post("/dashboard/logout", include_in_schema=False)
async def logout():
    resp = RedirectResponse("/dashboard/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/dashboard")
    return resp


@router.get("/dashboard/static/{name}", include_in_schema=False)
async def static(name: str):
    # Code, not data: served to anyone, like the login form (a fixed list, no paths).
    if name not in _FILES:
        raise APIError(404, f"no static file {name!r}", code="not_found")
    return FileResponse(STATIC / name, media_type=_FILES[name], headers={"Cache-Control": "no-cache"})


@router.get("/dashboard/api/whoami")
async def whoami(request: Request):
    who = await viewer(request)
    return {"operator": who.operator, "tenant": who.tenant}
