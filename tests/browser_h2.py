"""Downloads over HTTPS in Debian's chromium for tests/edge_tls.rs, and prints what it saw.

The one argument is JSON: the page's URL (served by rangeway over TLS), the object's path on the
same origin, and chromium's path. The page is opened, the object fetched whole and as a range by
the page's own script, then downloaded by clicking the page's link. Prints one JSON object: the
protocol of every request in the page's network log (Resource Timing's nextHopProtocol), the
statuses, the fetched bytes' SHA-256 and the downloaded file's. tests/edge_tls.rs makes the
assertions.
"""

import hashlib
import json
import sys

from playwright.sync_api import sync_playwright

FETCH = """async (path) => {
    const hex = (bytes) => [...new Uint8Array(bytes)]
        .map((b) => b.toString(16).padStart(2, "0")).join("");
    const whole = await fetch(path, { cache: "no-store" });
    const body = await whole.arrayBuffer();
    const ranged = await fetch(path, { cache: "no-store", headers: { Range: "bytes=100-199" } });
    const part = await ranged.arrayBuffer();
    return {
        status: whole.status,
        sha256: hex(await crypto.subtle.digest("SHA-256", body)),
        range_status: ranged.status,
        range_hex: hex(part),
        navigation: performance.getEntriesByType("navigation")[0].nextHopProtocol,
        resources: performance.getEntriesByType("resource").map((e) => e.nextHopProtocol),
    };
}"""


def main():
    args = json.loads(sys.argv[1])
    with sync_playwright() as playwright:
        # Chromium refuses to sandbox as root. The test CA is not in chromium's store: the
        # certificate is checked by the test's other clients; this run is about the protocol.
        browser = playwright.chromium.launch(
            executable_path=args["chromium"], args=["--no-sandbox"]
        )
        context = browser.new_context(ignore_https_errors=True, accept_downloads=True)
        page = context.new_page()
        page.goto(args["page"])
        seen = page.evaluate(FETCH, args["object"])
        with page.expect_download() as started:
            page.click("a#download")
        download = started.value
        failure = download.failure()
        with open(download.path(), "rb") as saved:
            seen["download_sha256"] = hashlib.sha256(saved.read()).hexdigest()
        seen["download_failure"] = failure
        browser.close()
    print(json.dumps(seen))


main()
