"""Open the built docs site in headless Chromium and check that its pages render.

Run from the repository root, after ``mkdocs build``::

    python tools/check_site.py site
    python tools/check_site.py site --screenshots shots/   # also a PNG of each page

The site is served on 127.0.0.1 by this script. Every page it checks (the home
page, the API pages and pages with pictures, by default) is loaded by Chromium
(``--headless --dump-dom``); the server adds a small script to each HTML page it
serves, which, once the page has loaded, writes into the page what the browser
saw: the page's heading, every ``<img>`` with whether it loaded (``complete`` and
``naturalWidth > 0``) and every link. This script then fails when:

- a page has no heading, or its content is missing;
- an image did not load, or a page expected to have pictures has none;
- the page asked the server for anything it does not have (a 404: a stylesheet,
  a script, an image);
- an internal link leads to no page, or to a ``#fragment`` that the target page
  does not have.

Links to other sites are not followed (CI may have no network). Exit status 0
when every page passes, 1 otherwise (each problem printed), 2 when Chromium is
missing.
"""

from __future__ import annotations

import argparse
import functools
import html.parser
import http.server
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

PAGES = ["", "api/", "reference/", "autoreset/", "process/"]
"""Pages checked by default: the home page, both API pages, two pages with pictures."""
WITH_PICTURES = {"autoreset/", "process/"}
MARK = "aiovec-site-check"
PROBE = f"""
<script>
window.addEventListener("load", () => {{
  const out = document.createElement("pre");
  out.id = "{MARK}";
  const article = document.querySelector("article") || document.body;
  const h1 = article.querySelector("h1");
  out.textContent = JSON.stringify({{
    heading: h1 ? h1.textContent.replace("\u00b6", "").trim() : "",
    text: article.textContent.length,
    images: [...document.images].map((img) => ({{
      src: img.currentSrc || img.src,
      loaded: img.complete && img.naturalWidth > 0,
      width: img.naturalWidth,
    }})),
    links: [...document.querySelectorAll("a[href]")].map((a) => a.href),
  }});
  document.body.appendChild(out);
}});
</script>
"""
CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the site, adds the probe to HTML pages, and remembers every 404."""

    missing: list[str]

    def send_head(self) -> Any:  # adds the probe to HTML pages
        path = pathlib.Path(self.translate_path(self.path))
        if path.is_dir():
            path = path / "index.html"
        if path.suffix != ".html" or not path.is_file():
            return super().send_head()
        body = path.read_bytes().replace(b"</body>", PROBE.encode() + b"</body>", 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return _Body(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        if code == 404 and not self.headers.get("User-Agent", "").startswith("Python-urllib"):
            self.missing.append(self.path)  # asked for by the browser (not a link check)
        super().send_error(code, message, explain)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class _Body:
    """A file-like object over bytes, as ``send_head`` returns."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int = -1) -> bytes:
        data, self.data = self.data, b""
        return data

    def close(self) -> None:
        pass


class _Ids(html.parser.HTMLParser):
    """Every ``id`` (and ``name`` of an ``<a>``) of a page: the fragments it has."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value and (key == "id" or (tag == "a" and key == "name")):
                self.ids.add(value)


def find_chromium(given: str | None) -> str | None:
    """The Chromium to run: the one given, else the first of `CHROMIUMS` on PATH."""
    if given:
        return shutil.which(given)
    for name in CHROMIUMS:
        if found := shutil.which(name):
            return found
    return None


def browse(chromium: str, url: str, profile: str, screenshot: pathlib.Path | None) -> str:
    """The DOM of ``url`` after it loaded in headless Chromium (and a screenshot)."""
    base = [
        chromium,
        "--headless",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--window-size=1280,1600",
        "--virtual-time-budget=10000",
    ]
    done = subprocess.run(
        [*base, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited with {done.returncode}: {done.stderr[-2000:]}")
    if screenshot is not None:
        subprocess.run(
            [*base, f"--screenshot={screenshot}", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return done.stdout


def probe_of(dom: str) -> dict[str, Any] | None:
    """What the probe wrote into the page, or None if it never ran."""
    start = dom.find(f'id="{MARK}">')
    if start < 0:
        return None
    start = dom.index(">", start) + 1
    end = dom.index("</pre>", start)
    return json.loads(html.unescape(dom[start:end]))  # type: ignore[no-any-return]


@functools.cache
def fetch(url: str) -> tuple[int, str]:
    """Status and text of an internal URL (without its fragment)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, ""


def ids_of(text: str) -> set[str]:
    parser = _Ids()
    parser.feed(text)
    return parser.ids


def check_link(link: str, root: str) -> str | None:
    """What is wrong with an internal link (None if it resolves, or is external)."""
    if not link.startswith(root):
        return None
    page, _, fragment = link.partition("#")
    status, text = fetch(page)
    if status != 200:
        return f"{link}: HTTP {status}"
    fragment = urllib.parse.unquote(fragment)
    if fragment and fragment not in ids_of(text):
        return f"{link}: the page has no #{fragment}"
    return None


def check_page(chromium: str, root: str, page: str, shots: pathlib.Path | None) -> list[str]:
    """Every problem of one page (an empty list when it renders)."""
    url = root + page
    shot = None
    if shots is not None:
        shot = shots / ((page.strip("/").replace("/", "-") or "index") + ".png")
    with tempfile.TemporaryDirectory() as profile:
        dom = browse(chromium, url, profile, shot)
    seen = probe_of(dom)
    if seen is None:
        return [f"{url}: the page never finished loading (no probe in its DOM)"]
    problems = []
    if not seen["heading"] or seen["text"] < 200:
        problems.append(f"{url}: no heading or no content ({seen['text']} characters)")
    for image in seen["images"]:
        if not image["loaded"]:
            problems.append(f"{url}: image {image['src']} did not load")
    if page in WITH_PICTURES and not seen["images"]:
        problems.append(f"{url}: a page with pictures shows none")
    for link in sorted(set(seen["links"])):
        if (problem := check_link(link, root)) is not None:
            problems.append(f"{url}: broken link {problem}")
    pictures = sum(image["loaded"] for image in seen["images"])
    print(
        f"{url}: {seen['heading']!r}, {pictures} picture(s) loaded, "
        f"{len(set(seen['links']))} link(s) checked"
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=pathlib.Path, help="the built site (mkdocs --site-dir)")
    parser.add_argument("--pages", nargs="+", default=PAGES, help="pages, relative to the root")
    parser.add_argument("--screenshots", type=pathlib.Path, help="save a PNG of each page here")
    parser.add_argument("--chromium", help="the browser to run (default: chromium on PATH)")
    args = parser.parse_args(argv)

    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    if not (args.site / "index.html").is_file():
        print(f"{args.site} holds no built site (no index.html)", file=sys.stderr)
        return 1
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)

    missing: list[str] = []
    handler = type("Handler", (_Handler,), {"missing": missing})
    serve = functools.partial(handler, directory=str(args.site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), serve)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    root = f"http://127.0.0.1:{server.server_address[1]}/"
    problems: list[str] = []
    try:
        for page in args.pages:
            problems += check_page(chromium, root, page, args.screenshots)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    problems += [f"the browser asked for {path}, which the site does not have" for path in missing]
    for problem in problems:
        print("FAIL", problem, file=sys.stderr)
    print(f"{len(args.pages)} page(s) checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
