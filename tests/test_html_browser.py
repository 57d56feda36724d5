"""The HTML report opened in a real browser (Debian's headless Chromium, driven by Playwright):
whatever a label value, a site's playbook or its runbook URL holds, no script runs, no request
leaves the page, nothing is built from it but text, and the evidence plots are drawn. The
page's Content-Security-Policy is checked to hold on its own, as a second wall behind the
escaping.

One browser serves the module (a module-scoped fixture: its tests share one pytest-xdist
worker). Without Chromium the module is skipped, except in CI (``CI`` set), where it fails:
scripts/install-deps installs it there."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import diagnoser
from diagnoser.report import render
from lab.replay import Replay

ROOT = Path(__file__).resolve().parent.parent
ANSWERS = ROOT / "tests" / "data" / "answers"
END = 1793534400.0  # the recordings' end (tests/test_replay.py)
MODEL = "llama-3.1-8b-instruct"  # the model the retrieval-launch recording served

# Chromium as it runs here: no sandbox (a container), no GPU, and nothing of its own on the
# network (no QUIC, no component updates, no sync, no background fetches).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Every payload would set window.__pwned, raise a dialog, log or fetch if it ran; the
# addresses are loopback ports nothing listens on, and every request is stopped anyway.
BEACON = "http://127.0.0.1:9"
PAYLOADS = [
    "<script>window.__pwned='script';alert(1);console.log('pwned')</script>",
    '"><img src=x onerror="window.__pwned=\'img\';alert(2)">',
    "'><svg onload=\"window.__pwned='svg'\"><circle r=40 /></svg>",
    "javascript:window.__pwned='url'//",
    f"</style><style>body{{background:url({BEACON}/css)}}</style>",
    f"x{{background:url({BEACON}/css-value)}} @import '{BEACON}/import.css';",
    f"</title></svg></table><iframe src={BEACON}/frame></iframe>",
    f"<link rel=stylesheet href={BEACON}/link.css>",
    f"<meta http-equiv=refresh content='0;url={BEACON}/refresh'>",
    f"<base href={BEACON}/><a href=\"javascript:window.__pwned='a'\">click</a>",
    "<![CDATA[</text><script>window.__pwned='cdata'</script>]]>",
]
HOSTILE = " ".join(PAYLOADS)
RLO = "\u202e"  # right-to-left override: what follows it is drawn backwards
LONG = "A" * 6000  # one word as wide as many screens

# What a report page may hold, by tag: anything else was made from a value.
ELEMENTS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "strong", "b", "code",
    "span", "div", "table", "tbody", "tr", "th", "td", "ul", "ol", "li", "a", "figure",
    "figcaption", "svg", "rect", "polyline", "line", "text",
}  # fmt: skip


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module, with a profile of its own (Playwright makes a
    fresh one for each launch)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        why = "no chromium on PATH: scripts/install-deps installs it (Debian package chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the browser test")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class Visit:
    """One page opened from disk, and everything it did."""

    page: Any
    url: str
    dialogs: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)  # every request the page made
    routed: list[str] = field(default_factory=list)  # those that reached the network
    refused: list[str] = field(default_factory=list)  # those that failed, and why

    def left(self) -> list[str]:
        """Every request that reached the network but the one for the page itself."""
        return [u for u in self.routed if u != self.url]

    def js(self, expr: str) -> Any:
        return self.page.evaluate(expr)


# Recorded before the page's own content runs: the policy's refusals, as the page saw them.
WATCH_POLICY = """
window.__refused = [];
document.addEventListener('securitypolicyviolation',
  e => window.__refused.push(e.effectiveDirective + ' ' + e.blockedURI));
"""


def settle(page) -> None:
    """Long enough for what a payload would do after the page loaded (a refresh of 0 s, an
    image's error) to have been done."""
    page.wait_for_timeout(100)


def visit(browser, path: Path) -> Visit:
    """Open ``path`` with scripts on (a payload that got through would run), every request
    recorded and all but the page's own stopped."""
    context = browser.new_context()
    page = context.new_page()
    seen = Visit(page, path.as_uri())

    def on_dialog(dialog) -> None:
        seen.dialogs.append(dialog.message)
        dialog.dismiss()

    def on_route(route) -> None:
        seen.routed.append(route.request.url)
        if route.request.url == seen.url:
            route.continue_()
        else:
            route.abort()

    page.on("dialog", on_dialog)
    page.on("console", lambda m: seen.console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.on("request", lambda r: seen.asked.append(r.url))
    page.on("requestfailed", lambda r: seen.refused.append(f"{r.url} {r.failure}"))
    context.route("**/*", on_route)
    page.add_init_script(WATCH_POLICY)
    page.goto(seen.url)
    settle(page)
    return seen


# --- the pages -------------------------------------------------------------------------------


def _hostile_replay(model: str) -> Replay:
    """The retrieval launch, recorded, its model served under the name ``model``."""
    replay = Replay(ANSWERS / "retrieval-launch.json.gz")
    for answers in (replay.answers, replay.instants):
        for series in answers.values():
            for s in series:
                if s["metric"].get("model_name") == MODEL:
                    s["metric"]["model_name"] = model
    return replay


def _hostile_site(tmp: Path) -> tuple[Path, Path]:
    """A site config whose runbook URL is http(s) with markup after the host, and a catalog
    of the site's own holding a copy of prompt-length-shift whose words are markup."""
    source = yaml.safe_load((ROOT / "playbooks" / "prompt-length-shift.yaml").read_text())
    source.update(
        id="site-prompt-shift",
        title=f"{PAYLOADS[1]} {RLO}gnp.exe",  # a title is 80 characters at most
        cause=f"{HOSTILE} {RLO}txt.exe",
        fix=[PAYLOADS[0], PAYLOADS[1], f"{RLO}{PAYLOADS[4]}"],
        guardrail=[PAYLOADS[2], PAYLOADS[9]],
    )
    source["alert"]["name"] = "SitePromptShift"
    catalog = tmp / "playbooks"
    catalog.mkdir()
    (catalog / "site-prompt-shift.yaml").write_text(yaml.safe_dump(source, sort_keys=False))
    config = tmp / "site.yaml"
    url = f'https://rb.example/{{id}}?q="><script>window.__pwned=1</script>&r={BEACON}/rb'
    config.write_text(f"runbook_url: {json.dumps(url)}\n")
    return config, catalog


@dataclass
class Hostile:
    """The hostile diagnosis's two pages, open."""

    site_runbook: Visit  # the site's runbook URL, markup after its host
    javascript_runbook: Visit  # a ``javascript:`` runbook URL
    plots: int  # how many evidence plots each page has


@pytest.fixture(scope="module")
def hostile(browser, tmp_path_factory) -> Iterator[Hostile]:
    """The retrieval launch diagnosed with a model named by every payload (a right-to-left
    override and a word of 6,000 letters among them) and the site's hostile playbook and
    runbook URL, its warnings, reasons and caveats hostile too; written as a page twice, with
    that runbook URL and with a ``javascript:`` one that no config would accept, and each
    opened once."""
    tmp = tmp_path_factory.mktemp("hostile-html")
    config, catalog = _hostile_site(tmp)
    model = f"{HOSTILE} {RLO}fdp.exe {LONG}"
    d = diagnoser.diagnose(
        _hostile_replay(model), since="1h", until=END, config=config, catalog=catalog
    )
    assert [h.scope["model_name"] for h in d.health] == [model]
    assert "site-prompt-shift" in {m.playbook.id for m in d.findings}, d.findings
    d.warnings = [HOSTILE]
    for h in d.health:
        h.reasons = [HOSTILE]
    for m in d.findings:
        m.caveats = [HOSTILE]
    site_runbook = tmp / "site-runbook.html"
    site_runbook.write_text(render(d, "html"))
    url = "javascript:window.__pwned='runbook'//{id}"
    d.site = type(d.site).build(replace(d.site.config, runbook_url=url), d.site.catalog)
    javascript_runbook = tmp / "javascript-runbook.html"
    javascript_runbook.write_text(render(d, "html"))
    pages = Hostile(
        visit(browser, site_runbook),
        visit(browser, javascript_runbook),
        sum(len(m.playbook.evidence) for m in d.findings),
    )
    yield pages
    for seen in (pages.site_runbook, pages.javascript_runbook):
        seen.page.context.close()


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The retrieval launch's page as it is, nothing hostile in it."""
    d = diagnoser.diagnose(Replay(ANSWERS / "retrieval-launch.json.gz"), since="1h", until=END)
    path = tmp_path_factory.mktemp("plain-html") / "retrieval-launch.html"
    path.write_text(render(d, "html"))
    return path


# --- what every page must do ------------------------------------------------------------------


def assert_inert(seen: Visit) -> None:
    """Nothing ran, nothing was fetched, nothing navigated, and the page is built of the
    report's own elements only."""
    assert seen.page.url == seen.url  # a refresh or a base would have navigated
    assert seen.js("window.__pwned") is None, seen.js("window.__pwned")
    assert seen.dialogs == [], seen.dialogs
    assert seen.console == [], seen.console
    assert seen.errors == [], seen.errors
    assert seen.asked == [seen.url], seen.asked  # nothing else was even asked for
    assert seen.js("window.__refused") == []  # not even refused: nothing asked
    tags = set(seen.js("[...document.querySelectorAll('*')].map(e => e.localName)"))
    assert tags <= ELEMENTS, tags - ELEMENTS
    handlers = seen.js(
        "[...document.querySelectorAll('*')].flatMap(e => [...e.attributes]"
        ".filter(a => a.name.startsWith('on')).map(a => e.localName + ' ' + a.name))"
    )
    assert handlers == []
    assert seen.js("document.querySelectorAll('style, head > meta').length") == 3
    hrefs = seen.js("[...document.querySelectorAll('a')].map(a => a.href)")
    assert all(h.startswith(("https://", "http://")) for h in hrefs), hrefs


def assert_plots_drawn(seen: Visit, count: int) -> None:
    """Each evidence plot is an SVG with a box on the screen and a line of points in it."""
    plots = seen.js(
        """[...document.querySelectorAll('figure > svg')].map(svg => {
          const box = svg.getBoundingClientRect();
          const line = svg.querySelector('polyline');
          const lineBox = line ? line.getBoundingClientRect() : {width: 0, height: 0};
          return {w: box.width, h: box.height, points: line ? line.points.numberOfItems : 0,
                  lineW: lineBox.width, lineH: lineBox.height};
        })"""
    )
    assert len(plots) == count, plots
    for p in plots:
        assert p["w"] > 0 and p["h"] > 0, p
        assert p["points"] > 10 and p["lineW"] > 0 and p["lineH"] > 0, p


def colours(browser, png: bytes) -> dict[str, int]:
    """How many pixels of each colour (``#rrggbb``) a PNG holds, decoded by the browser in a
    blank page of its own (nothing is loaded: the bytes are handed over)."""
    context = browser.new_context()
    counts = context.new_page().evaluate(
        """async b64 => {
          const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
          const image = await createImageBitmap(new Blob([bytes], {type: 'image/png'}));
          const canvas = new OffscreenCanvas(image.width, image.height);
          const g = canvas.getContext('2d');
          g.drawImage(image, 0, 0);
          const px = new Uint32Array(g.getImageData(0, 0, image.width, image.height).data.buffer);
          const seen = new Map();
          for (const p of px) seen.set(p, (seen.get(p) || 0) + 1);
          const counts = {};
          for (const [p, n] of seen) {  // little-endian: 0xAABBGGRR
            const rgb = [p & 255, (p >> 8) & 255, (p >> 16) & 255];
            counts['#' + rgb.map(v => v.toString(16).padStart(2, '0')).join('')] = n;
          }
          return counts;
        }""",
        base64.b64encode(png).decode(),
    )
    context.close()
    return counts


# --- the tests --------------------------------------------------------------------------------


def test_no_payload_runs_or_fetches_and_each_shows_as_its_words(hostile):
    for seen in (hostile.site_runbook, hostile.javascript_runbook):
        assert_inert(seen)
        shown = seen.js("document.body.innerText")
        for payload in PAYLOADS:  # it reached the page, as text
            assert payload in shown, payload


def test_a_runbook_url_is_a_link_only_over_http_and_its_markup_stays_in_its_address(hostile):
    seen = hostile.javascript_runbook
    assert seen.js("document.querySelectorAll('a').length") == 0
    shown = seen.js("document.body.innerText")
    assert "Runbook: javascript:window.__pwned='runbook'//site-prompt-shift" in shown
    seen = hostile.site_runbook
    hrefs = seen.js("[...document.querySelectorAll('a')].map(a => a.getAttribute('href'))")
    url = (
        f'https://rb.example/site-prompt-shift?q="><script>window.__pwned=1</script>&r={BEACON}/rb'
    )
    assert url in hrefs, hrefs


def test_a_right_to_left_override_or_a_long_word_cannot_rearrange_the_page(hostile):
    """A label value or a site's words cannot draw the report's own text backwards (the
    override is shown as its escape) nor push the page wider than the window."""
    seen = hostile.site_runbook
    shown = seen.js("document.body.innerText")
    assert RLO not in shown
    for word in ("gnp.exe", "txt.exe", "fdp.exe"):
        assert f"\\u202e{word}" in shown, word
    width = seen.js("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    # The model's state beside it keeps most of the row (not a letter a line).
    state = seen.js(
        "[...document.querySelectorAll('td.v-unhealthy')].map(td =>"
        " td.getBoundingClientRect().width / td.closest('table').getBoundingClientRect().width)"
    )
    assert state and min(state) > 0.5, state


def test_the_evidence_plots_are_drawn_and_the_page_is_not_blank(browser, hostile, plain, tmp_path):
    assert_plots_drawn(hostile.site_runbook, hostile.plots)
    assert_plots_drawn(hostile.javascript_runbook, hostile.plots)
    seen = visit(browser, plain)
    assert_inert(seen)
    assert_plots_drawn(seen, 6)  # prompt-length-shift's evidence
    shot = tmp_path / "report.png"
    seen.page.locator(".plots").first.screenshot(path=str(shot))
    counts = colours(browser, shot.read_bytes())
    assert len(counts) > 8, counts  # the page, the window's shade, the lines, the words
    assert max(counts.values()) < 0.95 * sum(counts.values()), counts  # not one colour
    assert counts.get("#2c6fbb", 0) > 500, counts  # the series' stroke, six plots of it
    seen.page.context.close()


def test_the_content_security_policy_holds_on_its_own(browser, plain):
    """The page declares a policy that allows no script, no fetch and no outside resource,
    and the browser enforces it: an inline script, an image, a stylesheet's URL and a fetch
    put into the page after it loaded are refused before any request is made."""
    seen = visit(browser, plain)
    policy = seen.js(
        "(() => { const m = document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]');"
        " return m && {content: m.content, index: [...document.head.children].indexOf(m)}; })()"
    )
    assert policy is not None, "the page has no Content-Security-Policy meta"
    assert policy["index"] == 1, policy  # right after the charset, before any value
    directives = dict(
        (d.split()[0], d.split()[1:]) for d in policy["content"].split(";") if d.strip()
    )
    assert directives["default-src"] == ["'none'"], directives
    assert "script-src" not in directives and "connect-src" not in directives, directives
    assert directives["base-uri"] == ["'none'"] and directives["form-action"] == ["'none'"]
    seen.js(
        f"""(() => {{
          const s = document.createElement('script');
          s.textContent = "window.__pwned = 'inline script'";
          document.body.append(s);
          const img = document.createElement('img');
          img.src = '{BEACON}/img.png';
          document.body.append(img);
          const style = document.createElement('style');
          style.textContent = "body {{ background: url({BEACON}/bg.png) }}";
          document.head.append(style);
          const div = document.createElement('div');
          div.setAttribute('style', 'background: url({BEACON}/attr.png)');
          document.body.append(div);
          fetch('{BEACON}/fetch').catch(() => {{}});
        }})()"""
    )
    settle(seen.page)
    assert seen.js("window.__pwned") is None
    assert seen.left() == [], seen.left()
    # What the browser asked for at all (an image does, a script or a fetch does not) it
    # refused itself, for the policy.
    assert [r.rsplit(" ", 1)[1] for r in seen.refused] == ["csp"] * (len(seen.asked) - 1)
    refused = seen.js("window.__refused")
    for directive in ("script-src-elem", "img-src", "style-src-elem", "style-src-attr"):
        assert any(r.startswith(directive) for r in refused), (directive, refused)
    assert any(r.startswith("connect-src") for r in refused), refused
    # The page's own style holds: a finding is framed, as its stylesheet says.
    assert seen.js("getComputedStyle(document.querySelector('.finding')).borderTopStyle") == "solid"
    seen.page.context.close()
