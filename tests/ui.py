"""Drives the live downloads page in Debian's chromium for tests/ui.rs, and prints what it saw.

Playwright for Python launches the system chromium by path, so none of Playwright's own browser
builds is needed. The one argument is JSON: the page's URL, the admin token to type in, the id
of the download to watch, the ids of one with a hostile id and of one with a gap, a file to create
once the page shows downloads (tests/ui.rs starts the watched one then), where to save a
screenshot and chromium's path. Prints one JSON object; tests/ui.rs makes the assertions. A wait
that runs out fails with the page's last state on stderr.
"""

import json
import sys

from playwright.sync_api import sync_playwright

# Long enough on a loaded 2-core machine; tests/ui.rs kills the whole run past its own limit.
WAIT_MS = 45_000

# The row of download `id` as the user sees it, or null while there is none.
READ_ROW = """(id) => {
    const row = [...document.querySelectorAll("#downloads tbody tr")]
        .find((r) => r.dataset.id === id);
    if (!row) return null;
    const text = (name) => row.querySelector(`td.${name}`).textContent;
    const bar = row.querySelector("td.progress progress");
    return {
        id: text("id"), route: text("route"), object: text("object"), client: text("client"),
        delivered: bar.value, size: bar.max, progress: text("progress"),
        segments: row.querySelectorAll("td.ranges .strip span").length,
        rate: text("rate"), state: text("state"), started: text("started"),
        updated: text("updated"), digest: text("digest"),
    };
}"""


def main():
    args = json.loads(sys.argv[1])
    with sync_playwright() as playwright:
        # Chromium refuses to sandbox as root.
        browser = playwright.chromium.launch(
            executable_path=args["chromium"], args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1700, "height": 700})
        console = []
        page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))

        def row_when(condition, *extra):
            """Waits until the watched download's row satisfies `condition` (JS, given the row
            and `extra`), and returns the row."""
            body = (
                f"([id, ...extra]) => {{ const row = ({READ_ROW})(id);"
                f" return row && ({condition}) ? row : null; }}"
            )
            try:
                handle = page.wait_for_function(body, arg=[args["watch"], *extra], timeout=WAIT_MS)
            except Exception:
                status = page.text_content("#status")
                last = page.evaluate(READ_ROW, args["watch"])
                sys.stderr.write(f"waited for {condition}; status {status!r}; row {last}\n")
                sys.stderr.write("\n".join(console) + "\n")
                raise
            return handle.json_value()

        page.goto(args["page"])
        page.wait_for_selector("#token-form:not([hidden])", timeout=WAIT_MS)
        without_token = page.text_content("#status")
        page.fill("#token", args["token"])
        page.click("#token-form button[type=submit]")
        # The watched download starts only once the page is up: started earlier, on a loaded
        # machine, it could be over before the page first looked.
        page.wait_for_function(f"() => ({READ_ROW})({json.dumps(args['hostile'])}) !== null", timeout=WAIT_MS)
        with open(args["ready"], "w", encoding="utf-8"):
            pass

        first = row_when("row.state === 'active' && row.delivered > 0")
        second = row_when("row.delivered > extra[0]", first["delivered"])
        page.screenshot(path=args["screenshot"], full_page=True)
        final = row_when("row.state === 'complete' && row.digest.startsWith('repr-digest')")

        hostile = page.evaluate(READ_ROW, args["hostile"])
        gappy = page.evaluate(READ_ROW, args["gappy"])
        injected = page.evaluate("document.querySelectorAll('#downloads img, #downloads b').length")
        print(
            json.dumps(
                {
                    "without_token": without_token,
                    "first": first,
                    "second": second,
                    "final": final,
                    "hostile": hostile,
                    "gappy": gappy,
                    "injected_elements": injected,
                    "token_form_hidden": page.is_hidden("#token-form"),
                    "title": page.title(),
                    "token_in_storage": page.evaluate("Object.values(sessionStorage)"),
                    "url": page.url,
                    "console": console,
                    "browser": browser.version,
                }
            )
        )
        browser.close()


if __name__ == "__main__":
    main()
